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
from classify.errors import InputError
from classify.paths import runs_dir

log = logging.getLogger(__name__)


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
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", batch_id):  # the batch-id rule of `docpilot batch`
        raise InputError(f"batch id must be a run folder name (letters, digits, '.', '_', '-'), got {batch_id!r}")
    run_dir = (root or runs_dir()) / batch_id
    manifest = mf.read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        known = sorted(p.name for p in (root or runs_dir()).glob("*") if (p / mf.MANIFEST).is_file())
        raise InputError(f"no batch {batch_id!r} under {run_dir.parent} (batches there: {known[-5:] or 'none'})")
    progress_path = run_dir / mf.PROGRESS
    progress = json.loads(progress_path.read_text(encoding="utf-8")) if progress_path.is_file() else {}
    sizes = {s["index"]: s["n_docs"] for s in manifest["shards"]}
    complete = mf.complete_shard_indexes(run_dir, manifest)
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


DEFAULT_UPLOAD_MIB_PER_S = 10.0
"""Assumed upload rate from a rented pod to object storage, MiB/s (a conservative figure for one
stream over a pod's shared uplink; set ``--upload-mib-per-s`` to what ``docpilot adapters export``
or a test copy measured)."""


def _run_bytes(run_dir: Path) -> tuple[int, int]:
    """``(all bytes, shard bytes)`` of the regular files in a run folder."""
    total = shards = 0
    for p in run_dir.rglob("*"):
        if p.is_file():
            size = p.stat().st_size
            total += size
            shards += size if mf.SHARDS in p.relative_to(run_dir).parts[:-1] else 0
    return total, shards


def lease_check(st: dict[str, Any], lease_ends_at: dt.datetime, now: dt.datetime | None = None,
                upload_mib_per_s: float = DEFAULT_UPLOAD_MIB_PER_S) -> dict[str, Any]:
    """Whether the rest of a batch and its export finish before the lease ends.

    Finish time = now + ETA + export time. ETA = ids left / the current attempt's docs/s. Export
    time = projected export bytes / ``upload_mib_per_s``; the projection scales the shard bytes
    written so far to the whole corpus and counts them twice (the shards and the merged
    ``results.jsonl`` are both copied), plus the other files as they are now.

    Args:
        st: :func:`batch_status` output (``done``, ``total``, ``docs_per_s``, ``state``, ``run_dir``).
        lease_ends_at: when the lease ends (aware datetime).
        now: the current time (default: now, UTC).
        upload_mib_per_s: assumed upload rate in MiB/s (> 0).

    Returns:
        ``{fits: bool | None, lease_ends_at, finish_at, eta_s, export_s, export_bytes, margin_s, message}``;
        ``fits`` is None when there is no rate yet to estimate from.
    """
    now = now or dt.datetime.now(dt.UTC)
    left = max(int(st["total"]) - int(st["done"]), 0)
    rate = float(st.get("docs_per_s") or 0)
    all_bytes, shard_bytes = _run_bytes(Path(st["run_dir"])) if Path(st["run_dir"]).is_dir() else (0, 0)
    if left and st["done"]:
        export_bytes = all_bytes - shard_bytes + 2 * shard_bytes * st["total"] / st["done"]
    else:
        export_bytes = all_bytes + (shard_bytes if left else 0)
    export_s = export_bytes / (upload_mib_per_s * 1024**2)
    out: dict[str, Any] = {"lease_ends_at": lease_ends_at.isoformat(), "export_bytes": int(export_bytes),
                           "export_s": round(export_s, 1), "upload_mib_per_s": upload_mib_per_s}
    lease_left_s = (lease_ends_at - now).total_seconds()
    if not left:  # finished: only its copy off the pod is left to do
        ended = lease_left_s < 0
        out.update(fits=not ended, eta_s=0.0, finish_at=now.isoformat(), margin_s=round(lease_left_s, 1),
                   message=("batch finished, nothing left to classify; the lease "
                            + (f"ENDED {_eta(-lease_left_s)} ago ({lease_ends_at:%Y-%m-%d %H:%M %Z})" if ended else
                               f"ends {lease_ends_at:%Y-%m-%d %H:%M %Z} (in {_eta(lease_left_s)})")
                            + "; keep its export copy somewhere you control (`batch.export_dir` / --export-dir, "
                            "a folder or s3://...)"))
        return out
    if lease_left_s < 0:
        out.update(fits=False, eta_s=round(left / rate, 1) if rate else None, finish_at=None,
                   margin_s=round(lease_left_s, 1),
                   message=(f"the lease ENDED {_eta(-lease_left_s)} ago ({lease_ends_at:%Y-%m-%d %H:%M %Z}) with "
                            f"{left} ids left: export partial results now with `docpilot status {st['batch_id']} "
                            "--export-partial DEST` and resume with the same --batch-id on a new lot"))
        return out
    if left and not rate:
        out.update(fits=None, eta_s=None, finish_at=None, margin_s=None,
                   message=f"lease ends {lease_ends_at:%Y-%m-%d %H:%M %Z} (in {_eta(max(lease_left_s, 0))}): no rate yet, "
                           "cannot tell whether the batch fits; check again after the first shards")
        return out
    eta_s = left / rate if left else 0.0
    finish = now + dt.timedelta(seconds=eta_s + export_s)
    margin_s = (lease_ends_at - finish).total_seconds()
    out.update(eta_s=round(eta_s, 1), finish_at=finish.isoformat(), margin_s=round(margin_s, 1), fits=margin_s >= 0)
    plan = (f"ETA {_eta(eta_s)} + export ~{_eta(export_s)} ({export_bytes / 1024**2:.1f} MiB at {upload_mib_per_s:g} MiB/s) "
            f"-> done {finish:%Y-%m-%d %H:%M %Z}, lease ends {lease_ends_at:%Y-%m-%d %H:%M %Z}")
    if margin_s >= 0:
        out["message"] = f"fits: {plan} ({_eta(margin_s)} to spare)"
    else:
        out["message"] = (
            f"WILL NOT FINISH before the lease ends ({_eta(-margin_s)} short): {plan}. Add a lot (stop the batch, "
            f"then rerun `docpilot batch --batch-id {st['batch_id']}` on the larger cluster: complete shards are kept), "
            f"or export partial results now with `docpilot status {st['batch_id']} --export-partial DEST` "
            f"(DEST a folder or s3://...; a later run with the same --batch-id resumes from the copied shards)")
    return out


class LeaseWatch:
    """The running batch against the lease clock: its progress line says whether the rest fits.

    Every ``every_s`` seconds (it walks the run folder for the export estimate) the driver's
    counts go through :func:`lease_check`; the verdict is shown at the end of the progress bar
    (``lease: fits, 2h10m to spare``, ``lease: WILL NOT FINISH, 35m short`` or ``lease: ENDED``), stored in
    ``progress.json`` (``lease``), and the first time it says the batch will not finish, its
    full message (what to do) is logged as a warning.

    Args:
        lease_ends_at: when the lease ends (aware datetime), or ``None`` (then nothing is checked).
        run_dir: the batch's run folder.
        batch_id: the batch id (named in the advice).
        every_s: seconds between checks.
        upload_mib_per_s: assumed upload rate for the export estimate (MiB/s).
    """

    def __init__(self, lease_ends_at: dt.datetime | None, run_dir: Path, batch_id: str, every_s: float = 30.0,
                 upload_mib_per_s: float = DEFAULT_UPLOAD_MIB_PER_S):
        self.lease_ends_at, self.run_dir, self.batch_id = lease_ends_at, run_dir, batch_id
        self.every_s, self.upload_mib_per_s = every_s, upload_mib_per_s
        self.verdict: dict[str, Any] | None = None
        self._checked_at: float | None = None
        self._warned = False

    def tick(self, progress: Any, bar: Any = None, force: bool = False) -> dict[str, Any] | None:
        """Check the lease when ``every_s`` has passed (at once while there is no rate yet, or ``force``).

        Args:
            progress: the :class:`batch._progress.Progress` of this attempt.
            bar: the tqdm progress bar (its postfix shows the verdict), or ``None``.
            force: check now.

        Returns:
            The latest :func:`lease_check` verdict, or ``None`` without a lease end.
        """
        import time

        if self.lease_ends_at is None:
            return None
        now = time.monotonic()
        waiting_for_rate = self.verdict is not None and self.verdict["fits"] is None
        if not force and not waiting_for_rate and self._checked_at is not None and now - self._checked_at < self.every_s:
            return self.verdict
        self._checked_at = now
        st = {"total": progress.total, "done": progress.done, "docs_per_s": progress.rate(),
              "run_dir": str(self.run_dir), "batch_id": self.batch_id}
        self.verdict = lease_check(st, self.lease_ends_at, upload_mib_per_s=self.upload_mib_per_s)
        fits = self.verdict["fits"]
        ended = self.lease_ends_at <= dt.datetime.now(dt.UTC)
        if ended:
            short = "lease: ENDED"
        elif fits is None:
            short = "lease: no rate yet"
        elif fits:
            short = f"lease: fits, {_eta(self.verdict['margin_s'])} to spare"
        else:
            short = f"lease: WILL NOT FINISH, {_eta(-self.verdict['margin_s'])} short"
        if bar is not None:
            bar.set_postfix_str(short, refresh=False)
        progress.lease = {**self.verdict, "short": short}
        if fits is False and not self._warned:
            self._warned = True
            log.warning("batch %s: %s", self.batch_id, self.verdict["message"])
        return self.verdict


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


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


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
    print(f"  rate      {st['docs_per_s'] or 0:.2f} docs/s   ETA {_eta(st['eta_s']) if st['state'] == 'running' else '-'}")
    print(f"  retries   {st['retries']}   last error: {st['last_error'] or 'none'}")
    if st["skip_pilot_gate"]:
        print("  WARNING   started with --skip-pilot-gate (no passed pilot)")
    print(f"  folder    {st['run_dir']}   updated {st['updated_at']}")
    if "lease" in st:
        print(f"  lease     {st['lease']['message']}")
    if "partial_export" in st:
        print(f"  exported  {st['partial_export']} (partial: complete shards so far; SHA256SUMS re-checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
