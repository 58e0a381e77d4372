"""The host side of one engine actor: documents per second with everything but the forward pass, vs main's prompt path.

Measured in this process on this process's cores (the actor's cores: ``os.sched_getaffinity``), on the 1,891 BBC
articles (train + test) and on 5 KB documents (BBC articles repeated to 5,000 characters):

* ``host``: :class:`bench.instant_engine.HostEngineActor` ``classify`` on the JSONL shard bytes (1,000
  documents a shard): parse, prompt ids with the real tokenizer, sampling parameters, result records,
  shard bytes; only the model's forward pass is skipped;
* its parts: parse (``ShardInput.documents``), prompt ids (``Scorer.prompts``), records + bytes (the rest);
* ``old build_prompt``: main's ``classify.engine.prompt.build_prompt`` before token-id prompts (tokenize, cut,
  decode, render the template, tokenize again; reproduced here as :func:`old_build_prompt`), one thread, as
  main's actor ran it; vLLM then tokenized its text a third time (not counted).

Run alone: ``python -m bench.host [--quick]``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from typing import Any

from bench.common import run_alone
from classify.config.sections import ClassifyConfig, PilotConfig, load_config

SHARD_DOCS = 1000


def old_build_prompt(tokenizer: Any, cfg: ClassifyConfig, text: str) -> tuple[str, int]:
    """main's string prompt before issue #25 (``classify/engine/prompt.py`` at f8dd5eb): ``(text, n_tokens)``."""
    from classify.engine.prompt import render_text

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cut = tokenizer.decode(ids[: cfg.max_doc_tokens]) if len(ids) > cfg.max_doc_tokens else text
    rendered = render_text(tokenizer, cfg, cut)
    return rendered, len(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def _shards(texts: list[str]) -> list[Any]:
    from batch.corpus.shard import ShardInput

    out = []
    for start in range(0, len(texts), SHARD_DOCS):
        part = texts[start: start + SHARD_DOCS]
        body = "".join(json.dumps({"id": f"doc-{start + i}", "text": t}) + "\n" for i, t in enumerate(part)).encode()
        out.append(ShardInput.of_jsonl("bench.jsonl", "bench.jsonl", start + 1, body, len(part)))
    return out


def _best(fn: Any, repeat: int) -> float:
    """Fastest of ``repeat`` runs of ``fn()``, seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(quick: bool = False) -> dict[str, Any]:
    """Host docs/s (new path, its parts) and main's ``build_prompt`` docs/s on BBC articles and 5 KB documents."""
    from bench.common import bbc_dir
    from bench.instant_engine import HostEngineActor

    cfg = load_config(PilotConfig, "config/docpilot.json")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    actor = HostEngineActor(cfg.model, cfg.engine, cfg.classify, None, "")
    scorer = actor.clf.scorer
    texts = []
    for name in ("test", "train"):
        with (bbc_dir() / f"{name}.csv").open(encoding="utf-8", newline="") as fh:
            texts += [r["text"] for r in csv.DictReader(fh)]
    if quick:
        texts = texts[:400]
    corpora = {"BBC articles": texts,
               "5 KB documents": [(t + " ") * (5000 // len(t) + 1) for t in texts]}
    corpora["5 KB documents"] = [t[: t.rfind(" ", 0, 5000)] for t in corpora["5 KB documents"]]
    rows = []
    repeat = 2 if quick else 3
    for name, docs_text in corpora.items():
        shards = _shards(docs_text)
        n = len(docs_text)
        actor.classify(shards[0])  # warm-up: the tokenizer's caches and thread pool
        host_s = _best(lambda shards=shards: [actor.classify(s) for s in shards], repeat)
        parsed = [s.documents(cfg.classify.max_doc_bytes) for s in shards]
        parse_s = _best(lambda shards=shards: [s.documents(cfg.classify.max_doc_bytes) for s in shards], repeat)
        prompt_s = _best(lambda parsed=parsed: [scorer.prompts(d) for d in parsed], repeat)
        old_n = min(n, 300 if quick else 1000)
        old_s = _best(lambda some=docs_text[:old_n]: [old_build_prompt(scorer.tokenizer, cfg.classify, t) for t in some], 1)
        rows.append({
            "corpus": name, "docs": n, "mean_chars": round(sum(map(len, docs_text)) / n),
            "host_docs_per_s": round(n / host_s), "host_docs_per_s_per_core": round(n / host_s / cores),
            "parse_s_per_1k": round(parse_s / n * 1000, 4), "prompt_ids_s_per_1k": round(prompt_s / n * 1000, 4),
            "records_bytes_s_per_1k": round(max(0.0, host_s - parse_s - prompt_s) / n * 1000, 4),
            "prompt_ids_docs_per_s": round(n / prompt_s),
            "old_build_prompt_docs_per_s": round(old_n / old_s),
            "speedup_host_vs_old_build_prompt": round((n / host_s) / (old_n / old_s), 1),
        })
    return {"cores": cores, "rayon_threads": os.environ.get("RAYON_NUM_THREADS"), "rows": rows}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure and format for ``bench/run.py``.

    Returns:
        ``{"title", "figures", "markdown"}``.
    """
    figures = measure(quick)
    lines = [f"One actor's host work in one process on {figures['cores']} core(s) (tokenizer threads: "
             f"{figures['rayon_threads']}); everything but the forward pass (parse shard bytes, prompt ids with the "
             "real tokenizer, sampling parameters, result records, shard bytes), beside main's `build_prompt` alone "
             "(string prompt, one thread; vLLM then tokenized it again, not counted), same documents, same run.", "",
             "| corpus | docs | mean chars | host docs/s | per core | prompt ids only docs/s | old build_prompt docs/s | "
             "host / old | ms per 1k: parse / prompt ids / records+bytes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in figures["rows"]:
        lines.append(f"| {r['corpus']} | {r['docs']:,} | {r['mean_chars']:,} | {r['host_docs_per_s']:,} | "
                     f"{r['host_docs_per_s_per_core']:,} | {r['prompt_ids_docs_per_s']:,} | "
                     f"{r['old_build_prompt_docs_per_s']:,} | {r['speedup_host_vs_old_build_prompt']}x | "
                     f"{r['parse_s_per_1k'] * 1000:.0f} / {r['prompt_ids_s_per_1k'] * 1000:.0f} / "
                     f"{r['records_bytes_s_per_1k'] * 1000:.0f} |")
    return {"title": "Host side of one actor (token-id prompts vs main's build_prompt)", "figures": figures,
            "markdown": "\n".join(lines) + "\n"}


if __name__ == "__main__":
    run_alone(run, __doc__)
