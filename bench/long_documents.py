"""Long documents (issue 41): ``classify.long_documents`` ``windows`` vs ``cut`` with the trained adapter, merged.

One vLLM engine runs the registry adapter merged into the base weights (the shipped ``model.adapter_mode: merged``
fast path, as ``bench/adapter_merged.py``); two :class:`classify.engine.scoring.Scorer` objects over it build the
prompts of each mode, so the two modes differ only in what they read. In order:

1. the validation split carved from train.csv (``adapters.train.data.split_rows`` with the train config's seed: the
   rows ``make train`` held out) in both modes: the figures the shipped default is chosen on;
2. test.csv (334 articles), scored once per mode: accuracy, accuracy at 95% coverage (the 95% highest-scored
   documents), per category, docs/s and prompt tokens/s, each mode timed alone on the warm engine;
3. beside them ``make plan``'s estimate for ``windows``: prompts per document from the pilot set
   (``data/pilot``, what a pilot measures) and the bound (``max_windows``), and the docs/s that predicts from
   the measured ``cut`` docs/s; and the TF-IDF + LinearSVC baseline (:mod:`bench.baseline`) fitted in the same run.

The config is ``DOCPILOT_BENCH_TRAIN_CONFIG`` (default ``config/docpilot.json``) with ``long_documents`` set per
mode; the adapter ``DOCPILOT_BENCH_ADAPTER`` (default ``bbc-news@latest``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from bench.common import accuracy, bbc_test, merged_registry_adapter, per_category_accuracy

MODES = ("cut", "windows")
COVERAGE = 0.95


def accuracy_at_coverage(results: list[Any], labels: dict[str, str], coverage: float = COVERAGE) -> float | None:
    """Accuracy of the ``ceil(coverage x n)`` highest-scored accepted documents (ties in input order), 0-1."""
    from bench.coverage import coverage_accuracy

    scored = [r for r in results if r.score is not None]
    if not scored:
        return None
    _, acc, _ = coverage_accuracy([r.score for r in scored], [r.category == labels[r.id] for r in scored])
    return round(float(acc[max(1, math.ceil(coverage * len(scored))) - 1]), 4)


def _mode_figures(engine: Any, docs: list[Any], labels: dict[str, str], categories: tuple[str, ...],
                  temperature: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    results = engine.classify(docs, temperature=temperature)
    seconds = time.perf_counter() - t0
    return {"rows": len(results), "accuracy": round(accuracy(results, labels), 4),
            "errors": sum(r.category != labels[r.id] for r in results),
            "accuracy_at_95_coverage": accuracy_at_coverage(results, labels),
            "per_category": per_category_accuracy(results, labels, categories),
            "truncated": sum(r.truncated for r in results), "windows": sum(r.n_windows for r in results),
            "windows_per_doc": round(sum(r.n_windows for r in results) / len(results), 3),
            "docs_per_s": round(len(results) / seconds, 3), "tokens_per_s": round(sum(r.n_tokens for r in results) / seconds, 1),
            "seconds": round(seconds, 1)}


def _validation_docs(cfg: Any) -> tuple[list[Any], dict[str, str]]:
    from adapters.train.data import load_rows, split_rows
    from classify.documents.read import document_from_text

    rows, _ = load_rows(cfg.data, cfg.classify.categories)
    _, val = split_rows(rows, cfg.data, cfg.training.seed)
    return [document_from_text(r.id, r.text, cfg.classify.max_doc_bytes) for r in val], {r.id: r.category for r in val}


def _plan_estimate(scorer: Any, cut_docs_per_s: float) -> dict[str, Any]:
    """``make plan``'s prompts per document for ``windows``: from the pilot set (what a pilot measures) and the bound."""
    from batch.pilot.inputs import read_pilot_set
    from batch.plan.plan import prompts_plan

    docs, _, _, _ = read_pilot_set(Path("data/pilot"), scorer.cfg, 12)
    prompts = [p for p in scorer.prompts(docs) if hasattr(p, "n_windows")]
    pilot_windows = round(sum(p.n_windows for p in prompts) / len(prompts), 3)
    bound = prompts_plan(scorer.cfg, 1)["prompts_per_doc"]
    return {"pilot_set_windows_per_doc": pilot_windows, "bound_windows_per_doc": bound,
            "docs_per_s_from_pilot_set": round(cut_docs_per_s / pilot_windows, 3),
            "docs_per_s_from_bound": round(cut_docs_per_s / bound, 3)}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure both modes (``quick``: 40 validation rows and 40 test articles).

    Returns:
        ``{"title", "figures", "markdown"}``; figures ``validation`` and ``test`` map each mode to
        :func:`_mode_figures`' dict, plus ``plan`` and ``baseline``.

    Raises:
        AdapterNotFound: no such adapter in the registry (train one with ``make train``).
    """
    from bench import baseline
    from classify.config.sections import load_config
    from classify.config.training import TrainConfig
    from classify.engine.build import Classifier, build_engine
    from classify.engine.scoring import Scorer

    cfg = load_config(TrainConfig, baseline.TRAIN_CONFIG)
    adapter, merged = merged_registry_adapter(cfg.model)
    val_docs, val_labels = _validation_docs(cfg)
    test_docs, test_labels = bbc_test(40 if quick else None)
    val_docs = val_docs[:40] if quick else val_docs
    t = adapter.card.get("calibration", {}).get("temperature", 1.0) if adapter.card.get("calibration") else 1.0
    engine = build_engine(merged, cfg.engine, cfg.classify)
    figures: dict[str, Any] = {"adapter": adapter.ref, "trained_long_documents": (adapter.card.get("classify") or {}).get(
        "long_documents", "cut"), "temperature": t, "validation": {}, "test": {}}
    try:
        tok = engine.llm.get_tokenizer()
        engines = {m: Classifier(engine.llm, Scorer(tok, cfg.classify.model_copy(update={"long_documents": m}),
                                                    cfg.model.max_model_len), engine.model, False) for m in MODES}
        engine.classify(test_docs[:2])  # warm-up
        for m in MODES:
            figures["validation"][m] = _mode_figures(engines[m], val_docs, val_labels, cfg.classify.categories, t)
        for m in MODES:
            figures["test"][m] = _mode_figures(engines[m], test_docs, test_labels, cfg.classify.categories, t)
        figures["plan"] = _plan_estimate(engines["windows"].scorer, figures["test"]["cut"]["docs_per_s"])
    finally:
        engine.shutdown()
    figures["baseline"] = baseline.run()["figures"]
    return {"title": "Long documents: windows vs cut (adapter merged) beside the TF-IDF baseline", "figures": figures,
            "markdown": _markdown(figures, cfg.classify)}


def _markdown(f: dict[str, Any], classify: Any) -> str:
    v, t, p, b = f["validation"], f["test"], f["plan"], f["baseline"]
    rows = [f"Adapter `{f['adapter']}` (trained with `long_documents: {f['trained_long_documents']}`, merged, calibration "
            f"T = {f['temperature']}), `max_doc_tokens` {classify.max_doc_tokens}, `max_windows` {classify.max_windows}.", "",
            "| split | mode | accuracy | errors | acc. at 95% coverage | docs cut | windows/doc | docs/s | tokens/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for split, figs in (("validation (train.csv split)", v), ("test.csv", t)):
        for m in MODES:
            x = figs[m]
            rows.append(f"| {split} ({x['rows']}) | {m} | {x['accuracy']:.1%} | {x['errors']} | "
                        f"{x['accuracy_at_95_coverage']:.1%} | {x['truncated']} | {x['windows_per_doc']} | {x['docs_per_s']} | "
                        f"{x['tokens_per_s']} |")
    bt = b["test"]
    rows.append(f"| test.csv ({bt['rows']}) | TF-IDF + LinearSVC | {bt['accuracy']:.1%} | {bt['errors']} | - | - | - | "
                f"{bt['docs_per_s']} | - |")
    rows += ["", "Per category on test.csv:", "", "| category | cut | windows | TF-IDF |", "|---|---|---|---|"]
    rows += [f"| {c} | {t['cut']['per_category'][c]:.1%} | {t['windows']['per_category'][c]:.1%} | {bt['per_category'][c]:.1%} |"
             for c in classify.categories]
    rows += ["", f"Plan's estimate for windows: {p['pilot_set_windows_per_doc']} prompts per document on the pilot set "
             f"(data/pilot; bound {p['bound_windows_per_doc']:g} = max_windows) -> {p['docs_per_s_from_pilot_set']} docs/s "
             f"from the measured cut docs/s ({p['docs_per_s_from_bound']} at the bound); measured: "
             f"{t['windows']['docs_per_s']} docs/s at {t['windows']['windows_per_doc']} windows per test document."]
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    result = run(parser.parse_args().quick)
    print(json.dumps(result["figures"], indent=2, default=str))
    print(result["markdown"])
