"""Batch machinery at scale: synthetic corpora through the real Ray pool and real run folders, instant engine.

Each size runs in a fresh subprocess (so the driver's peak RSS is its own): a synthetic JSONL
corpus is written to a temporary folder (not the repository), ``run_batch`` runs it end to end
with :data:`ACTORS` :class:`bench.instant_engine.InstantEngineActor` in place of vLLM (plan, Ray pool, shard
files, streaming merge to ``results.jsonl`` + ``results.parquet``, summary, export with
SHA256SUMS and its re-check), then half of the shard files (every other one) and the results
are removed and the same batch id is run again: "resume start" is the time from the call until
the pool is handed the remaining shards (corpus check, plan reuse, scan of the done shards).

Figures: end-to-end docs/s (read to verified export, Ray start included), driver peak RSS
(``ru_maxrss`` of the subprocess), files written (run folder + export), resume start seconds.

Run alone: ``python -m bench.scale [--quick] [--sizes 100k 1m 1m-5kb 10m]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"100k": (100_000, 430), "1m": (1_000_000, 430), "1m-5kb": (1_000_000, 5000), "10m": (10_000_000, 430)}
"""name -> (documents, approximate text bytes per document)."""
ACTORS = int(os.environ.get("DOCPILOT_SCALE_ACTORS", "2"))
"""Instant engine actors (``DOCPILOT_SCALE_ACTORS``; default 2, one per core of the 2-core machine: the actors parse
their shards, as the vLLM actors do)."""
DEFAULT_SIZES = os.environ.get("DOCPILOT_SCALE_SIZES", "100k,1m,1m-5kb").split(",")
"""Sizes ``make bench`` measures (``DOCPILOT_SCALE_SIZES``, comma-separated names of :data:`SIZES`; add ``10m`` for the
10M-document run, about 10 minutes and 15 GB of disk here)."""
WORDS = ("market shares rose bank profits league goal match minister vote election film album chart phone "
         "chip software growth economy striker coach season court policy budget tax studio actor award").split()


def write_corpus(path: Path, n: int, text_bytes: int, seed: int = 0) -> int:
    """Write ``n`` JSONL documents of about ``text_bytes`` bytes each; returns the file size in bytes."""
    rng = random.Random(seed)
    pool = [" ".join(rng.choices(WORDS, k=text_bytes // 6 + 1))[:text_bytes] for _ in range(256)]
    with path.open("w", encoding="utf-8") as fh:
        for start in range(0, n, 10_000):
            fh.write("".join(f'{{"id": "doc-{i:09d}", "text": "{pool[i % 256]} {i}"}}\n'
                             for i in range(start, min(n, start + 10_000))))
    return path.stat().st_size


def _count_files(folder: Path) -> tuple[int, int]:
    """(files, the most files in one folder)."""
    total, most = 0, 0
    for _, _, files in os.walk(folder):
        total += len(files)
        most = max(most, len(files))
    return total, most


def _child(corpus: str, work: str, batch_id: str, host: str = "0") -> None:
    """One size, in this (fresh) process: full run, then a resume with half the shards removed (``host="1"``: the
    :class:`bench.instant_engine.HostEngineActor`, real prompt ids and records, no forward pass)."""
    import logging
    import resource

    logging.basicConfig(level=logging.WARNING)
    os.environ["DOCPILOT_RUNS"] = f"{work}/runs"
    os.environ["DOCPILOT_EXPORTS"] = f"{work}/exports"
    from batch import layout as mf
    from batch.corpus.source import corpus_file
    from batch.run import driver
    from bench.instant_engine import remote_class

    config = Path(work) / "batch.json"
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["batch"]["cpu_actors"] = ACTORS
    config.write_text(json.dumps(data))
    args = driver.parse_args(["--config", str(config), "--corpus", corpus, "--batch-id", batch_id,
                              "--skip-pilot-gate", "--no-progress"])
    t0 = time.monotonic()
    summary = driver.run_batch(args, _engine_actor=remote_class(host == "1"))
    wall = time.monotonic() - t0
    run = Path(summary["run_dir"])
    files, most = _count_files(run)
    efiles, emost = _count_files(Path(summary["export_dir"]))
    manifest = mf.read_manifest(run)
    n_shards = len(manifest.shards)
    # a resume with half the shards done: every other shard file, the results and the export removed
    for s in manifest.shards[::2]:
        mf.shard_path(run, s.index).unlink()
    for name in (mf.RESULTS, mf.RESULTS_PARQUET, mf.SUMMARY):
        (run / name).unlink(missing_ok=True)
    shutil.rmtree(summary["export_dir"])
    started: dict[str, float] = {}
    from batch.run.attempt import BatchRun

    real = BatchRun.run_shards  # the bench times the moment the pool gets the remaining shards

    def timed(*a, **k):
        started.setdefault("t", time.monotonic())
        return real(*a, **k)

    BatchRun.run_shards = timed
    t1 = time.monotonic()
    again = driver.run_batch(args, _engine_actor=remote_class(host == "1"))
    resume_wall = time.monotonic() - t1
    assert again["total"] == summary["total"] and again["this_attempt"]["processed_docs"] < summary["total"]
    print(json.dumps({
        "docs": summary["total"], "corpus_bytes": corpus_file(corpus).stat().st_size, "shards": n_shards,
        "wall_s": round(wall, 1), "docs_per_s": round(summary["total"] / wall),
        "pool_wall_s": summary["this_attempt"]["pool_wall_s"], "merge_s": summary["this_attempt"].get("merge_s"),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "run_files": files, "export_files": efiles, "most_files_in_a_folder": max(most, emost),
        "resume_start_s": round(started["t"] - t1, 2), "resume_wall_s": round(resume_wall, 1),
        "resume_processed_docs": again["this_attempt"]["processed_docs"],
    }))


def measure(name: str, tmp: Path, host: bool = False) -> dict:
    """Write the corpus of size ``name`` and run :func:`_child` on it in a fresh interpreter (``host``: real prompt
    ids, records and shard bytes in the actors, only the forward pass skipped)."""
    n, text_bytes = SIZES[name]
    corpus = tmp / f"{name}.jsonl"
    t0 = time.monotonic()
    write_corpus(corpus, n, text_bytes)
    gen_s = time.monotonic() - t0
    try:
        out = run_child(str(corpus), tmp / f"work-{name}{'-host' if host else ''}", f"scale-{name}", host=host)
    finally:
        corpus.unlink()
    out.update(size=f"{name}, real prompt ids" if host else name, corpus_write_s=round(gen_s, 1))
    return out


def run_child(corpus: str, work: Path, batch_id: str, host: bool = False, env: dict[str, str] | None = None,
              timeout_s: float = 7200) -> dict:
    """Run :func:`_child` on ``corpus`` (a local path or a store URL) in a fresh interpreter, in the new folder ``work``
    (removed after); ``env``: variables added to the child's environment (a store's endpoint and keys). Returns its
    figures.

    Raises:
        subprocess.TimeoutExpired: the child ran over ``timeout_s`` (it and the Ray processes it started, its own
            process group, are killed).
        RuntimeError: the child failed.
    """
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--child", corpus, str(work), batch_id,
                             "1" if host else "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{batch_id}: exit {proc.returncode}: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run(quick: bool = False, sizes: list[str] | None = None) -> dict:
    """Measure each size (``quick``: 20k documents only).

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    names = sizes or (["100k"] if quick else DEFAULT_SIZES)
    if quick:
        SIZES["100k"] = (20_000, 430)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=os.environ.get("DOCPILOT_BENCH_TMP")) as tmp:
        for name in names:
            rows.append(measure(name, Path(tmp)))
            print(f"[scale] {json.dumps(rows[-1])}", file=sys.stderr)
        rows.append(measure(names[0], Path(tmp), host=True))  # the same corpus with the actors' real host work
        print(f"[scale] {json.dumps(rows[-1])}", file=sys.stderr)
    table = "\n".join(
        f"| {r['size']} | {r['docs']:,} | {r['corpus_bytes'] / 1e6:,.0f} MB | {r['shards']:,} | {r['docs_per_s']:,} | "
        f"{r['wall_s']} | {r['peak_rss_gib']} | {r['run_files']:,} + {r['export_files']:,} ({r['most_files_in_a_folder']:,}) | "
        f"{r['resume_start_s']} |" for r in rows)
    markdown = (
        f"Instant bench engine (no model) through the real Ray pool ({ACTORS} actors) and real run folders; each size in a fresh "
        "process. The row \"real prompt ids\" runs bench.instant_engine.HostEngineActor: the actors build the prompt ids with "
        "the real tokenizer, the sampling parameters, the result records and shard bytes, skipping only the forward pass. End to end = plan + Ray start + shards + merge (results.jsonl + results.parquet) + summary + export "
        "with SHA256SUMS + its re-check.\n\n"
        "| size | documents | corpus | shards | docs/s end to end | wall s | driver peak RSS GiB | files run + export "
        "(most in one folder) | resume start s (half the shards done) |\n|---|---|---|---|---|---|---|---|---|\n"
        f"{table}\n"
    )
    return {"title": "Batch at scale (instant engine)", "figures": {"rows": rows}, "markdown": markdown}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", nargs="*", choices=sorted(SIZES))
    parser.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    ns = parser.parse_args(sys.argv[1:])
    if ns.child:
        _child(*ns.child)
    else:
        result = run(quick=ns.quick, sizes=ns.sizes)
        print(json.dumps(result["figures"], indent=2))
        print(result["markdown"])
