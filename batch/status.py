"""``docpilot status BATCH`` / ``make status BATCH=<id>``: a batch's progress, read from its run folder.

Works from any shell while the batch runs (it only reads ``progress.json``, ``manifest.json``
and the shard files) and after it ended (``summary.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from batch import manifest as mf
from classify.errors import InputError
from classify.paths import runs_dir


def _driver_alive(progress: dict[str, Any]) -> bool | None:
    """Whether the driver process is still running (``None`` when it ran on another host)."""
    if progress.get("host") != socket.gethostname() or not progress.get("pid"):
        return None
    try:
        os.kill(int(progress["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def batch_status(batch_id: str, root: Path | None = None) -> dict[str, Any]:
    """Collect a batch's progress from its run folder.

    Args:
        batch_id: the run folder name under ``runs/``.
        root: parent of run folders (default :func:`classify.paths.runs_dir`).

    Returns:
        ``{batch_id, state, done, total, accepted, rejected, docs_per_s, eta_s, last_error, shards_done, shards}``.
        ``done`` counts ids in complete shard files, so it is right even after a crash.

    Raises:
        InputError: no such batch, or a folder that is not a batch run.
    """
    run_dir = (root or runs_dir()) / batch_id
    manifest = mf.read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        known = sorted(p.name for p in (root or runs_dir()).glob("*") if (p / mf.MANIFEST).is_file())
        raise InputError(f"no batch {batch_id!r} under {run_dir.parent} (batches there: {known[-5:] or 'none'})")
    progress_path = run_dir / mf.PROGRESS
    progress = json.loads(progress_path.read_text(encoding="utf-8")) if progress_path.is_file() else {}
    sizes = {s["index"]: s["n_docs"] for s in manifest["shards"]}
    complete = [int(p.stem) for p in (run_dir / mf.SHARDS).glob("*.jsonl") if p.stem.isdigit() and int(p.stem) in sizes]
    state = progress.get("state", "not started")
    if state == "running" and _driver_alive(progress) is False:
        state = "interrupted (driver gone; rerun with the same --batch-id to resume)"
    if (run_dir / mf.SUMMARY).is_file() and state != "running":
        state = "done"
    return {
        "batch_id": batch_id, "run_dir": str(run_dir), "state": state,
        "done": sum(sizes[i] for i in complete), "total": manifest["corpus"]["distinct_ids"],
        "accepted": progress.get("accepted"), "rejected": progress.get("rejected"),
        "docs_per_s": progress.get("docs_per_s"), "eta_s": progress.get("eta_s"),
        "last_error": progress.get("last_error") or (manifest["attempts"][-1].get("error") if manifest["attempts"] else None),
        "shards_done": len(complete), "shards": len(sizes), "retries": progress.get("retries", 0),
        "updated_at": progress.get("updated_at"), "skip_pilot_gate": manifest["pilot_gate"].get("override"),
    }


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def main(argv: list[str] | None = None) -> int:
    """``docpilot status BATCH [--json]``: print done/total, rejected, docs/s, ETA and the last error.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 (2 when no batch id is given).

    Raises:
        InputError: unknown batch id.
    """
    p = argparse.ArgumentParser(prog="docpilot status", description="Progress of a batch run, from its run folder.")
    p.add_argument("batch_id", nargs="?", help="the batch id (run folder name under runs/)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.batch_id:
        print("usage: docpilot status BATCH_ID   (make status BATCH=<id>)", file=sys.stderr)
        return 2
    st = batch_status(args.batch_id)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    pct = 100 * st["done"] / st["total"] if st["total"] else 100.0
    print(f"batch {st['batch_id']}: {st['state']}")
    print(f"  done      {st['done']}/{st['total']} ids ({pct:.1f}%), shards {st['shards_done']}/{st['shards']}")
    print(f"  rejected  {st['rejected'] if st['rejected'] is not None else '?'}   accepted {st['accepted'] if st['accepted'] is not None else '?'}")
    print(f"  rate      {st['docs_per_s'] or 0:.2f} docs/s   ETA {_eta(st['eta_s']) if st['state'] == 'running' else '-'}")
    print(f"  retries   {st['retries']}   last error: {st['last_error'] or 'none'}")
    if st["skip_pilot_gate"]:
        print("  WARNING   started with --skip-pilot-gate (no passed pilot)")
    print(f"  folder    {st['run_dir']}   updated {st['updated_at']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
