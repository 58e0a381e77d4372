"""The single-adapter fast path: one adapter merged into the base weights vs vLLM's LoRA path, in the Ray batch.

The same corpus (the BBC test articles) runs three times through ``docpilot batch`` (local Ray, 2 engine
actors on their own cores, ``batch.cpu_bind: split``) with the same adapter: once with
``model.adapter_mode: "lora"`` (vLLM LoRA slots), twice ``"merged"`` (the adapter merged once with
peft and cached, :mod:`adapters.registry.merged_cache`; the engines load it as a plain model): eager, as
``engine.enforce_eager: "auto"`` gives a corpus this small, and compiled (``enforce_eager: false``),
as ``"auto"`` gives a batch of ``COMPILE_MIN_DOCS_PER_ENGINE`` or more documents per engine. The
goals are judged on the compiled merged row. Figures:

* agreement: share of ids with the same category on both paths;
* docs/s per path: end to end over the pool (engine start included) and steady (from the moment
  every actor has returned a shard to the last shard, :func:`bench.common.steady_rate`), and the
  merged / LoRA ratios;
* the machine's matrix-product ceiling measured in the same run, laid out as the actors compute
  (``bench.common.matmul_gflops_groups``: one product per actor's cores, all at once, summed; one
  process with torch's threads, ``bench.common.matmul_gflops``, is given beside it), before and after
  the batches, best of the two, turned into a docs/s ceiling: ``2 N`` FLOPs per
  prompt token (Kaplan et al. 2020, sec. 2.1; ``N`` = non-embedding parameters, counted from the
  weights) times the mean prompt tokens per article; the steady merged docs/s as a share of it.
  The ceiling is taken in the engine's compute dtype (``float32`` on AVX2-only CPUs, ``bfloat16``
  where the CPU has AVX-512-BF16 or AMX, where a bf16 product runs about twice the fp32 rate) and
  the goal is judged against that one; the fp32 ceiling is given beside it.

The adapter is ``DOCPILOT_BENCH_ADAPTER`` (default ``bbc-news@latest``) from the registry; when the
registry has none, a random tiny LoRA (r=8 on q_proj/v_proj, B scaled by 0.3) is published to a
temporary registry and the results say so (agreement and speed then hold, accuracy means nothing).

Run alone: ``python -m bench.merged_mode [--quick]`` (``--quick``: the first 24 articles, 4-document shards).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.batch import _corpus
from bench.common import forward_gflop_per_token, matmul_gflops, matmul_gflops_groups, steady_rate
from classify.config.engine import COMPILE_MIN_DOCS_PER_ENGINE

ROOT = Path(__file__).resolve().parent.parent
ACTORS = 2


def actor_core_groups() -> list[list[int]] | None:
    """The cores of each engine actor as the batch binds them here (``batch.cpu_bind: split``,
    :func:`batch.pool.placement.cpu_core_groups`), or ``None`` when the machine has fewer cores than actors."""
    from batch.pool.placement import cpu_core_groups

    groups = cpu_core_groups(ACTORS, list(os.sched_getaffinity(0)))
    return [[int(c) for c in g.split(",")] for g in groups] if groups else None


def _torch_threads() -> int:
    """The threads :func:`bench.common.matmul_gflops` runs on (torch's default here, not ``os.cpu_count()``)."""
    import torch

    return torch.get_num_threads()


def _ceiling(dtype: str, groups: list[list[int]] | None) -> float:
    """The matrix-product ceiling of the actors: one product per actor's cores at once
    (:func:`bench.common.matmul_gflops_groups`), else one process with torch's threads."""
    return matmul_gflops_groups(dtype, groups) if groups else matmul_gflops(dtype)


def _adapter(tmp: Path) -> tuple[str, str]:
    """The adapter to compare: the registry's, or a random tiny LoRA in a temporary registry.

    Returns:
        ``(ref, note)``; ``note`` is empty for a registry adapter.
    """
    from adapters.registry.registry import Registry
    from classify.config.sections import ModelConfig
    from classify.errors import AdapterError
    from classify.model.model import resolve_model

    ref = os.environ.get("DOCPILOT_BENCH_ADAPTER", "bbc-news@latest")
    model = resolve_model(ModelConfig())
    try:
        Registry().resolve(ref, base_fingerprint=model.fingerprint)
        return ref, ""
    except AdapterError:
        pass
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    os.environ["DOCPILOT_REGISTRY"] = str(tmp / "registry")
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32),
                                LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.3)
    peft_model.save_pretrained(tmp / "lora")
    card = {"base_model": {"name": model.name, "fingerprint": model.fingerprint}, "training": {"kind": "random-init bench"}}
    Registry().publish(tmp / "lora", "bench-random", 1, card)
    note = (f"no trained adapter ({ref}) in the registry: a RANDOM tiny LoRA (r=8, alpha=16, q_proj/v_proj, B x 0.3, "
            "seed 0) stands in; agreement and docs/s are meaningful, accuracy is not")
    return "bench-random@1", note


def _non_embedding_params(folder: str) -> int:
    """Parameters in the model's weight files, less the token embeddings and the (tied) output head."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), "pt") as fh:
            for name in fh.keys():
                if "embed_tokens" in name or "lm_head" in name:
                    continue
                n = 1
                for dim in fh.get_slice(name).get_shape():
                    n *= dim
                total += n
    return total


def _batch(corpus: Path, mode: str, adapter: str, out: Path, shard_docs: int, compiled: bool = False) -> dict[str, Any]:
    """One ``docpilot batch`` of ``corpus`` in adapter ``mode``; ``compiled`` sets ``engine.enforce_eager: false``
    (what ``"auto"`` gives a batch of :data:`classify.config.engine.COMPILE_MIN_DOCS_PER_ENGINE` or more documents
    per engine), else the shipped ``"auto"`` (eager for this corpus)."""
    from batch.run.driver import parse_args, run_batch

    os.environ["DOCPILOT_RUNS"] = str(out / "runs")
    os.environ["DOCPILOT_EXPORTS"] = str(out / "exports")
    config = json.loads((ROOT / "config" / "docpilot.json").read_text())
    config["model"]["adapter_mode"] = mode
    if compiled:
        config["engine"]["enforce_eager"] = False
    name = f"{mode}-compiled" if compiled else mode
    config["batch"].update(shard_docs=shard_docs, cpu_bind="split", shard_timeout_per_doc_s=60)
    config_path = out / f"batch-{name}.json"
    config_path.write_text(json.dumps(config))
    args = parse_args(["--config", str(config_path), "--corpus", str(corpus), "--batch-id", f"bench-{name}",
                       "--adapter", adapter, "--cpu-actors", str(ACTORS), "--skip-pilot-gate", "--no-progress"])
    t0 = time.monotonic()
    summary = run_batch(args)
    wall = time.monotonic() - t0
    t = summary["this_attempt"]
    rows = [json.loads(line) for line in (Path(summary["run_dir"]) / "results.jsonl").read_text().splitlines()]
    return {"mode": name, "enforce_eager": t.get("enforce_eager"), "compiled": t.get("compiled"), "docs": t["processed_docs"], "actors": t["actors"], "retries": t["retries"],
            "driver_wall_s": round(wall, 1), "pool_wall_s": t["pool_wall_s"],
            "first_shard_s": round(t["first_shard_s"] or 0, 1), "docs_per_s": t["docs_per_s"],
            **steady_rate(Path(summary["run_dir"]), t["actors"]),
            "merged_model": summary.get("merged_model"), "accepted": summary["accepted"],
            "categories": {r["id"]: r["category"] for r in rows},
            "prompt_tokens": sum(r.get("n_tokens") or 0 for r in rows)}


def run(quick: bool = False) -> dict[str, Any]:
    """Compare the merged fast path with the LoRA path on the same articles and adapter.

    Args:
        quick: the first 24 test articles in 4-document shards (else all 334 in 16-document shards).

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    from adapters.registry.merged_cache import merged_folder, merged_model
    from adapters.registry.registry import Registry
    from classify.config.sections import ModelConfig
    from classify.engine.args import compute_dtype
    from classify.model.model import resolve_model

    n, shard_docs = (24, 4) if quick else (None, 16)
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")  # a shared CPU can exceed vLLM's 300 s per step
    saved = {k: os.environ.get(k) for k in ("DOCPILOT_REGISTRY", "DOCPILOT_RUNS", "DOCPILOT_EXPORTS")}
    with tempfile.TemporaryDirectory(prefix="bench-merged-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            ref, note = _adapter(tmp)
            corpus = _corpus(tmp, n)
            dtype = compute_dtype(ModelConfig())
            groups = actor_core_groups()
            ceiling_before, one_process_before = _ceiling(dtype, groups), matmul_gflops(dtype)
            fp32_before = _ceiling("float32", groups) if dtype != "float32" else ceiling_before
            base = resolve_model(ModelConfig())
            resolved = Registry().resolve(ref, base_fingerprint=base.fingerprint)
            t0 = time.monotonic()
            cached = merged_folder(base, resolved.sha256, dtype).is_dir()
            merged_ref = merged_model(resolved, base, dtype)  # the merge timed here; the batch re-hashes and reuses it
            merge_s = time.monotonic() - t0
            lora = _batch(corpus, "lora", ref, tmp, shard_docs)
            merged_eager = _batch(corpus, "merged", ref, tmp, shard_docs)
            merged = _batch(corpus, "merged", ref, tmp, shard_docs, compiled=True)
            ceiling_after, one_process_after = _ceiling(dtype, groups), matmul_gflops(dtype)
            fp32_after = _ceiling("float32", groups) if dtype != "float32" else ceiling_after
            n_params = _non_embedding_params(merged_ref.path)
            if note:  # a random adapter's merge is of no later use: keep the shared model cache clean
                shutil.rmtree(merged_ref.path, ignore_errors=True)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    ids = sorted(lora["categories"].keys() & merged["categories"].keys())
    same = sum(lora["categories"][i] == merged["categories"][i] for i in ids)
    same_eager = sum(lora["categories"][i] == merged_eager["categories"].get(i) for i in ids)
    ceiling_gflops = max(ceiling_before, ceiling_after)
    tokens_per_doc = merged["prompt_tokens"] / max(merged["docs"], 1)
    gflop_per_doc = forward_gflop_per_token(n_params) * tokens_per_doc
    ceiling_docs_s = ceiling_gflops / gflop_per_doc
    fp32_docs_s = max(fp32_before, fp32_after) / gflop_per_doc

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else 0.0

    figures = {
        "adapter": ref, "adapter_sha256": resolved.sha256, "adapter_note": note, "articles": len(ids),
        "actors": ACTORS, "shard_docs": shard_docs, "merge_dtype": dtype, "merge_s": round(merge_s, 1), "merge_was_cached": cached,
        "merged_fingerprint": merged_ref.fingerprint,
        "same_category": same, "agreement": ratio(same, len(ids)),
        "same_category_eager": same_eager, "agreement_eager": ratio(same_eager, len(ids)),
        "lora": {k: v for k, v in lora.items() if k != "categories"},
        "merged_eager": {k: v for k, v in merged_eager.items() if k != "categories"},
        "merged": {k: v for k, v in merged.items() if k != "categories"},
        "speedup_steady_eager": ratio(merged_eager["docs_per_s_steady"], lora["docs_per_s_steady"]),
        "merged_eager_steady_share_of_ceiling": ratio(merged_eager["docs_per_s_steady"], ceiling_docs_s),
        "speedup_end_to_end": ratio(merged["docs_per_s"], lora["docs_per_s"]),
        "speedup_steady": ratio(merged["docs_per_s_steady"], lora["docs_per_s_steady"]),
        "ceiling_dtype": dtype,
        "ceiling_layout": {"actor_core_groups": groups, "method": "matmul_gflops_groups" if groups else "matmul_gflops"},
        "matmul_gflops": {"before": round(ceiling_before, 1), "after": round(ceiling_after, 1)},
        "one_process_matmul_gflops": {"before": round(one_process_before, 1), "after": round(one_process_after, 1)},
        "merged_steady_share_of_one_process_ceiling": ratio(
            merged["docs_per_s_steady"], max(one_process_before, one_process_after) / gflop_per_doc),
        "fp32_matmul_gflops": {"before": round(fp32_before, 1), "after": round(fp32_after, 1)},
        "merged_steady_share_of_fp32_ceiling": ratio(merged["docs_per_s_steady"], fp32_docs_s),
        "non_embedding_params": n_params, "prompt_tokens_per_doc": round(tokens_per_doc, 1),
        "ceiling_docs_per_s": round(ceiling_docs_s, 3),
        "merged_steady_share_of_ceiling": ratio(merged["docs_per_s_steady"], ceiling_docs_s),
        "lora_steady_share_of_ceiling": ratio(lora["docs_per_s_steady"], ceiling_docs_s),
    }
    goal_speed = figures["speedup_steady"] >= 2.5
    goal_ceiling = figures["merged_steady_share_of_ceiling"] >= 0.7
    goal_agree = figures["agreement"] >= 0.99
    md = "\n".join([
        *([f"**Adapter:** {note}.", ""] if note else [f"Adapter `{ref}` (sha256 {resolved.sha256[:16]}...).", ""]),
        f"`docpilot batch`, {ACTORS} actors on their own cores, {len(ids)} BBC test articles in {merged['shards']} "
        f"shards of {merged['mean_shard_docs']} articles on average (a corpus this small is cut into at least 32 "
        f"shards; `shard_docs` {shard_docs}), same adapter, all three in this one run (merge of the adapter, {dtype}: {merge_s:.1f} s, "
        f"{'found in the cache and re-hashed' if cached else 'cold'}; "
        "then re-hashed and reused by the batch). `lora` and `merged` run the shipped engine section as `auto` "
        "gives it to a corpus this small (eager); `merged-compiled` sets `engine.enforce_eager: false`, what `auto` "
        f"gives a batch of {COMPILE_MIN_DOCS_PER_ENGINE:,} or more documents per engine (torch.compile: a minute "
        "or two more engine start, faster steps; vLLM turns compilation off under LoRA, so the LoRA path has no "
        "compiled row). The goals are judged on `merged-compiled`, the path a corpus at scale runs:",
        "",
        "| path | enforce_eager | docs/s end to end (pool, engine start incl.) | docs/s steady | steady window s | first shard s | driver wall s | same category as lora |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {r['mode']} | {str(r['enforce_eager']).lower()} | {r['docs_per_s']} | {r['docs_per_s_steady']} | "
          f"{r['steady_window_s']} | {r['first_shard_s']} | {r['driver_wall_s']} | {agree} |"
          for r, agree in ((lora, "-"), (merged_eager, f"{same_eager}/{len(ids)}"), (merged, f"{same}/{len(ids)}"))],
        "",
        f"- same category as the LoRA path: **{same} of {len(ids)}** compiled ({figures['agreement']:.1%}; goal >= 99%: "
        f"{'met' if goal_agree else 'NOT met'}), {same_eager} of {len(ids)} eager",
        f"- merged / LoRA: **{figures['speedup_steady']}x** steady compiled, {figures['speedup_end_to_end']}x end to end "
        f"(goal >= 2.5x steady: {'met' if goal_speed else 'NOT met'}); eager {figures['speedup_steady_eager']}x steady",
        f"- {dtype} matmul ceiling in this run (the engine's compute dtype): {ceiling_gflops:.1f} GFLOP/s (2048^2 "
        f"products, before {ceiling_before:.1f} / after {ceiling_after:.1f}; "
        + (f"one process per actor, bound to the actor's cores {groups}, all at once, rates summed: the actors' layout"
           if groups else "one process, torch's threads: fewer cores than actors")
        + f"); {n_params / 1e6:.1f} M non-embedding "
        f"parameters x 2 FLOPs x {tokens_per_doc:.0f} prompt tokens per article = {gflop_per_doc:.2f} GFLOP per "
        f"article -> ceiling {ceiling_docs_s:.2f} docs/s; merged steady = "
        f"**{figures['merged_steady_share_of_ceiling']:.0%}** of it compiled (goal >= 70%: {'met' if goal_ceiling else 'NOT met'}), "
        f"{figures['merged_eager_steady_share_of_ceiling']:.0%} eager, LoRA steady = {figures['lora_steady_share_of_ceiling']:.0%}.",
        *([f"- one process with torch's {_torch_threads()} threads measured {max(one_process_before, one_process_after):.1f} "
           f"GFLOP/s (before {one_process_before:.1f} / after {one_process_after:.1f}); merged steady = "
           f"{figures['merged_steady_share_of_one_process_ceiling']:.0%} of that one (the measure of earlier runs, which "
           "can understate the cores side by side)."] if groups else []),
        *([f"- fp32 ceiling beside it: {max(fp32_before, fp32_after):.1f} GFLOP/s; merged steady = "
           f"{figures['merged_steady_share_of_fp32_ceiling']:.0%} of the fp32 docs/s ceiling (not the goal's measure "
           f"here: the engine runs {dtype})."] if dtype != "float32" else []),
        "- steady = documents of the shards completed from the moment every actor had returned one to the last one, "
        "less half a mean shard per actor, over that window (bench.common.steady_rate): engine starts and the pool's "
        "shut-down are left out; end to end keeps them. With --quick (24 articles) the window is short and noisy.",
    ])
    return {"title": "Single-adapter fast path: merged vs LoRA (Ray batch)", "figures": figures, "markdown": md}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 24 articles, 4-document shards")
    result = run(quick=parser.parse_args(sys.argv[1:]).quick)
    print(json.dumps(result["figures"], indent=2))
    print(result["markdown"])
