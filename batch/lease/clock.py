"""The lease clock: when the lease ends, and whether the rest of the running batch and its export finish before it.

:func:`lease_end` is the lease end in force (``--lease-ends`` or the lots config's ``lease_ends_at``);
:func:`lease_check` is the estimate (``docpilot status --lease-ends``); :class:`LeaseWatch` runs it
from the driver every 30 s and shows the verdict on the progress line and in ``progress.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, ValidationError

from batch import layout as mf
from batch.plan.lots import load_lease_part
from classify.config.sections import Frozen
from classify.errors import ConfigError
from classify.usercommand import user_command, user_flag

log = logging.getLogger(__name__)


class _Lease(Frozen):
    lease_ends_at: AwareDatetime


def parse_lease_end(text: str) -> dt.datetime:
    """Parse a lease end given on the command line (``--lease-ends``).

    Args:
        text: ISO 8601 with a timezone, e.g. ``2026-12-03T18:00:00Z`` or ``2026-12-03T19:00:00+01:00``.

    Returns:
        The aware datetime.

    Raises:
        ConfigError: not ISO 8601, or no timezone (a lease clock without one is ambiguous).
    """
    try:
        return _Lease(lease_ends_at=text).lease_ends_at
    except ValidationError:
        raise ConfigError(f"`lease_ends_at` must be ISO 8601 with a timezone (e.g. 2026-12-03T18:00:00Z), "
                          f"got {text!r}") from None


def lease_end(lots_config: str | Path | None = "config/lots.json", override: str | None = None) -> dt.datetime | None:
    """The lease end in force: ``override`` (``--lease-ends``) if given, else the lots config's ``lease_ends_at``.

    Args:
        lots_config: ``config/lots.json``; a missing file means no lease end (``None`` skips it).
        override: a ``--lease-ends`` value.

    Returns:
        The aware datetime, or ``None`` when neither gives one.

    Raises:
        ConfigError: an invalid value or lots config.
    """
    if override:
        return parse_lease_end(override)
    if lots_config is None or not Path(lots_config).is_file():
        return None
    return load_lease_part(lots_config).lease_ends_at


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

    Finish time = now + ETA + export time. ETA = ids left / the current attempt's steady docs/s
    (after its first shard: the engines' start left out), or its overall docs/s before a steady rate exists. Export
    time = projected export bytes / ``upload_mib_per_s``; the projection scales the shard bytes
    written so far to the whole corpus and counts them twice (the shards and the merged
    ``results.jsonl`` are both copied), plus the other files as they are now.
    Shard bytes already copied off the pod while the batch runs (``copied_bytes``, :mod:`batch.run.offpod`)
    are not sent again and are left out; shards still waiting for their copy (the copy's lag) stay in.

    Args:
        st: :func:`batch.lot.status.batch_status` output (``done``, ``total``, ``docs_per_s``, optional
            ``steady_docs_per_s``, ``state``, ``run_dir``;
            optional ``copied_bytes``: shard bytes already at the export location).
        lease_ends_at: when the lease ends (aware datetime).
        now: the current time (default: now, UTC).
        upload_mib_per_s: assumed upload rate in MiB/s (> 0).

    Returns:
        ``{fits: bool | None, lease_ends_at, finish_at, eta_s, export_s, export_bytes, margin_s, message}``;
        ``fits`` is None when there is no rate yet to estimate from.
    """
    now = now or dt.datetime.now(dt.UTC)
    left = max(int(st["total"]) - int(st["done"]), 0)
    rate = float(st.get("steady_docs_per_s") or st.get("docs_per_s") or 0)
    bid = st.get("batch_id")
    all_bytes, shard_bytes = _run_bytes(Path(st["run_dir"])) if Path(st["run_dir"]).is_dir() else (0, 0)
    if left and st["done"]:
        export_bytes = all_bytes - shard_bytes + 2 * shard_bytes * st["total"] / st["done"]
    else:
        export_bytes = all_bytes + (shard_bytes if left else 0)
    export_bytes = max(export_bytes - int(st.get("copied_bytes") or 0), 0)  # already off the pod: not sent again
    export_s = export_bytes / (upload_mib_per_s * 1024**2)
    out: dict[str, Any] = {"lease_ends_at": lease_ends_at.isoformat(), "export_bytes": int(export_bytes),
                           "export_s": round(export_s, 1), "upload_mib_per_s": upload_mib_per_s}
    lease_left_s = (lease_ends_at - now).total_seconds()
    if not left:  # finished: only its copy off the pod is left to do
        ended = lease_left_s < 0
        out.update(fits=not ended, eta_s=0.0, finish_at=now.isoformat(), margin_s=round(lease_left_s, 1),
                   message=("batch finished, nothing left to classify; the lease "
                            + (f"ENDED {eta_text(-lease_left_s)} ago ({lease_ends_at:%Y-%m-%d %H:%M %Z})" if ended else
                               f"ends {lease_ends_at:%Y-%m-%d %H:%M %Z} (in {eta_text(lease_left_s)})")
                            + f"; keep its export copy somewhere you control (`batch.export_dir` / {user_flag('--export-dir', 'DEST')}, "
                            "a folder or s3://...)"))
        return out
    if lease_left_s < 0:
        out.update(fits=False, eta_s=round(left / rate, 1) if rate else None, finish_at=None,
                   margin_s=round(lease_left_s, 1),
                   message=(f"the lease ENDED {eta_text(-lease_left_s)} ago ({lease_ends_at:%Y-%m-%d %H:%M %Z}) with "
                            f"{left} ids left: export partial results now with "
                            f"`{user_command(f'docpilot status {bid} --export-partial DEST')}` and resume "
                            f"with the same {user_flag('--batch-id', bid)} on a new lot"))
        return out
    if left and not rate:
        out.update(fits=None, eta_s=None, finish_at=None, margin_s=None,
                   message=f"lease ends {lease_ends_at:%Y-%m-%d %H:%M %Z} (in {eta_text(max(lease_left_s, 0))}): no rate yet, "
                           "cannot tell whether the batch fits; check again after the first shards")
        return out
    eta_s = left / rate if left else 0.0
    finish = now + dt.timedelta(seconds=eta_s + export_s)
    margin_s = (lease_ends_at - finish).total_seconds()
    out.update(eta_s=round(eta_s, 1), finish_at=finish.isoformat(), margin_s=round(margin_s, 1), fits=margin_s >= 0)
    plan = (f"ETA {eta_text(eta_s)} + export ~{eta_text(export_s)} ({export_bytes / 1024**2:.1f} MiB at {upload_mib_per_s:g} MiB/s) "
            f"-> done {finish:%Y-%m-%d %H:%M %Z}, lease ends {lease_ends_at:%Y-%m-%d %H:%M %Z}")
    if margin_s >= 0:
        out["message"] = f"fits: {plan} ({eta_text(margin_s)} to spare)"
    else:
        out["message"] = (
            f"WILL NOT FINISH before the lease ends ({eta_text(-margin_s)} short): {plan}. Add a lot (stop the batch, "
            f"then rerun `{user_command(f'docpilot batch --batch-id {bid}')}` on the larger cluster: complete "
            f"shards are kept), or export partial results now with "
            f"`{user_command(f'docpilot status {bid} --export-partial DEST')}` (DEST a folder or s3://...; a "
            f"later run with the same {user_flag('--batch-id', bid)} resumes from the copied shards)")
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
            progress: the :class:`batch.run.progress.Progress` of this attempt.
            bar: the tqdm progress bar (its postfix shows the verdict), or ``None``.
            force: check now.

        Returns:
            The latest :func:`lease_check` verdict, or ``None`` without a lease end.
        """
        if self.lease_ends_at is None:
            return None
        now = time.monotonic()
        waiting_for_rate = self.verdict is not None and self.verdict["fits"] is None
        if not force and not waiting_for_rate and self._checked_at is not None and now - self._checked_at < self.every_s:
            return self.verdict
        self._checked_at = now
        offpod = progress.offpod() if getattr(progress, "offpod", None) is not None else {}
        st = {"total": progress.total, "done": progress.done, "docs_per_s": progress.lease_rate(),
              "run_dir": str(self.run_dir), "batch_id": self.batch_id, "copied_bytes": offpod.get("copied_bytes", 0)}
        self.verdict = lease_check(st, self.lease_ends_at, upload_mib_per_s=self.upload_mib_per_s)
        fits = self.verdict["fits"]
        ended = self.lease_ends_at <= dt.datetime.now(dt.UTC)
        if ended:
            short = "lease: ENDED"
        elif fits is None:
            short = "lease: no rate yet"
        elif fits:
            short = f"lease: fits, {eta_text(self.verdict['margin_s'])} to spare"
        else:
            short = f"lease: WILL NOT FINISH, {eta_text(-self.verdict['margin_s'])} short"
        if bar is not None:
            bar.set_postfix_str(short, refresh=False)
        progress.lease = {**self.verdict, "short": short}
        if fits is False and not self._warned:
            self._warned = True
            log.warning("batch %s: %s", self.batch_id, self.verdict["message"])
        return self.verdict


def eta_text(seconds: float | None) -> str:
    """``1h02m03s`` / ``2m03s`` for a number of seconds; ``unknown`` for ``None``."""
    if seconds is None:
        return "unknown"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
