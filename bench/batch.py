"""Ray batch throughput vs the plain vLLM offline call, and 1 vs 2 engine actors, on the BBC News test articles.

1. Offline: :func:`classify.engine.build.build_engine` + one ``Classifier.classify`` call over all articles
   (vLLM batches them itself). Timed: engine start, and the classify call (first-call warm-up included).
2. Ray batch, 1 actor: ``docpilot batch`` in this process (local Ray, ``config/docpilot.json``; a
   corpus this small is cut into at least 32 shards: about 6 of the 334 articles each).
3. Ray batch, 2 actors (``--cpu-actors 2``, 1 Ray CPU each) on the same articles, each actor's
   vLLM compute threads on its own cores (``batch.cpu_bind: "split"``, the default).
4. Ray batch, 2 actors with vLLM's own ``auto`` binding in both (``batch.cpu_bind: "auto"``), on the
   first 64 articles only: it shows why ``split`` is the default (both engines compute on one core).
Each run's engine is stopped before the next starts. Ray figures come from the batch's own
``summary.json``: docs/s over the whole pool (engine start and warm-up included), and a
steady-state docs/s from the shard files' completion times (:func:`bench.common.steady_rate`).

Run alone: ``python -m bench.batch [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import steady_rate

ROOT = Path(__file__).resolve().parent.parent


def _corpus(folder: Path, n: int | None) -> Path:
    from bench.common import bbc_dir

    csv_path = bbc_dir() / "test.csv"
    import csv

    with csv_path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))[:n]
    path = folder / "bbc-test.jsonl"
    path.write_text("".join(json.dumps({"id": f"bbc-test-{i:04d}", "text": r["text"]}) + "\n" for i, r in enumerate(rows)))
    return path


def _offline(corpus: Path) -> dict:
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import load_batch_config
    from classify.engine.build import build_engine

    cfg = load_batch_config(ROOT / "config" / "docpilot.json")
    size = cfg.classify.max_doc_bytes
    plan = plan_corpus(cfg.corpus, 1 << 30, 1 << 62, corpus, size)  # one shard: the whole corpus, read as the batch reads it
    docs = [d for s in plan.shards for d in plan.read_shard(s, size)]
    t0 = time.monotonic()
    clf = build_engine(cfg.model, cfg.engine, cfg.classify)
    t1 = time.monotonic()
    try:
        results = clf.classify(docs)
    finally:
        t2 = time.monotonic()
        clf.shutdown()
    tokens = sum(r.n_tokens for r in results)
    return {"docs": len(docs), "engine_start_s": round(t1 - t0, 1), "classify_s": round(t2 - t1, 1),
            "docs_per_s": round(len(docs) / (t2 - t0), 2), "docs_per_s_steady": round(len(docs) / (t2 - t1), 2),
            "tokens_per_s_steady": round(tokens / (t2 - t1), 1)}


def _ray(corpus: Path, actors: int, out: Path, cpu_bind: str = "split") -> dict:
    from batch.run.driver import parse_args, run_batch

    os.environ["DOCPILOT_RUNS"] = str(out / "runs")
    os.environ["DOCPILOT_EXPORTS"] = str(out / "exports")
    config = json.loads((ROOT / "config" / "docpilot.json").read_text())
    config["batch"]["cpu_bind"] = cpu_bind
    config_path = out / f"batch-{cpu_bind}.json"
    config_path.write_text(json.dumps(config))
    args = parse_args(["--config", str(config_path), "--corpus", str(corpus), "--batch-id",
                       f"bench-{actors}a-{cpu_bind}", "--cpu-actors", str(actors), "--skip-pilot-gate", "--no-progress"])
    summary = run_batch(args)
    t = summary["this_attempt"]
    return {"docs": t["processed_docs"], "actors": t["actors"], "pool_wall_s": t["pool_wall_s"],
            "first_shard_s": round(t["first_shard_s"] or 0, 1), "docs_per_s": t["docs_per_s"],
            **steady_rate(Path(summary["run_dir"]), t["actors"]),
            "tokens_per_s": t["tokens_per_s"], "retries": t["retries"], "cpu_bind": cpu_bind}


def run(quick: bool = False) -> dict:
    """Time the offline call, the Ray batch with 1 actor and with 2 actors on the same articles.

    The 2-actor run with vLLM's ``auto`` binding uses the first 64 articles (24 with ``quick``).

    Args:
        quick: 48 articles instead of all 334 (checks the path; the figures are dominated by engine start).

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    n = 48 if quick else None
    n_auto = 24 if quick else 64
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        corpus = _corpus(Path(tmp), n)
        offline = _offline(corpus)
        one = _ray(corpus, 1, Path(tmp))
        two = _ray(corpus, 2, Path(tmp), "split")
        auto_dir = Path(tmp) / "auto"
        auto_dir.mkdir()
        two_auto = _ray(_corpus(auto_dir, n_auto), 2, auto_dir, "auto")
    cpus = sorted(os.sched_getaffinity(0))
    from batch.pool.placement import cpu_core_groups

    groups = cpu_core_groups(2, cpus)
    figures = {"offline": offline, "ray_1_actor": one, "ray_2_actors": two, "ray_2_actors_auto_bind": two_auto,
               "cpus": len(cpus), "split_core_groups": groups}
    rows = [
        ("vLLM offline (one LLM.generate)", offline["docs"], offline["docs_per_s"], offline["docs_per_s_steady"],
         offline["engine_start_s"]),
        ("Ray batch, 1 actor", one["docs"], one["docs_per_s"], one["docs_per_s_steady"], one["first_shard_s"]),
        (f"Ray batch, 2 actors, own cores each ({' / '.join(groups or [])})", two["docs"], two["docs_per_s"],
         two["docs_per_s_steady"], two["first_shard_s"]),
        ("Ray batch, 2 actors, vLLM auto binding in both", two_auto["docs"], two_auto["docs_per_s"],
         two_auto["docs_per_s_steady"], two_auto["first_shard_s"]),
    ]
    table = "\n".join(f"| {name} | {d} | {a} | {b} | {c} |" for name, d, a, b, c in rows)

    def ratio(a: dict, b: dict) -> float:
        return a["docs_per_s_steady"] / b["docs_per_s_steady"] if b["docs_per_s_steady"] else 0.0

    markdown = (
        f"### Batch on Ray vs offline vLLM ({offline['docs']} BBC test articles, {len(cpus)} CPUs)\n\n"
        "| path | articles | docs/s end-to-end | docs/s steady | start s (engine / first shard) |\n|---|---|---|---|---|\n"
        f"{table}\n\n"
        f"Steady docs/s: Ray 1 actor / offline {ratio(one, offline):.2f}x; 2 actors (own cores) / 1 actor "
        f"{ratio(two, one):.2f}x; 2 actors (own cores) / offline {ratio(two, offline):.2f}x; 2 actors with vLLM's auto "
        f"binding / 1 actor {ratio(two_auto, one):.2f}x. End-to-end includes engine start and warm-up; steady runs from "
        "the moment every actor has returned a shard to the last shard (bench.common.steady_rate). Ray hands vLLM "
        f"shards of about {two['mean_shard_docs']} articles (two queued per actor) instead of the whole "
        "corpus in one call, and Ray's own processes share the same cores. On a CPU each vLLM engine keeps one core "
        "for its front end and binds its compute threads to the others (`VLLM_CPU_OMP_THREADS_BIND=auto`): with 2 "
        "cores that is one compute core, the same core in every engine, so a second engine with auto binding "
        "shares that core. `batch.cpu_bind: split` (the default) gives each actor's engine its own cores instead. "
        "On GPUs each actor owns a card (`num_gpus=1`).\n"
    )
    return {"title": "Batch: Ray actors vs offline vLLM", "figures": figures, "markdown": markdown}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    result = run(quick=parser.parse_args(sys.argv[1:]).quick)
    print(json.dumps(result["figures"], indent=2))
    print(result["markdown"])
