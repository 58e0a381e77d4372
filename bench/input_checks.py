"""What the input checks of issue 28 cost: the model re-hash, the plan's shard hashes, Parquet row-group size.

Each measurement runs in a fresh process (its own peak RSS) with whichever docpilot is first on ``PYTHONPATH``, so
the same command measures main and a branch::

    python -m bench.input_checks make  /tmp/bench-inputs          # write the corpora once
    python -m bench.input_checks plan  /tmp/bench-inputs/c.jsonl  # plan time of a JSONL corpus
    python -m bench.input_checks read  /tmp/bench-inputs/single.parquet   # plan + read every shard: docs/s, peak RSS
    python -m bench.input_checks rehash                            # the default model's re-hash (warm and cold)

The driver-side work only (no engine): planning and reading shards is what these checks changed. To measure
another checkout (main), copy this file outside ``bench/`` and run it by path with that checkout on
``PYTHONPATH`` (run by path from ``bench/``, ``bench/batch.py`` would shadow the ``batch`` package).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def make(folder: Path, rows: int = 1_000_000, pq_rows: int = 200_000) -> None:
    """Write ``c.jsonl`` (``rows`` rows) and ``single.parquet`` / ``small.parquet`` (one group / 2,000-row groups)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    text = "Shares in the company rose sharply after the results were announced on Monday morning. " * 3
    with (folder / "c.jsonl").open("w") as fh:
        for i in range(rows):
            fh.write(json.dumps({"id": f"d-{i:07d}", "text": f"{i} {text}"}) + "\n")
    table = pa.table({"id": [f"d-{i:07d}" for i in range(pq_rows)], "text": [f"{i} {text}" for i in range(pq_rows)]})
    pq.write_table(table, folder / "single.parquet", row_group_size=pq_rows)
    pq.write_table(table, folder / "small.parquet", row_group_size=2_000)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plan(path: Path) -> dict:
    """Plan time of a corpus (``shard_docs`` 1000, 4 MiB shards, as config/docpilot.json)."""
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    t0 = time.perf_counter()
    p = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 1000, 4 << 20)
    return {"what": "plan", "path": path.name, "rows": p.input_rows, "shards": len(p.shards),
            "seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": round(_peak_mib())}


def read(path: Path) -> dict:
    """Plan, then read every shard as the driver does at dispatch: docs/s of the reading, and the peak RSS."""
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    t0 = time.perf_counter()
    p = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 1000, 4 << 20)
    t1 = time.perf_counter()
    n = sum(len(p.read_shard(s, 200_000)) for s in p.shards)
    t2 = time.perf_counter()
    return {"what": "read", "path": path.name, "rows": n, "shards": len(p.shards), "plan_s": round(t1 - t0, 2),
            "read_s": round(t2 - t1, 2), "read_docs_per_s": round(n / (t2 - t1)), "peak_rss_mib": round(_peak_mib())}


def rehash() -> dict:
    """The default model's re-hash (:func:`classify.model.model.verify_model`): from the page cache, and cold (a copy
    evicted from the page cache with ``posix_fadvise(DONTNEED)``)."""
    import shutil
    import tempfile

    from classify.config.sections import ModelConfig
    from classify.model.model import ModelRef, resolve_model, verify_model

    ref = resolve_model(ModelConfig())
    verify_model(ref)
    t0 = time.perf_counter()
    verify_model(ref)
    warm = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir=Path(ref.path).parent.parent) as tmp:
        copy = Path(tmp) / "m"
        shutil.copytree(ref.path, copy)
        os.sync()  # written back first: DONTNEED drops only clean pages
        for f in copy.iterdir():
            with f.open("rb") as fh:
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        verify_model(ModelRef(ref.name, str(copy), ref.fingerprint, ref.source))
        cold = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in Path(ref.path).iterdir() if f.suffix == ".safetensors")
    return {"what": "rehash", "bytes": size, "warm_s": round(warm, 3), "cold_s": round(cold, 3)}


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(Path(sys.argv[2]))
    else:
        out = {"plan": lambda: plan(Path(sys.argv[2])), "read": lambda: read(Path(sys.argv[2])), "rehash": rehash}[cmd]()
        print(json.dumps(out))
