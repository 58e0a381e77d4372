"""Accuracy of base + LoRA adapter on the 334 BBC test articles through vLLM, next to the zero-shot base.

One LoRA-enabled engine classifies the same articles twice (base alone, then base + adapter), so
the two figures differ only by the adapter. The adapter comes from the registry
(``DOCPILOT_BENCH_ADAPTER``, default ``bbc-news@latest``) and is hash- and base-verified first;
its card supplies the training settings and throughput shown beside the accuracy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.common import accuracy, bbc_test, per_category_accuracy, wrong_ids
from classify.config.sections import PilotConfig, load_config

RESULTS_DIR = Path("bench/results")  # PNGs beside the results files of bench.run


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark.

    Args:
        quick: the first 40 test articles (else all 334).

    Returns:
        ``{"title", "figures", "markdown"}``.

    Raises:
        AdapterNotFound: no such adapter in the registry (train one with ``make train``).
    """
    from adapters.registry.registry import Registry
    from classify.engine.args import compute_dtype
    from classify.engine.build import build_engine
    from classify.model.model import resolve_model

    cfg = load_config(PilotConfig, "config/docpilot.json")
    ref = os.environ.get("DOCPILOT_BENCH_ADAPTER", "bbc-news@latest")
    model = resolve_model(cfg.model)
    adapter = Registry().resolve(ref, base_fingerprint=model.fingerprint)
    docs, labels = bbc_test(40 if quick else None)
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")  # a shared CPU can exceed vLLM's 300 s per step
    engine = build_engine(cfg.model, cfg.engine, cfg.classify, enable_lora=True, model=model)
    try:
        engine.classify(docs[:2])
        engine.classify(docs[:2], adapter=adapter.handle())  # warm-up: kernels and the LoRA load
        t0 = time.perf_counter()
        base = engine.classify(docs)
        base_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        tuned = engine.classify(docs, adapter=adapter.handle())
        tuned_s = time.perf_counter() - t0
        handle = adapter.handle()
        # the raw (T = 1) scores of the same answers, for ECE before calibration
        raw = tuned if handle.temperature == 1.0 else engine.classify(
            docs, adapter=dataclasses.replace(handle, temperature=1.0))
    finally:
        engine.shutdown()
    cats = cfg.classify.categories
    acc_base, acc_tuned = accuracy(base, labels), accuracy(tuned, labels)
    card = adapter.card
    metrics = card.get("metrics", {})
    tcfg = card.get("training", {}).get("config", {})
    tr, lora = tcfg.get("training", {}), tcfg.get("lora", {})
    figures = {
        "adapter": adapter.ref,
        "adapter_sha256": adapter.sha256,
        "dtype": compute_dtype(cfg.model),
        "n_articles": len(docs),
        "base_accuracy": round(acc_base, 4),
        "adapter_accuracy": round(acc_tuned, 4),
        "adapter_per_category": per_category_accuracy(tuned, labels, cats),
        "base_docs_per_s": round(len(docs) / base_s, 2),
        "adapter_docs_per_s": round(len(docs) / tuned_s, 2),
        "adapter_rejected": sum(r.status != "accepted" for r in tuned),
        "adapter_wrong_ids": wrong_ids(tuned, labels),
        "training": {
            "train_rows": card.get("training", {}).get("data", {}).get("train_rows"),
            "steps": metrics.get("steps"), "tokens": metrics.get("tokens"),
            "tokens_per_s_cpu": metrics.get("tokens_per_s_cpu"), "tokens_per_s_wall": metrics.get("tokens_per_s_wall"),
            "cpu_s": metrics.get("cpu_s"), "wall_s": metrics.get("wall_s"), "final_loss": metrics.get("final_loss"),
            "batch_size": tr.get("batch_size"), "grad_accum_steps": tr.get("grad_accum_steps"),
            "learning_rate": tr.get("learning_rate"), "dtype": tr.get("dtype"), "threads": tr.get("threads"),
            "lora_rank": lora.get("rank"), "lora_alpha": lora.get("alpha"), "lora_modules": lora.get("target_modules"),
            "lora_layers": lora.get("layers"), "max_doc_tokens": tcfg.get("classify", {}).get("max_doc_tokens"),
        },
    }
    figures["calibration"] = _calibration(tuned, raw, labels, handle.temperature, card, cfg.classify.review_below_score,
                                          quick)
    err_base, err_tuned = 1 - acc_base, 1 - acc_tuned
    t = figures["training"]
    md = "\n".join([
        f"Accuracy on {len(docs)} BBC test articles through vLLM ({figures['dtype']}, first-token scoring), one engine:",
        "",
        "| model | accuracy | docs/s |",
        "|---|---|---|",
        f"| base (zero-shot) | {acc_base:.1%} | {figures['base_docs_per_s']} |",
        f"| base + {adapter.ref} | **{acc_tuned:.1%}** | {figures['adapter_docs_per_s']} |",
        "",
        f"Error rate {err_base:.1%} -> {err_tuned:.1%}"
        + (f" ({err_base / err_tuned:.1f}x fewer errors)." if err_tuned > 0 else " (no errors)."),
        f"Per category with the adapter: {', '.join(f'{c} {v:.0%}' for c, v in figures['adapter_per_category'].items() if v is not None)}.",
        "",
        f"Training ({adapter.ref}): {t['train_rows']} training rows, {t['steps']} steps x batch {t['batch_size']}"
        f" x accum {t['grad_accum_steps']}, lr {t['learning_rate']}, LoRA r={t['lora_rank']} alpha={t['lora_alpha']} "
        f"on {t['lora_modules']} of layers {t['lora_layers'] or 'all'}, max_doc_tokens {t['max_doc_tokens']}, {t['dtype']}, "
        f"{t['threads']} thread(s): {t['tokens']} tokens in {t['cpu_s']} CPU-s / {t['wall_s']} wall-s = "
        f"{t['tokens_per_s_cpu']} tokens/s per CPU-second ({t['tokens_per_s_wall']} tokens/s wall, shared machine).",
        "",
        _calibration_md(figures["calibration"]),
    ])
    return {"title": "LoRA adapter vs zero-shot base (BBC News test set)", "figures": figures, "markdown": md}


def _calibration(tuned: list[Any], raw: list[Any], labels: dict[str, str], temperature: float, card: dict[str, Any],
                 review_below: float | None, quick: bool) -> dict[str, Any]:
    """ECE (15 bins) of the raw and calibrated scores on these articles, with reliability and coverage PNGs."""
    from adapters.train.calibration import expected_calibration_error, reliability_diagram
    from bench.coverage import at_threshold, coverage_accuracy_plot

    def scored(results: list[Any]) -> tuple[list[float], list[bool]]:
        rows = [r for r in results if r.status == "accepted"]
        return [r.score for r in rows], [r.category == labels[r.id] for r in rows]

    stem = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{platform.node() or 'host'}-adapter" + ("-quick" if quick else "")
    out = RESULTS_DIR
    (s_raw, ok_raw), (s_cal, ok_cal) = scored(raw), scored(tuned)
    figs = {
        "temperature": temperature,
        "fitted_on": (card.get("calibration") or {}).get("fitted_on"),
        "validation_ece_before": (card.get("calibration") or {}).get("ece_before"),
        "validation_ece_after": (card.get("calibration") or {}).get("ece_after"),
        "test_ece_before": round(expected_calibration_error(s_raw, ok_raw), 4),
        "test_ece_after": round(expected_calibration_error(s_cal, ok_cal), 4),
        "review_thresholds": [at_threshold(s_cal, ok_cal, t) for t in sorted({0.5, 0.7, 0.9, review_below or 0.9})],
    }
    figs["reliability_png_before"] = str(reliability_diagram(
        s_raw, ok_raw, out / f"{stem}-reliability-raw.png", f"Adapter scores on {len(s_raw)} test articles, raw (T = 1)"))
    figs["reliability_png_after"] = str(reliability_diagram(
        s_cal, ok_cal, out / f"{stem}-reliability-calibrated.png",
        f"Adapter scores on {len(s_cal)} test articles, calibrated (T = {temperature:.3g})"))
    figs["coverage_png"] = str(coverage_accuracy_plot(
        {f"calibrated (T = {temperature:.3g})": (s_cal, ok_cal), "raw (T = 1)": (s_raw, ok_raw)},
        out / f"{stem}-coverage-accuracy.png", f"Coverage vs accuracy, adapter on {len(s_cal)} BBC test articles",
        thresholds=(review_below or 0.9,)))
    return figs


def _calibration_md(c: dict[str, Any]) -> str:
    """Markdown lines for :func:`_calibration`'s figures."""
    lines = [
        f"Calibration: temperature T = {c['temperature']:.3g} from the card (fitted on {c['fitted_on'] or 'nothing: no card value'}); "
        f"ECE (15 bins) on these test articles {c['test_ece_before']:.2%} raw -> {c['test_ece_after']:.2%} calibrated"
        + (f" (validation split: {c['validation_ece_before']:.2%} -> {c['validation_ece_after']:.2%})."
           if c["validation_ece_before"] is not None else "."),
        f"Reliability diagrams: `{c['reliability_png_before']}`, `{c['reliability_png_after']}`; "
        f"coverage-accuracy curve: `{c['coverage_png']}`.",
        "",
        "| review below score | accepted (coverage) | accuracy accepted | to review | accuracy of those |",
        "|---|---|---|---|---|",
    ]
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    for t in c["review_thresholds"]:
        lines.append(f"| {t['threshold']:g} | {t['accepted']} ({t['coverage']:.1%}) | {fmt(t['accuracy_accepted'])} | "
                     f"{t['review']} | {fmt(t['accuracy_review'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 40 test articles")
    out = run(parser.parse_args().quick)
    print(json.dumps(out["figures"], indent=2))
    print(out["markdown"])
