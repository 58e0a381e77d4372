"""Accuracy of base + LoRA adapter on the 334 BBC test articles through vLLM, with the adapter merged.

vLLM's CPU LoRA kernels re-read the adapter weights for every token of every wrapped layer, so
base + adapter through ``enable_lora`` runs far slower than the base model on a CPU (see
``bench/adapter.py``). The same adapter merged into the base weights (``W' = W + (alpha/r) B A``,
peft ``merge_and_unload``; ``adapters/registry/merge.py``) gives the same function at base-model speed.
This module merges the registry adapter once and classifies the test set through vLLM with it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import accuracy, bbc_test, merged_registry_adapter, per_category_accuracy, wrong_ids
from classify.config.sections import PilotConfig, load_config


def run(quick: bool = False) -> dict[str, Any]:
    """Merge ``DOCPILOT_BENCH_ADAPTER`` (default ``bbc-news@latest``) and classify the test set through vLLM.

    Args:
        quick: the first 40 test articles (else all 334).

    Returns:
        ``{"title", "figures", "markdown"}``.
    """
    from classify.engine.build import build_engine

    cfg = load_config(PilotConfig, "config/docpilot.json")
    adapter, merged_cfg = merged_registry_adapter(cfg.model)
    docs, labels = bbc_test(40 if quick else None)
    engine = build_engine(merged_cfg, cfg.engine, cfg.classify)
    try:
        engine.classify(docs[:2])
        t0 = time.perf_counter()
        results = engine.classify(docs)
        seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    per_cat = per_category_accuracy(results, labels, cfg.classify.categories)
    figures = {
        "adapter": adapter.ref,
        "adapter_sha256": adapter.sha256,
        "n_articles": len(results),
        "accuracy": round(accuracy(results, labels), 4),
        "per_category_accuracy": per_cat,
        "wrong_ids": wrong_ids(results, labels),
        "docs_per_s": round(len(results) / seconds, 2),
        "tokens_per_s": round(sum(r.n_tokens for r in results) / seconds, 1),
        "training": {k: adapter.card.get(k) for k in ("metrics", "training") if k in adapter.card},
    }
    md = "\n".join([
        f"Base + adapter `{adapter.ref}` (merged into the base weights, float32) through vLLM on "
        f"{len(results)} BBC test articles: **{figures['accuracy']:.1%}** accuracy, "
        f"{figures['docs_per_s']} docs/s, {figures['tokens_per_s']} tokens/s.",
        "",
        "| category | accuracy |",
        "|---|---|",
        *[f"| {k} | {v:.1%} |" for k, v in per_cat.items() if v is not None],
    ])
    return {"title": "Base + LoRA adapter (merged) through vLLM", "figures": figures, "markdown": md}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    result = run(parser.parse_args().quick)
    print(json.dumps(result["figures"], indent=2, default=str))
    print(result["markdown"])

