"""Private: every complete shard copied off the pod as it completes, and a run folder rebuilt from that copy.

With an object-storage export location (``s3://...``, any fsspec URL), the batch's export folder
``D = <export root>/<batch-id>/`` is filled while the batch runs, by one background thread
(:class:`ShardUploader`), never by the pool's own thread::

    D/manifest.json              the run's manifest (its shard plan), copied before any shard and again at the end
    D/shards/GGG/NNNNNN.jsonl    each complete shard, one PUT (an object store shows it whole or not at all)
    D/offpod.sha256              ``<sha256>  <path>`` of every shard copied so far, rewritten after the shards it lists
    D/SHA256SUMS                 written last, by the final export (:func:`classify.runs.export.export_run`)

So ``D`` always holds a consistent prefix of the batch: a shard listed in ``offpod.sha256`` is there, whole,
with that hash. The same ledger is kept in the run folder (``offpod.sha256``, written after the copy it
records), so the final export lists it and sends again only what is not there yet. A store that is slow or
down slows only the copy: failed rounds are retried with a growing pause, and the lag (shards waiting,
the oldest one's age) is in ``progress.json`` (``offpod``) and on the progress line.

:func:`restore_run` is the other half: ``docpilot batch --resume-from D`` on a new machine reads the copied
manifest and ledger, downloads each listed shard, checks its sha256 and its ids against the plan, and
writes them into a fresh run folder; the batch then resumes there exactly as a local resume does.

Every store call of both halves goes through :mod:`classify.runs.storage`: the filesystem it configures (each request's
deadline, botocore's retry budget) and :func:`classify.runs.storage.store_call`, so a store that stops answering fails a
call in bounded time as one :class:`classify.errors.StoreUnreachable` naming it. In the uploader that is one failed
round (retried later, shown in the lag), never a wait of the pool's thread.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from batch import layout as mf
from batch.lease.clock import eta_text
from batch.run.owner import HEARTBEAT_EVERY_S, ExportOwner
from batch.runfiles import Manifest
from classify.errors import DocpilotError, InputError, VerificationError
from classify.runs import storage
from classify.runs.export import SHA256SUMS, sums_text
from classify.runs.records import write_bytes_atomic
from classify.usercommand import user_flag

log = logging.getLogger("docpilot.batch")

LEDGER = "offpod.sha256"
"""The ledger of shards copied off the pod (``sha256sum -c`` format), at the export location and in the run folder."""

ROUND_MAX_SHARDS = 64
"""Most shards copied before the ledger is rewritten (so the ledger never lags far behind the copies)."""

RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0
"""Pause after a failed round of copies: doubles from :data:`RETRY_FIRST_S` up to :data:`RETRY_MAX_S` seconds."""

_SHARD_REL = re.compile(r"^shards/(\d{3})/(\d{6})\.jsonl$")


def shard_rel(index: int) -> str:
    """The POSIX path of shard ``index`` inside a run folder or its copy: ``shards/GGG/NNNNNN.jsonl``."""
    return mf.shard_path(Path("."), index).as_posix()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_remote_ledger(dest: str) -> dict[str, str]:
    """The shards a copy at ``dest`` holds, ``{relative path: sha256 hex}`` (empty when it has no ledger yet).

    Raises:
        StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
        OSError, ImportError: the store cannot be read (anything but a missing ledger).
    """
    data = _read_fresh(dest, LEDGER)
    return {} if data is None else _parse_ledger(data)


def _read_fresh(dest: str, name: str) -> bytes | None:
    """The bytes of ``dest/name`` read past fsspec's listing cache, or None when the store has no such file.

    Raises:
        StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
    """
    fs, root = storage.filesystem(dest)
    fs.invalidate_cache()
    try:
        with storage.store_call("read", f"{dest}/{name}"):
            return fs.cat_file(f"{root}/{name}")
    except FileNotFoundError:
        return None


def _parse_ledger(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in data.decode("utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        if rel:
            out[rel] = digest
    return out


class ShardUploader:
    """Copies each complete shard of a running batch to its export location, in a background thread.

    Args:
        run_dir: the batch's run folder (shards are read from it as the driver wrote them).
        dest: the export folder URL ``<export root>/<batch-id>``.
        shards_total: planned shards (shown beside the count copied).

    Attributes:
        copied: ``{relative path: sha256}`` of the shards confirmed at ``dest`` (the ledger's content).
        errors: failed copy rounds so far; last_error: the latest failure's text.
    """

    def __init__(self, run_dir: Path, dest: str, shards_total: int, owner: ExportOwner | None = None):
        self.run_dir, self.dest, self.shards_total, self.owner = run_dir, dest, shards_total, owner
        self.copied: dict[str, str] = {}
        self.copied_bytes = 0
        self.errors = 0
        self.last_error: str | None = None
        self.refused: DocpilotError | None = None
        self.claim_settled = threading.Event()
        self._pending: dict[int, float] = {}  # shard index -> time.monotonic() it was queued
        self._manifest_dirty = False
        self._stop = False
        self._go = False  # start() was called: the run folder's manifest and shards may be copied
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def claim(self, wait_s: float) -> None:
        """Start the thread, which claims the export location first (:mod:`batch.run.owner`); wait for the answer up
        to ``wait_s`` seconds. A store that does not answer in that time delays only the thread: nothing is copied
        before the claim holds, and a refusal that comes later stops the batch at its next shard.

        Raises:
            InputError: another driver owns the export location (nothing was written there).
        """
        self._begin()
        if not self.claim_settled.wait(wait_s):
            log.warning("off the pod: %s has not answered the claim of the export location within %g s; the pool "
                        "starts, nothing is copied there before the claim holds", _label(self.dest), wait_s)
        self.raise_if_refused()

    def start(self, done: list[int]) -> None:
        """Queue the manifest and every complete shard, and let the thread copy; returns at once (no store call here).

        The thread reads what is already there (its ledger) first and drops the shards it holds with the same sha256
        from the queue. A store that does not answer delays only the thread.

        Args:
            done: indexes of the shards complete in the run folder (an earlier attempt's too).
        """
        now = time.monotonic()
        with self._cond:
            for index in done:
                self._pending[index] = now
            self._manifest_dirty = True
            self._go = True
            self._cond.notify_all()
        self._begin()

    def _begin(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shard-uploader", daemon=True)
            self._thread.start()

    def raise_if_refused(self) -> None:
        """Raise the refusal of the claim (or its loss to a take-over), if any.

        Raises:
            InputError: another driver owns the export location.
        """
        if self.refused is not None:
            raise self.refused
        if self.owner is not None and self.owner.lost:
            raise InputError(self.owner.lost)

    def _prepare(self) -> bool:
        """Claim the location (retried while the store does not answer), then skip the shards already there.

        Returns:
            Whether the thread may go on writing (False: refused, or stopped before the claim held).
        """
        pause = RETRY_FIRST_S
        while self.owner is not None and not self.owner.held:
            try:
                self.owner.claim()
            except InputError as err:  # another driver's: refused, for good
                self.refused = err
                self.claim_settled.set()
                return False
            except Exception as err:  # noqa: BLE001 - a store that does not answer (or refuses access): tried again
                with self._cond:
                    self.errors += 1
                    self.last_error = f"{type(err).__name__}: {err}"[:500]
                log.warning("off the pod: cannot claim %s yet (%s); retried in %.0f s, nothing is copied meanwhile",
                            _label(self.dest), self.last_error, pause)
                with self._cond:
                    if self._cond.wait_for(lambda: self._stop, timeout=pause):
                        self.claim_settled.set()
                        return False
                pause = min(pause * 2, RETRY_MAX_S)
        self.claim_settled.set()
        with self._cond:
            self._cond.wait_for(lambda: self._go or self._stop)
            if not self._go:
                return False
        try:
            if storage.exists(self.dest, SHA256SUMS):  # a finished export is never written again (re-checked at the end)
                log.info("off the pod: %s holds a complete export already; nothing is copied there", _label(self.dest))
                return False
        except Exception as err:  # noqa: BLE001 - the ledger read below meets the same store
            log.warning("off the pod: cannot look up %s/%s: %s", _label(self.dest), SHA256SUMS, err)
        try:
            there = read_remote_ledger(self.dest)
        except Exception as err:  # noqa: BLE001 - a store down at start: copy everything again (same bytes)
            log.warning("off the pod: cannot read %s/%s (%s: %s); every complete shard will be copied",
                        _label(self.dest), LEDGER, type(err).__name__, err)
            there = {}
        with self._cond:
            for index in sorted(self._pending):
                rel = shard_rel(index)
                path = self.run_dir / rel
                if rel in there and path.is_file() and _sha256(path) == there[rel]:
                    self.copied[rel] = there[rel]
                    self.copied_bytes += path.stat().st_size
                    del self._pending[index]
            log.info("off the pod: %d shards already at %s, %d to copy", len(self.copied), _label(self.dest),
                     len(self._pending))
        return True

    def _run(self) -> None:
        if self._prepare():
            self._loop()

    def shard_written(self, index: int) -> None:
        """Queue shard ``index`` (just written, complete) for copying; returns at once."""
        with self._cond:
            self._pending.setdefault(index, time.monotonic())
            self._cond.notify()

    def manifest_written(self) -> None:
        """Queue the run folder's ``manifest.json`` (just rewritten) for copying; returns at once."""
        with self._cond:
            self._manifest_dirty = True
            self._cond.notify()

    def lag(self) -> dict[str, Any]:
        """The copy's state for ``progress.json`` and the progress line.

        Returns:
            ``{dest, shards_copied, shards_total, shards_pending, oldest_pending_s, copied_bytes, errors, last_error}``;
            ``oldest_pending_s`` is the age in seconds of the oldest shard not yet copied (``0.0`` when none waits).
        """
        with self._cond:
            oldest = min(self._pending.values(), default=None)
            return {"dest": _label(self.dest), "shards_copied": len(self.copied), "shards_total": self.shards_total,
                    "shards_pending": len(self._pending),
                    "oldest_pending_s": round(time.monotonic() - oldest, 1) if oldest is not None else 0.0,
                    "copied_bytes": self.copied_bytes, "errors": self.errors, "last_error": self.last_error}

    def close(self, wait_s: float | None = 600.0) -> bool:
        """Copy what is queued (one more try after a failure), then stop the thread.

        Args:
            wait_s: most seconds to wait for the thread (``None``: until it ends, for a caller with its own deadline).

        Returns:
            Whether every queued shard was copied (``False``: the final export sends the rest).
        """
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():
                log.warning("off the pod: the copy to %s did not finish within %.0f s; the export sends the rest",
                            _label(self.dest), wait_s)
        with self._cond:
            return not self._pending and not self._manifest_dirty

    def _loop(self) -> None:
        pause = RETRY_FIRST_S
        beat = time.monotonic()
        while True:
            with self._cond:
                while not self._pending and not self._manifest_dirty and not self._stop:
                    if self.owner is not None and time.monotonic() - beat >= HEARTBEAT_EVERY_S:
                        break
                    self._cond.wait(timeout=HEARTBEAT_EVERY_S if self.owner is not None else None)
                idle = not self._pending and not self._manifest_dirty
                if idle and self._stop:
                    return  # stopped with nothing left
                batch = sorted(self._pending)[:ROUND_MAX_SHARDS]
                manifest, self._manifest_dirty = self._manifest_dirty, False
                stopping = self._stop
            try:
                if self.owner is not None and (idle or time.monotonic() - beat >= HEARTBEAT_EVERY_S):
                    beat = time.monotonic()
                    self.owner.heartbeat()  # checks the record is still ours first
                if self.owner is not None and not self.owner.held:
                    return  # taken over: nothing more is written (the driver raises it at the next shard)
                if not idle:
                    self._round(batch, manifest)
                pause = RETRY_FIRST_S
            except Exception as err:  # noqa: BLE001 - a store outage must never stop the batch; it is logged
                with self._cond:
                    self._manifest_dirty = self._manifest_dirty or manifest
                    self.errors += 1
                    self.last_error = f"{type(err).__name__}: {err}"[:500]
                    first = self.errors == 1
                if first or self.errors % 10 == 0:
                    log.warning("off the pod: copying to %s failed (%d failures so far): %s; the batch goes on, "
                                "the copy is retried", _label(self.dest), self.errors, self.last_error)
                if stopping:
                    return  # the final export sends what is left
                with self._cond:
                    self._cond.wait_for(lambda: self._stop, timeout=pause)
                pause = min(pause * 2, RETRY_MAX_S)

    def _round(self, batch: list[int], manifest: bool) -> None:
        """Copy the manifest (when changed), then the shards of ``batch``, then the ledger that lists them."""
        fs, root = storage.filesystem(self.dest)  # the store's deadlines and retry budget (classify.runs.storage)
        if manifest:
            with storage.store_call("upload", f"{self.dest}/{mf.MANIFEST}"):
                fs.put_file(str(self.run_dir / mf.MANIFEST), f"{root}/{mf.MANIFEST}")
        sent: dict[str, tuple[str, int]] = {}
        for index in batch:
            rel = shard_rel(index)
            path = self.run_dir / rel
            digest = _sha256(path)
            with storage.store_call("upload", f"{self.dest}/{rel}"):
                fs.put_file(str(path), f"{root}/{rel}")
            sent[rel] = (digest, path.stat().st_size)
        if sent:
            ledger = dict(self.copied)
            ledger.update({rel: d for rel, (d, _) in sent.items()})
            data = sums_text(dict(sorted(ledger.items())))
            with storage.store_call("upload", f"{self.dest}/{LEDGER}"):
                fs.pipe_file(f"{root}/{LEDGER}", data)  # after the shards it lists
            write_bytes_atomic(self.run_dir / LEDGER, data)
        fs.invalidate_cache()
        with self._cond:
            for index in batch:
                self._pending.pop(index, None)
            for rel, (digest, size) in sent.items():
                if rel not in self.copied:
                    self.copied_bytes += size
                self.copied[rel] = digest


def offpod_short(lag: dict[str, Any], lease: dict[str, Any] | None = None) -> str:
    """The progress line's postfix: ``off pod 12/40 shards, 2 waiting (oldest 35s)`` after the lease verdict, if any."""
    text = f"off pod {lag['shards_copied']}/{lag['shards_total']} shards"
    if lag["shards_pending"]:
        text += f", {lag['shards_pending']} waiting (oldest {eta_text(lag['oldest_pending_s'])})"
    if lag["errors"]:
        text += f", {lag['errors']} failed copies"
    short = (lease or {}).get("short")
    return f"{short}, {text}" if short else text


def _label(dest: str) -> str:
    return str(dest).split("?", 1)[0]


def resume_location(url: str) -> tuple[str, str]:
    """Split ``--resume-from <export root>/<batch-id>`` into ``(export root, batch id)``.

    Raises:
        InputError: not an object-storage URL, or no batch id at its end.
    """
    if not storage.is_url(url):
        raise InputError(f"--resume-from must be the object-storage copy of a batch, <export root>/<batch-id> "
                         f"(s3://bucket/exports/<batch-id>, ...), got {url!r}; a run folder on this machine is "
                         "resumed with --batch-id")
    text = url.rstrip("/")
    root, _, batch_id = text.rpartition("/")
    if not batch_id or "://" not in root or root.endswith(":/"):
        raise InputError(f"--resume-from must end with the batch id (<export root>/<batch-id>), got {url!r}")
    return root, batch_id


def restore_run(dest: str, run_dir: Path) -> tuple[Manifest, int]:
    """Rebuild a run folder from its off-pod copy: the manifest and every shard the copy's ledger lists.

    Each shard is downloaded beside its place, its sha256 compared with the ledger, then renamed into place;
    the manifest is written last, after :func:`batch.layout.scan_done` checked every restored shard's ids
    against the plan. The batch then resumes in ``run_dir`` like a local resume (the caller's checks of
    corpus, config, model and adapter against the manifest apply unchanged).

    Args:
        dest: the copy, ``<export root>/<batch-id>`` (a URL).
        run_dir: the new run folder (empty: it must hold no manifest).

    Returns:
        ``(manifest, shards restored)``.

    Raises:
        InputError: no manifest at ``dest`` (nothing of this batch was copied), or a damaged one.
        VerificationError: a listed shard missing at ``dest``, with another sha256 than its ledger line, not in the
            plan, or holding other ids than planned (names the shard; nothing is resumed).
        StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits` (exit 6; nothing is
            resumed, the command can be run again).
    """
    if (run_dir / mf.MANIFEST).exists():
        raise InputError(f"{run_dir} already holds a batch; resume it with {user_flag('--batch-id', run_dir.name)} "
                         f"(without {user_flag('--resume-from', '...')}), or give another "
                         "DOCPILOT_RUNS folder")
    manifest_bytes = _read_fresh(dest, mf.MANIFEST)
    fs, root = storage.filesystem(dest)
    if manifest_bytes is None:
        raise InputError(f"no {mf.MANIFEST} at {_label(dest)}: nothing of this batch was copied there (check the "
                         "export location and the batch id)")
    staging = run_dir / f".{mf.MANIFEST}.resume"
    write_bytes_atomic(staging, manifest_bytes)
    try:
        manifest = Manifest.read(staging)
    finally:
        staging.unlink(missing_ok=True)
    assert manifest is not None
    ledger = read_remote_ledger(dest)
    planned = {s.index for s in manifest.shards}
    for rel, digest in ledger.items():
        match = _SHARD_REL.match(rel)
        if match is None or int(match.group(2)) not in planned:
            raise VerificationError(f"{_label(dest)}/{LEDGER} lists {rel!r}, not a shard of this batch's plan "
                                    f"({len(planned)} shards); the copy is not this batch's")
        target = run_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.resume.tmp")
        try:
            with storage.store_call("read", f"{dest}/{rel}"):
                fs.get_file(f"{root}/{rel}", str(tmp))
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise VerificationError(f"{_label(dest)}/{rel} is listed in {LEDGER} but missing from the copy") from None
        except BaseException:  # a store that stopped answering (StoreUnreachable): no half file left behind
            tmp.unlink(missing_ok=True)
            raise
        got = _sha256(tmp)
        if got != digest:
            tmp.unlink(missing_ok=True)
            raise VerificationError(f"{_label(dest)}/{rel}: sha256 {got[:12]}... != {LEDGER} {digest[:12]}...; "
                                    "the copy is damaged")
        tmp.rename(target)
    mf.scan_done(run_dir, manifest)  # each restored shard's ids against the plan
    write_bytes_atomic(run_dir / LEDGER, sums_text(dict(sorted(ledger.items()))))
    mf.write_manifest(run_dir, manifest)
    return manifest, len(ledger)
