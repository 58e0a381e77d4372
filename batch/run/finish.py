"""Private: the end of a batch whose work is done here, under the store's deadline.

Once the shards are merged and ``summary.json`` is written, what is left is the copy off the pod: the shards
still queued (:class:`batch.run.offpod.ShardUploader`), the final export and its re-check. Each store call has its
own deadline and retry budget (:func:`classify.runs.storage.store_limits`), but a store that stalls makes many such
calls in a row. :func:`off_pod_within` runs them in a background thread and waits for them at most
:func:`classify.runs.storage.store_deadline_s` seconds in all, saying every :data:`LOG_EVERY_S` seconds what it waits
for; past the deadline it raises :class:`classify.errors.OffPodPending` (exit 9, "done here, not yet off the pod").
The main thread only waits with a timeout, so SIGTERM and Ctrl-C stop it within a second whatever the store does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from classify.errors import OffPodPending, StoreUnreachable
from classify.runs import storage

log = logging.getLogger("docpilot.batch")

T = TypeVar("T")

LOG_EVERY_S = 30.0
"""Seconds between two "waiting for the store" log lines."""


class Stage:
    """What the off-pod work is doing now, for the waiting lines (set by the work, read by the waiter)."""

    def __init__(self) -> None:
        self.now = "starting"

    def __call__(self, what: str) -> None:
        self.now = what


def off_pod_within(work: Callable[[Stage], T], *, batch_id: str, run_dir: Any, dest: Any,
                   deadline_s: float | None = None) -> T:
    """Run ``work`` (the copy off the pod of a batch done here) and wait for it at most ``deadline_s`` seconds.

    Args:
        work: the copy; called in a daemon thread with a :class:`Stage` it sets as it goes.
        batch_id, run_dir, dest: named in the waiting lines and the message.
        deadline_s: seconds to wait in all (default :func:`classify.runs.storage.store_deadline_s`).

    Returns:
        What ``work`` returned.

    Raises:
        OffPodPending: ``work`` did not end within the deadline (it is left running in its daemon thread; the
            process exits without it), or the store did not answer one of its calls (``StoreUnreachable``). The
            message says the work is done here and what the copy was doing.
        Exception: what ``work`` raised.
    """
    deadline_s = storage.store_deadline_s() if deadline_s is None else deadline_s
    stage = Stage()
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = work(stage)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            out["error"] = err

    thread = threading.Thread(target=target, name="off-pod-finish", daemon=True)
    t0 = time.monotonic()
    log.info("batch %s: done here; copying it off the pod to %s (at most %g s: DOCPILOT_STORE_DEADLINE_S)", batch_id,
             _label(dest), deadline_s)
    thread.start()
    next_line = t0 + min(LOG_EVERY_S, deadline_s)
    while True:
        thread.join(0.5)  # short waits: a signal handler runs between them
        if not thread.is_alive():
            break
        now = time.monotonic()
        if now - t0 >= deadline_s:
            raise OffPodPending(
                f"batch {batch_id}: done here, not yet off the pod: every shard is classified and merged in {run_dir}, "
                f"but the copy to {_label(dest)} did not finish within {deadline_s:g} s (DOCPILOT_STORE_DEADLINE_S; "
                f"it was at: {stage.now}). Nothing is lost; keep this pod until the copy is made")
        if now >= next_line:
            log.warning("batch %s: done here; waiting for the store: %s (%.0f of %.0f s, DOCPILOT_STORE_DEADLINE_S)",
                        batch_id, stage.now, now - t0, deadline_s)
            next_line = now + LOG_EVERY_S
    err = out.get("error")
    if isinstance(err, StoreUnreachable):  # the store is down: the same state as a deadline run out
        raise OffPodPending(f"batch {batch_id}: done here, not yet off the pod: every shard is classified and merged in "
                            f"{run_dir}, but the copy to {_label(dest)} failed at: {stage.now} ({err}). Nothing is "
                            "lost; keep this pod until the copy is made") from err
    if err is not None:
        raise err
    return out["value"]


def _label(dest: Any) -> str:
    return str(dest).split("?", 1)[0]
