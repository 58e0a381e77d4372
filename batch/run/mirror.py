"""Private: a running batch's ``progress.json`` mirrored to its export location, so it is readable off the pod.

The mirror is ``<export root>/<batch-id>.progress.json`` (:func:`mirror_target`), beside the export
copy ``<export root>/<batch-id>/`` (which must not exist before the export: a local export is renamed
into place whole). It is rewritten at most every :data:`MIRROR_EVERY_S` seconds and always when the
batch ends (``done`` or ``failed``), by a background thread, so a slow or unreachable store never
holds up the driver; a failed write is logged and the batch goes on. Each write replaces the whole
file (a local atomic rename, or one object PUT). ``docpilot status --from <export root>/<batch-id>``
reads it (:func:`batch.lot.status.remote_status`).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from classify.runs import storage
from classify.runs.records import write_bytes_atomic
from classify.runs.storage import Dest

log = logging.getLogger("docpilot.batch")

MIRROR_EVERY_S = 60.0
"""Least seconds between two mirrored copies of ``progress.json`` while the batch runs (tests shorten it)."""

MIRROR_SUFFIX = ".progress.json"


def mirror_target(export_root: Dest, batch_id: str) -> Dest:
    """Where a batch's progress is mirrored: ``<export_root>/<batch_id>.progress.json`` (a path or a URL)."""
    return storage.join(export_root, f"{batch_id}{MIRROR_SUFFIX}")


def progress_mirror(export_root: str | None, batch_id: str) -> ProgressMirror | None:
    """The mirror of a batch's progress when an export location is set (``--export-dir`` / ``batch.export_dir``).

    Args:
        export_root: the export location set by the user (folder or URL), or ``None`` (the default
            ``exports/`` is on the pod itself: nothing is mirrored).
        batch_id: the batch.

    Returns:
        A :class:`ProgressMirror`, or ``None``.
    """
    return ProgressMirror(mirror_target(storage.as_dest(export_root), batch_id)) if export_root else None


def write_mirror(target: Dest, data: bytes) -> None:
    """Replace the mirror at ``target`` with ``data`` (local: atomic rename; object storage: one PUT).

    Raises:
        OSError, ImportError: the destination cannot be written.
    """
    if isinstance(target, Path):
        write_bytes_atomic(target, data)
        return
    fs, path = storage.filesystem(target)
    with storage.store_call("write", target):  # a stalled store ends in storage.store_limits(), not never
        fs.pipe_file(path, data)
    fs.invalidate_cache()


class ProgressMirror:
    """Copies ``progress.json`` to :func:`mirror_target` at most every ``every_s`` seconds, and at the end.

    Args:
        target: the mirror's path or URL.
        every_s: least seconds between two copies while running (default :data:`MIRROR_EVERY_S`, read at
            construction).

    Attributes:
        writes: copies written so far; errors: copies that failed.
    """

    def __init__(self, target: Dest, every_s: float | None = None, final_wait_s: float | None = None):
        self.target = target
        self.every_s = MIRROR_EVERY_S if every_s is None else every_s
        self.final_wait_s = final_wait_s
        self.gate: Any = None  # a callable: while it returns False nothing is written (the export's claim, batch.run.owner)
        self.writes = self.errors = 0
        self._last: float | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def offer(self, local: Path, final: bool = False) -> None:
        """Mirror the file at ``local`` now if ``every_s`` has passed since the last copy (always if ``final``).

        A running copy is not waited for (the next offer after it copies the newer state) unless ``final``:
        the final state is written synchronously, after any copy in flight, so it is the one that stays.

        Args:
            local: the run folder's ``progress.json``, just rewritten.
            final: the batch ended (``done`` / ``failed``).
        """
        now = time.monotonic()
        if not final and self._last is not None and now - self._last < self.every_s:
            return
        if self.gate is not None and not self.gate():
            return  # the export location is not this driver's (yet): its mirror is not written either
        try:
            data = local.read_bytes()
        except OSError as err:
            log.warning("progress mirror: cannot read %s: %s", local, err)
            return
        if final:  # after any copy in flight; waited for up to final_wait_s (None: until it ends)
            previous = self._thread
            self._last = now
            self._thread = threading.Thread(target=self._write_after, args=(previous, data), name="progress-mirror",
                                            daemon=True)
            self._thread.start()
            self._thread.join(self.final_wait_s)
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._last = now
        self._thread = threading.Thread(target=self._write, args=(data,), name="progress-mirror", daemon=True)
        self._thread.start()

    def wait(self, wait_s: float | None = None) -> bool:
        """Wait up to ``wait_s`` seconds (``None``: no bound) for the copy in flight; returns whether none is left."""
        thread = self._thread
        if thread is not None:
            thread.join(wait_s)
            return not thread.is_alive()
        return True

    def _write_after(self, previous: threading.Thread | None, data: bytes) -> None:
        if previous is not None:
            previous.join()
        self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            write_mirror(self.target, data)
            with self._lock:
                self.writes += 1
        except Exception as err:  # noqa: BLE001 - a store outage must never stop the batch; it is logged
            with self._lock:
                self.errors += 1
                first = self.errors == 1
            if first or self.errors % 10 == 0:
                log.warning("progress mirror: could not write %s (%d failures so far): %s: %s; the batch goes on",
                            storage_label(self.target), self.errors, type(err).__name__, err)


def storage_label(target: Dest) -> str:
    """The mirror's location for messages (a URL's query part, which may hold a token, removed)."""
    return str(target).split("?", 1)[0]
