"""Zero-shot accuracy of the base model on the 334 BBC test articles, and vLLM vs a plain transformers loop.

Both paths score the same prompt ids (``classify.engine.prompt.build_prompts``) the same way (arg-max over the
categories' first tokens) in the same compute dtype; throughput is compared on the same 64 articles in
the same run, and each path's achieved FLOP/s is set against the machine's measured matmul rate.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import accuracy, bbc_test, forward_gflop_per_token, matmul_gflops
from classify.config.sections import PilotConfig, load_config


def _transformers_loop(model_path: str, dtype: str, prompts: list[list[int]], first_tokens: list[int]) -> tuple[list[int], float]:
    """Plain Hugging Face loop: one forward pass per prompt (the engine's own prompt ids), arg-max over the category
    first tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    picks = []
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompts[0]]))  # warm-up
        started = time.perf_counter()
        for prompt in prompts:
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1, first_tokens]
            picks.append(int(torch.argmax(logits)))
        seconds = time.perf_counter() - started
    return picks, seconds


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark.

    Args:
        quick: 40 articles for accuracy and 16 for the throughput comparison (else 334 and 64).

    Returns:
        ``{"title", "figures", "markdown"}``.
    """
    from classify.engine.args import compute_dtype
    from classify.engine.build import build_engine
    from classify.model.model import resolve_model

    cfg = load_config(PilotConfig, "config/docpilot.json")
    docs, labels = bbc_test(40 if quick else None)
    n_cmp = 16 if quick else 64
    dtype = compute_dtype(cfg.model)
    model = resolve_model(cfg.model)
    t0 = time.perf_counter()
    engine = build_engine(cfg.model, cfg.engine, cfg.classify, model=model)
    start_s = time.perf_counter() - t0
    try:
        engine.classify(docs[:4])  # warm-up (first-request kernel set-up)
        started = time.perf_counter()
        results = engine.classify(docs)
        all_s = time.perf_counter() - started
        started = time.perf_counter()
        cmp_results = engine.classify(docs[:n_cmp])
        vllm_s = time.perf_counter() - started
        prompts = [p.ids for p in engine.scorer.prompts(docs[:n_cmp])]
        first_tokens = engine.scorer.first_tokens
    finally:
        engine.shutdown()
    hf_picks, hf_s = _transformers_loop(model.path, dtype, prompts, first_tokens)
    cats = cfg.classify.categories
    agree = sum(cats[p] == r.category for p, r in zip(hf_picks, cmp_results, strict=True)) / n_cmp
    cmp_tokens = sum(r.n_tokens for r in cmp_results)
    from transformers import AutoConfig

    hf_cfg = AutoConfig.from_pretrained(model.path)
    n_params = _param_count(hf_cfg)
    gflop_tok = forward_gflop_per_token(n_params)
    rate = {d: matmul_gflops(d) for d in ("float32", "bfloat16")}
    vllm_tps, hf_tps = cmp_tokens / vllm_s, cmp_tokens / hf_s
    figures = {
        "dtype": dtype,
        "engine_start_s": round(start_s, 1),
        "zero_shot_accuracy": round(accuracy(results, labels), 4),
        "n_articles": len(results),
        "all_articles_s": round(all_s, 2),
        "compare_articles": n_cmp,
        "compare_prompt_tokens": cmp_tokens,
        "vllm_docs_per_s": round(n_cmp / vllm_s, 2),
        "vllm_tokens_per_s": round(vllm_tps, 1),
        "transformers_docs_per_s": round(n_cmp / hf_s, 2),
        "transformers_tokens_per_s": round(hf_tps, 1),
        "speedup_vllm_over_transformers": round(hf_s / vllm_s, 2),
        "prediction_agreement": round(agree, 4),
        "model_params": n_params,
        "matmul_gflops_2048": {k: round(v, 1) for k, v in rate.items()},
        "vllm_achieved_gflops": round(vllm_tps * gflop_tok, 1),
        "transformers_achieved_gflops": round(hf_tps * gflop_tok, 1),
        "vllm_share_of_matmul_rate": round(vllm_tps * gflop_tok / rate[dtype], 3),
        "transformers_share_of_matmul_rate": round(hf_tps * gflop_tok / rate[dtype], 3),
    }
    md = "\n".join([
        f"Zero-shot accuracy of the base model on {len(results)} BBC test articles: **{figures['zero_shot_accuracy']:.1%}** "
        f"(vLLM, {dtype}, first-token scoring).",
        "",
        f"Throughput on the same {n_cmp} articles ({cmp_tokens} prompt tokens), same prompts, same dtype:",
        "",
        "| path | docs/s | tokens/s | achieved GFLOP/s (2N per token) | share of measured matmul rate |",
        "|---|---|---|---|---|",
        f"| vLLM offline (docpilot) | {figures['vllm_docs_per_s']} | {figures['vllm_tokens_per_s']} | "
        f"{figures['vllm_achieved_gflops']} | {figures['vllm_share_of_matmul_rate']:.1%} |",
        f"| plain transformers loop | {figures['transformers_docs_per_s']} | {figures['transformers_tokens_per_s']} | "
        f"{figures['transformers_achieved_gflops']} | {figures['transformers_share_of_matmul_rate']:.1%} |",
        "",
        f"vLLM / transformers: **{figures['speedup_vllm_over_transformers']}x**; the two paths pick the same category "
        f"for {agree:.0%} of the articles. Machine matmul rate (2048x2048): float32 "
        f"{figures['matmul_gflops_2048']['float32']} GFLOP/s, bfloat16 {figures['matmul_gflops_2048']['bfloat16']} GFLOP/s.",
    ])
    return {"title": "Zero-shot base model: vLLM vs plain transformers", "figures": figures, "markdown": md}


def _param_count(hf_cfg: Any) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings counted once when tied)."""
    h, i, n_layers = hf_cfg.hidden_size, hf_cfg.intermediate_size, hf_cfg.num_hidden_layers
    kv = hf_cfg.num_key_value_heads * (h // hf_cfg.num_attention_heads)
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * i + 2 * h
    emb = hf_cfg.vocab_size * h * (1 if hf_cfg.tie_word_embeddings else 2)
    return n_layers * per_layer + emb + h


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    out = run(parser.parse_args().quick)
    print(json.dumps(out["figures"], indent=2))
    print(out["markdown"])
