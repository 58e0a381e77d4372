"""Private: ``progress.json``, rewritten atomically by the driver as shards complete (read by ``docpilot status``).

The file is rewritten at most every :data:`SAVE_EVERY_S` seconds while shards complete (a large
batch completes many shards a second), and always on a state change, an actor event, a retry
and at the end (the file itself is :class:`batch.runfiles.ProgressFile`). With an export location
set, each save is offered to the off-pod mirror (:mod:`batch.run.mirror`, at most once a minute). The driver's progress
bar (:func:`progress_bar`) is drawn beside it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from batch.layout import PROGRESS
from batch.runfiles import ProgressFile
from classify.runs.detached import process_identity
from classify.runs.records import utc_now

SAVE_EVERY_S = 2.0
"""Least seconds between two rewrites of ``progress.json`` caused by completed shards."""


class Progress:
    """Counts for one attempt of one batch, saved to ``<run_dir>/progress.json`` (throttled: :data:`SAVE_EVERY_S`).

    Args:
        run_dir: the batch's run folder.
        batch_id: its id.
        total: distinct ids in the corpus.
        mirror: where ``progress.json`` is mirrored off the pod (:class:`batch.run.mirror.ProgressMirror`),
            or ``None``.
        offpod: returns the state of the shards' copy off the pod (:meth:`batch.run.offpod.ShardUploader.lag`),
            saved as ``offpod``; or ``None`` (no copy while running).
    """

    def __init__(self, run_dir: Path, batch_id: str, total: int, mirror: Any = None, offpod: Any = None):
        self.path = run_dir / PROGRESS
        self.batch_id = batch_id
        self.total = total
        self.done = self.accepted = self.rejected = 0
        self.processed = self.processed_tokens = self.retries = 0
        self.last_error: str | None = None
        self.actors: list[dict[str, Any]] = []
        self.state = "starting"
        self.started_at = utc_now()
        self._t0 = time.monotonic()
        self._first: tuple[float, int, int] | None = None  # (time, docs, tokens) when this attempt's first shard landed
        self._last_at = 0.0
        self._saved_at = 0.0
        self.saves = 0
        self.previous_actors: list[dict[str, Any]] = []
        self.lease: dict[str, Any] | None = None  # the latest lease verdict (batch.lease.clock.LeaseWatch)
        self.mirror = mirror
        self._identity = process_identity()
        self.offpod = offpod
        old = ProgressFile.read_or_none(self.path)
        if old is not None and old.host == socket.gethostname() and old.state in ("running", "starting"):
            self.previous_actors = old.actors or []

    def start(self, done_shards: dict[int, dict[str, int]]) -> None:
        """Count the shards an earlier attempt completed and save ``running``.

        Args:
            done_shards: ``{index: {"docs", "accepted", "rejected"}}`` (:func:`batch.layout.scan_done`).
        """
        for counts in done_shards.values():
            self.done += counts["docs"]
            self.accepted += counts["accepted"]
            self.rejected += counts["rejected"]
        self.state = "running"
        self._t0 = time.monotonic()
        self.save()

    def shard_counted(self, n_docs: int, accepted: int, rejected: int, n_tokens: int) -> None:
        """Count a shard completed in this attempt from the counts its actor made (tokens are prompt tokens); save
        when the last save is :data:`SAVE_EVERY_S` old."""
        self.done += n_docs
        self.accepted += accepted
        self.rejected += rejected
        self.processed += n_docs
        self.processed_tokens += n_tokens
        self._last_at = time.monotonic()
        if self._first is None:
            self._first = (self._last_at, self.processed, self.processed_tokens)
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def update(self, **fields: Any) -> None:
        """Set attributes (``last_error``, ``actors``, ``retries``) and save."""
        for key, value in fields.items():
            setattr(self, key, value)
        self.save()

    def finish(self) -> None:
        """Save state ``done``."""
        self.state = "done"
        self.save()

    def fail(self, error: str) -> None:
        """Save state ``failed`` with the error."""
        self.state, self.last_error = "failed", error[:2000]
        self.save()

    def rate(self) -> float:
        """Documents per second of this attempt so far (0.0 before the first shard)."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        return self.processed / elapsed if self.processed else 0.0

    def steady(self) -> tuple[float, float] | None:
        """The steady rate: ``(docs/s, prompt tokens/s)`` from this attempt's first complete shard to its latest.

        The engines' start (model load, warm-up, compilation) and the first shard are left out: what a
        lease is sized by. ``None`` until a second shard completes after the first.
        """
        if self._first is None or self._last_at <= self._first[0] or self.processed <= self._first[1]:
            return None
        seconds = self._last_at - self._first[0]
        return (self.processed - self._first[1]) / seconds, (self.processed_tokens - self._first[2]) / seconds

    def lease_rate(self) -> float:
        """The docs/s the lease clock and the ETA use: :meth:`steady` once known, else :meth:`rate`."""
        steady = self.steady()
        return steady[0] if steady else self.rate()

    def save(self) -> None:
        """Write ``progress.json`` atomically: done/total, rejected, docs/s (and the steady docs/s and tokens/s after
        the first shard), ETA (at the steady rate once known) and lease verdict of this attempt."""
        self._saved_at = time.monotonic()
        self.saves += 1
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate, steady, eta_rate = self.rate(), self.steady(), self.lease_rate()
        left = self.total - self.done
        ProgressFile(
            batch_id=self.batch_id, state=self.state, total=self.total, done=self.done,
            accepted=self.accepted, rejected=self.rejected, processed_this_attempt=self.processed,
            docs_per_s=round(rate, 3), eta_s=round(left / eta_rate, 1) if eta_rate and left else (0.0 if not left else None),
            steady_docs_per_s=round(steady[0], 3) if steady else None,
            steady_tokens_per_s=round(steady[1], 1) if steady else None,
            elapsed_s=round(elapsed, 1), retries=self.retries, last_error=self.last_error,
            actors=self.actors, **self._identity,
            started_at=self.started_at, updated_at=utc_now(), lease=self.lease,
            offpod=self.offpod() if self.offpod is not None else None,
        ).write(self.path)
        if self.mirror is not None:
            self.mirror.offer(self.path, final=self.state in ("done", "failed"))


BAR_FORMAT = "{desc}: {whole_percent:3d}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{steady}{postfix}]"
"""tqdm's default layout with ``rate_noinv_fmt`` (always docs/s: the default turns a rate below 1 into s/doc),
``steady`` (:class:`Bar`): the rate after the first shard, which the overall rate (engine start included) is not,
and ``whole_percent``: the percentage rounded down, so 333/334 reads 99% and only the end reads 100%."""


class Bar(tqdm):
    """tqdm with a ``{steady}`` field: ``", steady 4.16 docs/s 820 tokens/s"`` once :meth:`Progress.steady` is known."""

    steady_text = ""

    def show_steady(self, steady: tuple[float, float] | None) -> None:
        """Show ``(docs/s, tokens/s)`` (:meth:`Progress.steady`) from the next redraw on; ``None`` shows nothing."""
        self.steady_text = f", steady {steady[0]:.2f} docs/s {steady[1]:.0f} tokens/s" if steady else ""

    @property
    def format_dict(self) -> dict[str, Any]:
        d = super().format_dict
        whole = 100 * d["n"] // d["total"] if d.get("total") else 0
        return {**d, "steady": self.steady_text, "whole_percent": int(whole)}


def progress_bar(total: int, initial: int, desc: str, disable: bool = False, file: Any = None) -> Bar:
    """The batch progress bar: documents done of ``total``, rate always in docs/s.

    Args:
        total: distinct documents in the corpus.
        initial: documents already done (a resumed batch).
        desc: the label, e.g. ``"batch <id>"``.
        disable: no bar at all (``--no-progress``).
        file: where to draw it (default stderr).

    Returns:
        A started ``tqdm`` bar.
    """
    return Bar(total=total, initial=initial, unit="docs", desc=desc, disable=disable, dynamic_ncols=True,
               bar_format=BAR_FORMAT, file=file)


def logging_redirect() -> Any:
    """Keep log lines from tearing the progress bar (tqdm's logging redirect)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


@contextlib.contextmanager
def closing_on_error(bar: Any) -> Iterator[None]:
    """Close ``bar`` when the block raises (Ctrl-C, SIGTERM, a failure), so that the bar's line ends and the
    error message that follows starts on a line of its own; then re-raise."""
    try:
        yield
    except BaseException:
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - the terminal may be gone: the error matters, not the bar
            pass
        raise

