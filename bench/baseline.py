"""The classic baseline beside the adapter: TF-IDF (1-2 grams) + linear SVM on the same BBC split.

``TfidfVectorizer(ngram_range=(1, 2), **variant)`` + ``LinearSVC()``, the variant (scikit-learn
defaults, sublinear tf, English stop words, both: :data:`VARIANTS`) chosen the way the adapter's
settings are, without ``test.csv``:

* each variant is fitted on the training part of the train config's validation split
  (``adapters._data.split_rows``, the rows ``make train`` trains on) and scored on its validation
  rows; the best (first on ties) is kept;
* that variant is fitted on all of ``train.csv`` and scored once on ``test.csv``: accuracy,
  per-category accuracy, fit time and docs/s (vectorising included).

:func:`comparison` turns the ``baseline`` and ``adapter`` sections of one ``make bench`` run into
the baseline-vs-adapter table (with the adapter card's validation figures, calibration and
training wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

VARIANTS: tuple[dict[str, Any], ...] = ({}, {"sublinear_tf": True}, {"stop_words": "english"},
                                        {"sublinear_tf": True, "stop_words": "english"})
"""TfidfVectorizer options tried on the validation split (besides ``ngram_range=(1, 2)``)."""

TRAIN_CONFIG = os.environ.get("DOCPILOT_BENCH_TRAIN_CONFIG", "config/docpilot.json")
"""Train config whose data section and seed define the split (``DOCPILOT_BENCH_TRAIN_CONFIG``)."""


def _fit_score(train_texts: list[str], train_labels: list[str], texts: list[str], labels: list[str],
               categories: tuple[str, ...], variant: dict[str, Any]) -> dict[str, Any]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import LinearSVC

    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), **variant), LinearSVC())
    t0 = time.perf_counter()
    model.fit(train_texts, train_labels)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    predicted = list(model.predict(texts))
    predict_s = time.perf_counter() - t0
    right = [p == y for p, y in zip(predicted, labels, strict=True)]
    per_cat = {}
    for c in categories:
        mine = [ok for ok, y in zip(right, labels, strict=True) if y == c]
        per_cat[c] = round(sum(mine) / len(mine), 4) if mine else None
    return {"variant": variant, "train_rows": len(train_texts), "rows": len(texts), "accuracy": round(sum(right) / len(right), 4),
            "errors": len(right) - sum(right), "per_category": per_cat, "fit_s": round(fit_s, 2),
            "docs_per_s": round(len(texts) / max(predict_s, 1e-9), 1)}


def run(quick: bool = False) -> dict[str, Any]:
    """Fit and score the baseline (``quick`` changes nothing: it takes seconds).

    Returns:
        ``{"title", "figures", "markdown"}``; figures ``validation`` and ``test`` each hold
        ``train_rows, rows, accuracy, errors, per_category, fit_s, docs_per_s``.

    Raises:
        ImportError: scikit-learn is missing (``pip install -e '.[test]'``).
        InputError: unreadable training data.
    """
    import csv

    from adapters._config import TrainConfig
    from adapters._data import load_rows, split_rows
    from bench.common import bbc_dir
    from classify.config.sections import load_config

    cfg = load_config(TrainConfig, TRAIN_CONFIG)
    cats = cfg.classify.categories
    rows, _ = load_rows(cfg.data, cats)
    train, val = split_rows(rows, cfg.data, cfg.training.seed)
    tried = [_fit_score([r.text for r in train], [r.category for r in train], [r.text for r in val],
                        [r.category for r in val], cats, v) for v in VARIANTS]
    validation = max(tried, key=lambda f: f["accuracy"])  # max keeps the first of equals
    with (bbc_dir() / "test.csv").open(encoding="utf-8", newline="") as fh:
        test_rows = list(csv.DictReader(fh))
    test = _fit_score([r.text for r in rows], [r.category for r in rows], [r["text"] for r in test_rows],
                      [r["category"] for r in test_rows], cats, validation["variant"])
    chosen = ", ".join(f"{k}={v!r}" for k, v in validation["variant"].items())
    figures = {"model": f"TfidfVectorizer(ngram_range=(1, 2){', ' + chosen if chosen else ''}) + LinearSVC()",
               "split": {"train_config": TRAIN_CONFIG, "validation_rows": len(val), "seed": cfg.training.seed},
               "variants_on_validation": [{"variant": f["variant"], "accuracy": f["accuracy"]} for f in tried],
               "validation": validation, "test": test}
    md = "\n".join([
        f"{figures['model']} (scikit-learn defaults otherwise), 1 CPU thread. TF-IDF variant chosen on the "
        "validation split: " + "; ".join(f"{json.dumps(f['variant'])} {f['accuracy']:.1%}" for f in tried) + ".",
        "",
        "| fit on | scored on | accuracy | errors | fit s | docs/s |",
        "|---|---|---|---|---|---|",
        f"| train part of the split ({validation['train_rows']}) | validation split ({validation['rows']}) | "
        f"{validation['accuracy']:.1%} | {validation['errors']} | {validation['fit_s']} | {validation['docs_per_s']} |",
        f"| all of train.csv ({test['train_rows']}) | test.csv ({test['rows']}) | **{test['accuracy']:.1%}** | "
        f"{test['errors']} | {test['fit_s']} | {test['docs_per_s']} |",
        "",
        "Per category on test.csv: " + ", ".join(f"{c} {v:.1%}" for c, v in test["per_category"].items() if v is not None) + ".",
    ])
    return {"title": "Classic baseline: TF-IDF + linear SVM (BBC News)", "figures": figures, "markdown": md}


def comparison(sections: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Baseline vs adapter on ``test.csv`` from one bench run's sections (``None`` unless both ran and passed).

    The adapter's test figures come from the ``adapter`` section (LoRA path), else from ``adapter_merged``
    (the same adapter merged into the base weights, the path pilot and batch take by default).

    The adapter's validation accuracy, per-category validation figures, calibration and training
    wall time come from its registry card (written by ``make train``).
    """
    base, tuned = sections.get("baseline", {}).get("figures"), sections.get("adapter", {}).get("figures")
    merged = sections.get("adapter_merged", {}).get("figures")
    if (not tuned or "adapter_accuracy" not in tuned) and merged and "accuracy" in merged:
        # the merged path (pilot's and batch's default) when the LoRA-path module did not run
        tuned = {"adapter": f"{merged['adapter']} (merged)", "ref": merged["adapter"], "n_articles": merged["n_articles"],
                 "adapter_accuracy": merged["accuracy"], "adapter_per_category": merged["per_category_accuracy"],
                 "adapter_docs_per_s": merged["docs_per_s"]}
    if not base or not tuned or "adapter_accuracy" not in tuned:
        return None
    from adapters.registry import Registry

    card = Registry().resolve(tuned.get("ref", tuned["adapter"])).card
    metrics = card.get("metrics", {})
    engine = metrics.get("engine") or {}
    calib = card.get("calibration") or {}
    bt, bv = base["test"], base["validation"]
    n = tuned["n_articles"]
    errors = round((1 - tuned["adapter_accuracy"]) * n)
    cats = list(bt["per_category"])
    figures = {"test_rows": n, "baseline_test_accuracy": bt["accuracy"], "adapter_test_accuracy": tuned["adapter_accuracy"],
               "baseline_validation_accuracy": bv["accuracy"], "adapter_validation_accuracy": engine.get("accuracy"),
               "adapter_validation_rows": engine.get("rows"), "training_wall_s": metrics.get("wall_s"),
               "training_run_wall_s": metrics.get("run_wall_s"), "calibration": calib or None,
               "beats_baseline": tuned["adapter_accuracy"] >= bt["accuracy"]}
    vpc = engine.get("per_category") or {}
    lines = [
        f"| | baseline | adapter {tuned['adapter']} |", "|---|---|---|",
        f"| test.csv accuracy ({n} articles) | {bt['accuracy']:.1%} ({bt['errors']} errors) | "
        f"**{tuned['adapter_accuracy']:.1%}** ({errors} errors) |",
        *(f"| test {c} | {bt['per_category'][c]:.1%} | {tuned['adapter_per_category'].get(c, 0):.1%} |" for c in cats),
        f"| docs/s on test.csv | {bt['docs_per_s']} | {tuned['adapter_docs_per_s']} (vLLM, this CPU) |",
        f"| fit / training wall time | {bt['fit_s']} s | {metrics.get('wall_s')} s training loop, "
        f"{metrics.get('run_wall_s', 'n/a')} s whole `make train` run incl. checks |",
        f"| validation split accuracy | {bv['accuracy']:.1%} (n={bv['rows']}) | "
        + (f"{engine['accuracy']:.1%} (n={engine.get('rows')}, end-of-run vLLM check)" if engine.get("accuracy") is not None else "n/a")
        + " |",
        *(f"| validation {c} | | {v['right']}/{v['rows']} |" for c, v in vpc.items()),
    ]
    if calib:
        nll = (f"NLL {calib['nll_before']:.3f} -> {calib['nll_after']:.3f} (fitted to), "
               if calib.get("nll_before") is not None else "")
        lines.append(f"| score calibration (validation) | | T = {calib['temperature']}, {nll}ECE {calib['ece_before']:.2%} -> "
                     f"{calib['ece_after']:.2%} ({calib['fitted_on']}) |")
    verdict = "beats or matches" if figures["beats_baseline"] else "does NOT reach"
    md = "\n".join([f"The adapter {verdict} the TF-IDF + LinearSVC baseline on test.csv.", "", *lines])
    return {"title": "Baseline vs adapter on test.csv (settings chosen on the validation split)", "figures": figures,
            "markdown": md}


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    out = run()
    print(json.dumps(out["figures"], indent=2))
    print(out["markdown"])
