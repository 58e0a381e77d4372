"""Batch at scale with the corpus read from an S3 server, beside the same file read locally, in the same run.

The S3 server is moto's (its standalone server on 127.0.0.1, :func:`serve`), in a subprocess of its own: neither the bench
nor the measured driver serves it. For each size a synthetic JSONL corpus (:func:`bench.scale.write_corpus`) is
written once and uploaded once, then the same batch runs on ``--corpus <file>`` and on ``--corpus s3://bucket/key``
back to back, each in a fresh process (:func:`bench.scale.run_child`: the real Ray pool, the instant engine, run
folders and a local export, then a resume with half the shards done). Rounds alternate the order (local, s3, s3,
local, ...) so neither store always runs on a warmer machine; the ratio s3/local per size is of the means.

moto is not S3: as released it answers every range request by reading the whole object (a temporary file past
5 MB), so a request costs in proportion to the object's size: 0.17 s per range of the 47 MB corpus here, about
half an hour of range requests for one run of the 473 MB one. The server here (:func:`serve`) keeps objects in
memory and hands the range handler the stored bytes without a copy, so a range costs what its own bytes cost,
as on S3; the column "range GET s" (one 1 MiB range, median of 5, before the runs of that size) shows what a
request costs on it, and "range GETs" how many each run made.

Run alone: ``python -m bench.scale_s3 [--quick] [--sizes 10k 100k 1m] [--rounds 2]``; in ``make bench``:
``python -m bench.run --only scale_s3``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.scale import ACTORS, SIZES, run_child, write_corpus

S3_SIZES = {"10k": (10_000, 430), "100k": SIZES["100k"], "1m": SIZES["1m"]}
"""name -> (documents, approximate text bytes per document)."""
DEFAULT_SIZES = os.environ.get("DOCPILOT_SCALE_S3_SIZES", "10k,100k,1m").split(",")
"""Sizes measured by default (``DOCPILOT_SCALE_S3_SIZES``, comma-separated names of :data:`S3_SIZES`)."""
ROUNDS = int(os.environ.get("DOCPILOT_SCALE_S3_ROUNDS", "1"))
"""Runs of each store per size (``DOCPILOT_SCALE_S3_ROUNDS``; 2: local, s3, s3, local); the order alternates from round
to round and from size to size."""
RUN_TIMEOUT_S = float(os.environ.get("DOCPILOT_SCALE_S3_RUN_TIMEOUT_S", "1500"))
"""Longest one run may take (``DOCPILOT_SCALE_S3_RUN_TIMEOUT_S``); a run over it is stopped, noted in its row, and the
rest of that size and the larger sizes are left out."""
BUCKET = "docpilot-bench"


KEY_BUFFER_BYTES = 2 << 30
"""Objects up to this size stay in the server's memory (moto's ``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``)."""


def serve(port: int) -> None:
    """moto's S3 server on 127.0.0.1:``port`` (this process, until stopped), a range request costing its own bytes:
    an object held in memory is handed to the range handler as the stored bytes (``BytesIO.getvalue``, no copy) instead
    of a fresh read of the whole object."""
    import io

    from moto.s3.models import FakeKey
    from moto.server import main

    def value(self) -> bytes:
        with self.lock:
            held = getattr(self._value_buffer, "_file", None)
            if isinstance(held, io.BytesIO):
                return held.getvalue()
            self._value_buffer.seek(0)
            return self._value_buffer.read()

    FakeKey.value = property(value, FakeKey.value.fset)
    main(["-H", "127.0.0.1", "-p", str(port)])


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[dict[str, str]]:
    """moto's S3 server (:func:`serve`) in a subprocess on a free port of 127.0.0.1, its access log to ``log``; yields
    the environment that points a client at it (endpoint and test keys), then stops it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "bench.scale_s3", "--serve", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
                                env={**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(KEY_BUFFER_BYTES)})
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _filesystem(env: dict[str, str]):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
                             endpoint_url=env["AWS_ENDPOINT_URL"])


def _range_get_s(fs, key: str) -> float:
    """Median seconds of five 1 MiB range reads of ``key`` (what one request costs on this server)."""
    times = []
    for _ in range(5):
        t0 = time.monotonic()
        fs.cat_file(key, start=0, end=1 << 20)
        times.append(time.monotonic() - t0)
    return round(statistics.median(times), 3)


def _gets(log: Path) -> int:
    """GET requests for the bench's bucket in the server's access log so far."""
    return sum(1 for line in log.read_text(errors="replace").splitlines() if f"GET /{BUCKET}/" in line)


def measure_size(name: str, tmp: Path, env: dict[str, str], log: Path, rounds: int) -> list[dict]:
    """One size: write the corpus, upload it once, run local and s3 ``rounds`` times each, order alternating; one row
    per run."""
    n, text_bytes = S3_SIZES[name]
    corpus = tmp / f"{name}.jsonl"
    write_corpus(corpus, n, text_bytes)
    fs, key = _filesystem(env), f"{BUCKET}/scale/{name}.jsonl"
    t0 = time.monotonic()
    fs.put_file(str(corpus), key)
    upload_s, range_s = round(time.monotonic() - t0, 1), _range_get_s(fs, key)
    where = {"local": str(corpus), "s3": f"s3://{key}"}
    rows = []
    try:
        for r in range(rounds):
            for store in ("local", "s3") if (r + list(S3_SIZES).index(name)) % 2 == 0 else ("s3", "local"):
                before = _gets(log)
                try:
                    row = run_child(where[store], tmp / f"work-{name}-{store}-{r}", f"scale-s3-{name}-{store}-{r}",
                                    env=env if store == "s3" else None, timeout_s=RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    rows.append({"size": name, "store": store, "round": r, "docs": n, "timed_out_after_s": RUN_TIMEOUT_S,
                                 "range_gets": _gets(log) - before, "range_get_s": range_s})
                    print(f"[scale_s3] {json.dumps(rows[-1])}", file=sys.stderr)
                    return rows
                row.update(size=name, store=store, round=r, range_gets=_gets(log) - before, upload_s=upload_s,
                           range_get_s=range_s)
                rows.append(row)
                print(f"[scale_s3] {json.dumps(row)}", file=sys.stderr)
    finally:
        corpus.unlink()
        fs.rm(key)
    return rows


def _mean(rows: list[dict], size: str, store: str, key: str) -> float:
    return statistics.fmean(r[key] for r in rows if r["size"] == size and r["store"] == store)


def summarise(rows: list[dict]) -> list[dict]:
    """Per size whose every run finished: the means of each store and the ratios s3/local (docs/s, wall, driver RSS,
    resume start)."""
    out = []
    stopped = {r["size"] for r in rows if "timed_out_after_s" in r}
    for size in (s for s in dict.fromkeys(r["size"] for r in rows) if s not in stopped):
        one = {"size": size, "docs": next(r["docs"] for r in rows if r["size"] == size)}
        for key in ("docs_per_s", "wall_s", "peak_rss_gib", "resume_start_s"):
            local, s3 = _mean(rows, size, "local", key), _mean(rows, size, "s3", key)
            one.update({f"local_{key}": round(local, 3), f"s3_{key}": round(s3, 3),
                        f"ratio_{key}": round(s3 / local, 2) if local else None})
        out.append(one)
    return out


def markdown(rows: list[dict], sizes: list[dict], rounds: int) -> str:
    """The tables of :func:`run`: one row per run, then the means and ratios per size."""
    runs = "\n".join(
        f"| {r['size']} | {r['store']} | {r['round']} | {r['docs']:,} | stopped after {r['timed_out_after_s']:.0f} s "
        f"(DOCPILOT_SCALE_S3_RUN_TIMEOUT_S) | | | | | {r['range_gets']:,} | {r['range_get_s']} |"
        if "timed_out_after_s" in r else
        f"| {r['size']} | {r['store']} | {r['round']} | {r['docs']:,} | {r['corpus_bytes'] / 1e6:,.0f} | "
        f"{r['docs_per_s']:,} | {r['wall_s']} | {r['peak_rss_gib']} | {r['resume_start_s']} | {r['range_gets']:,} | "
        f"{r['range_get_s']} |" for r in rows)
    per_size = "\n".join(
        f"| {s['size']} | {s['docs']:,} | {s['local_docs_per_s']:,.0f} / {s['s3_docs_per_s']:,.0f} | "
        f"{s['ratio_docs_per_s']} | {s['local_peak_rss_gib']:.3f} / {s['s3_peak_rss_gib']:.3f} | "
        f"{s['ratio_peak_rss_gib']} | {s['local_resume_start_s']:.2f} / {s['s3_resume_start_s']:.2f} | "
        f"{s['ratio_resume_start_s']} |" for s in sizes)
    return (
        f"The batch of `bench.scale` (instant engine, real Ray pool with {ACTORS} actors, run folders, local export "
        "with its re-check, then a resume with half the shards removed), each run in a fresh process, on the same JSONL "
        "corpus read locally and from moto's S3 server on 127.0.0.1 (`s3://`, read by byte range through fsspec/s3fs: "
        f"the driver plans from it and sends each shard's bytes to the actors). {rounds} run(s) of each per size, the order alternating "
        "(local first in even rounds of 10k and 1m, s3 first in those of 100k); \"docs/s\" and \"wall s\" are the "
        "first run's, the resume after it is timed apart. The server is moto with ranges served from "
        "memory without a copy of the whole object (moto as released reads all of it for each range request: "
        "`bench/scale_s3.py`); \"range GET s\": one 1 MiB range on it, median of 5.\n\n"
        "| size | store | round | documents | corpus MB | docs/s end to end | wall s | driver peak RSS GiB | "
        "resume start s | range GETs | range GET s |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{runs}\n\n"
        "| size | documents | docs/s local / s3 | s3/local | driver RSS GiB local / s3 | s3/local | "
        "resume start s local / s3 | s3/local |\n|---|---|---|---|---|---|---|---|\n"
        f"{per_size}\n"
    )


def run(quick: bool = False, sizes: list[str] | None = None, rounds: int | None = None) -> dict:
    """Measure each size (``quick``: 10k, one round).

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    names = sizes or (["10k"] if quick else DEFAULT_SIZES)
    rounds = 1 if quick else (rounds or ROUNDS)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-s3-", dir=os.environ.get("DOCPILOT_BENCH_TMP")) as tmp:
        log = Path(tmp) / "moto.log"
        with moto_server(log) as env:
            _filesystem(env).mkdir(BUCKET)
            for name in names:
                rows += measure_size(name, Path(tmp), env, log, rounds)
                if "timed_out_after_s" in rows[-1]:
                    break  # the larger sizes would take longer still
    sizes_out = summarise(rows)
    return {"title": "Batch at scale, corpus from S3 (moto) beside local (instant engine)",
            "figures": {"rows": rows, "sizes": sizes_out, "rounds": rounds, "actors": ACTORS},
            "markdown": markdown(rows, sizes_out, rounds)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", nargs="*", choices=list(S3_SIZES))
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ns = parser.parse_args(sys.argv[1:])
    if ns.serve:
        serve(ns.serve)
        sys.exit(0)
    result = run(quick=ns.quick, sizes=ns.sizes, rounds=ns.rounds)
    print(json.dumps(result["figures"], indent=2))
    print(result["markdown"])
