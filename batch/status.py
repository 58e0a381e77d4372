"""``docpilot status BATCH`` / ``make status BATCH=<id>``: a batch's progress, read from its run folder.

Works from any shell while the batch runs (it only reads ``progress.json``, ``manifest.json``
and the shard files) and after it ended (``summary.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from batch import manifest as mf
from batch.lease import DEFAULT_UPLOAD_MIB_PER_S, eta_text, lease_check
from batch.runfiles import ProgressFile
from classify.errors import InputError
from classify.paths import runs_dir

log = logging.getLogger(__name__)


def _driver_alive(progress: ProgressFile) -> bool | None:
    """Whether the driver process is still running (``None`` when it ran on another host)."""
    if progress.host != socket.gethostname() or not progress.pid:
        return None
    try:
        os.kill(int(progress.pid), 0)
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
        ``{batch_id, state, done, total, accepted, rejected, docs_per_s, eta_s, last_error, shards_done, shards,
        classified, export}``. ``done`` counts ids in complete shard files, so it is right even after a crash.
        ``classified``: the results are merged (``summary.json``); ``export``: ``{to, verified_at}`` of the
        export an attempt copied and re-checked, or ``None``. ``state`` is ``done`` only with both.

    Raises:
        InputError: no such batch, or a folder that is not a batch run.
    """
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", batch_id):  # the batch-id rule of `docpilot batch`
        raise InputError(f"batch id must be a run folder name (letters, digits, '.', '_', '-'), got {batch_id!r}")
    run_dir = (root or runs_dir()) / batch_id
    manifest = mf.read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        known = sorted(p.name for p in (root or runs_dir()).glob("*") if (p / mf.MANIFEST).is_file())
        raise InputError(f"no batch {batch_id!r} under {run_dir.parent} (batches there: {known[-5:] or 'none'})")
    progress = ProgressFile.read(run_dir / mf.PROGRESS)
    sizes = {s["index"]: s["n_docs"] for s in manifest.shards}
    complete = mf.complete_shard_indexes(run_dir, manifest)
    state = progress.state
    if state == "running" and _driver_alive(progress) is False:
        state = "interrupted (driver gone; rerun with the same --batch-id to resume)"
    export = next(({"to": a.get("exported_to"), "verified_at": a["export_verified_at"]}
                   for a in reversed(manifest.attempts) if a.get("export_verified_at")), None)
    classified = (run_dir / mf.SUMMARY).is_file()
    if classified and state != "running":  # "done" only once a verified export exists
        state = "done" if export is not None else ("classified, not exported: the results are merged but no verified "
                                                   "export exists yet; rerun the same command to export and re-check it")
    return {
        "batch_id": batch_id, "run_dir": str(run_dir), "state": state,
        "done": sum(sizes[i] for i in complete), "total": manifest.corpus.get("distinct_ids"),
        "accepted": progress.accepted, "rejected": progress.rejected,
        "docs_per_s": progress.docs_per_s, "eta_s": progress.eta_s,
        "last_error": progress.last_error or (manifest.attempts[-1].get("error") if manifest.attempts else None),
        "shards_done": len(complete), "shards": len(sizes), "retries": progress.retries,
        "updated_at": progress.updated_at, "skip_pilot_gate": manifest.pilot_gate.get("override"),
        "classified": classified, "export": export,
    }


def export_partial(st: dict[str, Any], dest_root: str) -> Any:
    """Copy a batch's run folder as it is now to ``<dest_root>/<batch-id>-partial-<utc>/`` and re-check it.

    Complete shard files are final (written atomically), so the copy holds every finished shard;
    the temporary file of a shard being written is hidden and skipped.

    Args:
        st: :func:`batch_status` output.
        dest_root: a folder or an object-storage URL.

    Returns:
        The copy's destination.

    Raises:
        VerificationError: the copy fails its re-check (names the file).
    """
    from classify import storage
    from classify.accounting import recheck_export
    from classify.export import export_run

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = storage.join(storage.as_dest(dest_root), f"{st['batch_id']}-partial-{stamp}")
    with storage.local_copy_dir("partial") as tmp:  # a snapshot first: progress.json is rewritten while it runs
        snapshot = Path(tmp) / st["batch_id"]
        shutil.copytree(st["run_dir"], snapshot, ignore=shutil.ignore_patterns(".*"))
        export_run(snapshot, dest)
    recheck_export(dest, None, f"partial export {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    """``docpilot status BATCH [--json] [--lease-ends T]``: done/total, rejected, docs/s, ETA, the last error,
    and with a lease end (``--lease-ends`` or the lots config's ``lease_ends_at``) whether it fits.

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
    p.add_argument("--lease-ends", help="when the lease ends, ISO 8601 with timezone (replaces the lots "
                                        "config's `lease_ends_at`)")
    p.add_argument("--lots-config", default="config/lots.json", help="lots config holding `lease_ends_at` "
                                                                       "(default %(default)s)")
    p.add_argument("--export-partial", metavar="DEST",
                   help="copy the run folder as it is now (complete shards) to DEST/<batch-id>-partial-<utc>/ "
                        "(folder or object-storage URL) with SHA256SUMS, read back and re-checked")
    p.add_argument("--upload-mib-per-s", type=float, default=DEFAULT_UPLOAD_MIB_PER_S,
                   help="assumed upload rate for the export estimate, MiB/s (default %(default)s)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.batch_id:
        print("usage: docpilot status BATCH_ID   (make status BATCH=<id>)", file=sys.stderr)
        return 2
    st = batch_status(args.batch_id)
    from batch.plan import lease_end

    lease = lease_end(args.lots_config, args.lease_ends)
    if lease is not None:
        if not args.upload_mib_per_s > 0:
            raise InputError(f"--upload-mib-per-s must be > 0, got {args.upload_mib_per_s}")
        st["lease"] = lease_check(st, lease, upload_mib_per_s=args.upload_mib_per_s)
    if args.export_partial:
        st["partial_export"] = str(export_partial(st, args.export_partial))
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    pct = 100 * st["done"] / st["total"] if st["total"] else 100.0
    print(f"batch {st['batch_id']}: {st['state']}")
    print(f"  done      {st['done']}/{st['total']} ids ({pct:.1f}%), shards {st['shards_done']}/{st['shards']}")
    print(f"  rejected  {st['rejected'] if st['rejected'] is not None else '?'}   accepted {st['accepted'] if st['accepted'] is not None else '?'}")
    print(f"  rate      {st['docs_per_s'] or 0:.2f} docs/s   ETA {eta_text(st['eta_s']) if st['state'] == 'running' else '-'}")
    print(f"  retries   {st['retries']}   last error: {st['last_error'] or 'none'}")
    if st["skip_pilot_gate"]:
        print("  WARNING   started with --skip-pilot-gate (no passed pilot)")
    print(f"  folder    {st['run_dir']}   updated {st['updated_at']}")
    if st.get("export"):
        print(f"  export    {st['export']['to']} (exported and verified {st['export']['verified_at']})")
    elif st.get("classified"):
        print("  export    none verified yet (classified only)")
    if "lease" in st:
        print(f"  lease     {st['lease']['message']}")
    if "partial_export" in st:
        print(f"  exported  {st['partial_export']} (partial: complete shards so far; SHA256SUMS re-checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
