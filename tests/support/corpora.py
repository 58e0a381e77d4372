"""Shared helpers of the batch tests (no tests here): a corpus from BBC test.csv plus planted bad documents."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Planted documents and the reason prefix each must be rejected with.
PLANTED = {
    "bad-empty": "empty document",
    "bad-binary": "binary content",
    "bad-latin1": "not valid UTF-8",
    "bad-oversize": "over size limit",
    "bad-missing-file": "unreadable",
}


def bbc_rows(bbc_dir: Path, n: int | None) -> list[dict]:
    """The first ``n`` rows of BBC test.csv with ids ``bbc-test-NNNN`` (the README's convention)."""
    with (bbc_dir / "test.csv").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows = rows if n is None else rows[:n]
    return [{"id": f"bbc-test-{i:04d}", "text": r["text"], "category": r["category"]} for i, r in enumerate(rows)]


def make_corpus(folder: Path, bbc_dir: Path, n: int | None, max_doc_bytes: int = 200_000) -> dict:
    """Write ``corpus.jsonl`` (BBC articles + planted bad documents + a duplicated id + a broken line).

    Returns:
        ``{"path", "ids" (distinct ids expected in results), "input_rows", "duplicate_rows", "labels"}``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    files = folder / "files"
    files.mkdir(exist_ok=True)
    (files / "binary.dat").write_bytes(bytes(range(256)) * 4)
    (files / "latin1.txt").write_bytes("Caf\xe9 au lait, cr\xe8me br\xfbl\xe9e and news".encode("latin-1"))
    rows = bbc_rows(bbc_dir, n)
    lines = [{"id": r["id"], "text": r["text"]} for r in rows]
    lines += [
        {"id": "bad-empty", "text": ""},
        {"id": "bad-binary", "path": "files/binary.dat"},
        {"id": "bad-latin1", "path": "files/latin1.txt"},
        {"id": "bad-oversize", "text": "news " * (max_doc_bytes // 5 + 1)},
        {"id": "bad-missing-file", "path": "files/does-not-exist.txt"},
        {"id": "mojibake-ok", "text": "Shares rose to Â£3.9bn as the bank's profits beat forecasts."},
        {"id": rows[1]["id"], "text": "a second document claiming an id already used"},
    ]
    body = "".join(json.dumps(x) + "\n" for x in lines) + "{not json\n"
    path = folder / "corpus.jsonl"
    path.write_text(body, encoding="utf-8")
    ids = [r["id"] for r in rows] + list(PLANTED) + ["mojibake-ok", f"corpus.jsonl#L{len(lines) + 1}"]
    return {"path": path, "ids": ids, "input_rows": len(lines) + 1, "duplicate_rows": 1,
            "labels": {r["id"]: r["category"] for r in rows}, "dup_id": rows[1]["id"]}


def write_config(path: Path, **batch_fields) -> Path:
    """config/docpilot.json with the ``batch`` section's fields replaced."""
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["batch"].update(batch_fields)
    path.write_text(json.dumps(data, indent=2))
    return path


def kill_recorded(procs: list[dict]) -> None:
    """SIGKILL processes recorded in progress.json (pid + start time) that still run: test cleanup."""
    import psutil

    for rec in procs:
        try:
            proc = psutil.Process(rec["pid"])
            if abs(proc.create_time() - rec["create_time"]) < 0.01 and proc.pid != os.getpid():
                os.kill(proc.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError):
            pass


def local_ray_session(*modules):
    """A small local Ray for the scheduler tests (a fixture body: ``yield from``); ``modules`` are pickled by value.

    Test modules define their stand-in actors at module level; registering them by value lets Ray's
    workers unpickle them without importing ``tests``.
    """
    import ray
    from ray import cloudpickle

    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    yield ray
    ray.shutdown()


def fake_shards() -> list:
    """Three shards of four one-word documents ``d-0000`` .. ``d-0011``, for the scheduler tests."""
    from classify.records import Document

    docs = [Document(f"d-{i:04d}", "text", "", 4) for i in range(12)]
    return [(i, docs[4 * i:4 * i + 4]) for i in range(3)]
