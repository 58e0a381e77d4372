"""Private: one writer per export location, claimed in the object store itself.

A batch with an object-storage export location writes ``<export root>/<batch-id>/`` while it runs
(:mod:`batch.run.offpod`) and at its end (the final export). Two drivers writing there (two pods resuming
the same copy, or one batch id started on two pods) leave a copy that matches neither, so before its first
write a driver claims the location with an owner record beside the copy::

    <export root>/<batch-id>.owner.json   {"batch_id", "host", "pid", "run_dir", "token", "claimed_at",
                                           "heartbeat_at", "heartbeat_every_s", "stale_after_s", "state"}

The record is created with a conditional PUT (``If-None-Match: *``): of two drivers that claim at once, the
store lets one create it and answers the other ``412 Precondition Failed``. A driver that finds a record is
refused before it writes anything, with a message naming the owner, except in two cases:

* the record is its own run folder's (same host and run folder: the driver lock it holds says the earlier
  driver is gone), taken back at once;
* ``--take-over-export`` was given and the owner's heartbeat is older than its ``stale_after_s`` (the pod is
  gone): the record is replaced, and the replacement read back.

The owner refreshes ``heartbeat_at`` every :data:`HEARTBEAT_EVERY_S` seconds while it runs; each refresh first
reads the record, and a record that names another run (taken over) stops every later write of this driver
(:attr:`ExportOwner.lost`). A finished export keeps its record (``state: "exported"``): the copy is final and is
never taken over. A failed or stopped attempt removes it (best effort), so a resume elsewhere needs no take-over;
one that ended "done here, not yet off the pod" (exit 9) keeps it: this pod's run folder finishes the copy.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batch.lease.clock import eta_text
from classify.errors import InputError
from classify.runs import storage
from classify.usercommand import user_flag

log = logging.getLogger("docpilot.batch")

OWNER_SUFFIX = ".owner.json"
HEARTBEAT_EVERY_S = 30.0
"""Seconds between two refreshes of the owner's heartbeat while its batch runs."""
STALE_AFTER_S = 600.0
"""Seconds after its last heartbeat when an owner counts as gone, for ``--take-over-export`` (twenty missed beats: a
store that is slow for a while does not make a live owner look gone)."""


def owner_target(dest: str) -> str:
    """The owner record of the copy ``dest`` (``<export root>/<batch-id>``): ``<export root>/<batch-id>.owner.json``."""
    return f"{dest.rstrip('/')}{OWNER_SUFFIX}"


def read_owner(dest: str) -> dict[str, Any] | None:
    """The owner record of ``dest``, or ``None`` when there is none (or it is not a JSON object).

    Raises:
        StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
    """
    return _read(dest)[0]


def _read(dest: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, etag)`` of the owner record (``(None, None)`` when there is none). The ETag is read first, so a
    write conditional on it fails if the record changed after it, whatever version the body read returned."""
    target = owner_target(dest)
    fs, path = storage.filesystem(target)
    fs.invalidate_cache()
    try:
        with storage.store_call("read", target):
            etag = fs.info(path).get("ETag")
            data = fs.cat_file(path)
    except FileNotFoundError:
        return None, None
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}, etag
    return (record if isinstance(record, dict) else {}), etag


def heartbeat_age_s(record: dict[str, Any], now: dt.datetime | None = None) -> float | None:
    """Seconds since the record's last heartbeat, or ``None`` when it has no readable one."""
    try:
        beat = dt.datetime.fromisoformat(str(record.get("heartbeat_at")))
    except ValueError:
        return None
    return ((now or dt.datetime.now(dt.UTC)) - beat).total_seconds()


def describe_owner(record: dict[str, Any]) -> str:
    """``batch B on host H (pid P, run folder R), claimed T, last heartbeat 1m05s ago`` for messages."""
    age = heartbeat_age_s(record)
    beat = f"last heartbeat {eta_text(max(age, 0))} ago" if age is not None else "no readable heartbeat"
    state = ", its export finished" if record.get("state") == "exported" else ""
    return (f"batch {record.get('batch_id')} on host {record.get('host')} (pid {record.get('pid')}, run folder "
            f"{record.get('run_dir')}), claimed {record.get('claimed_at')}, {beat}{state}")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ExportOwner:
    """This driver's claim on one export location (a URL), its heartbeat and its release.

    Args:
        dest: the copy, ``<export root>/<batch-id>`` (a URL).
        batch_id: the batch.
        run_dir: this driver's run folder (with the host, what makes a record this run folder's own).
        take_over: replace an owner whose heartbeat is stale (``--take-over-export``).

    Attributes:
        held: the claim succeeded and was not lost since.
        lost: another driver's record replaced this one's (every later write must stop).
    """

    def __init__(self, dest: str, batch_id: str, run_dir: Path, take_over: bool = False):
        self.dest, self.batch_id, self.run_dir, self.take_over = dest.rstrip("/"), batch_id, run_dir, take_over
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.held = False
        self.lost: str | None = None
        self._record = {"batch_id": batch_id, "host": self.host, "pid": os.getpid(), "run_dir": str(run_dir.resolve()),
                        "token": self.token, "claimed_at": _now(), "heartbeat_at": _now(),
                        "heartbeat_every_s": HEARTBEAT_EVERY_S, "stale_after_s": STALE_AFTER_S, "state": "running"}

    def _write(self, *, create: bool = False, if_match: str | None = None) -> bool:
        """Write the record: with ``create`` only if there is none, with ``if_match`` only if its ETag is still that.

        Returns:
            False when the store refused the condition (412 Precondition Failed); True when written.
        """
        target = owner_target(self.dest)
        fs, path = storage.filesystem(target)
        bucket, _, key = path.partition("/")
        body = json.dumps(self._record, indent=1, sort_keys=True).encode()
        cond = {"IfNoneMatch": "*"} if create else ({"IfMatch": if_match} if if_match else {})
        try:
            with storage.store_call("claim" if create else "write", target):
                if hasattr(fs, "call_s3"):  # S3 and S3-compatible stores: the conditional PUT itself
                    fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, ContentType="application/json", **cond)
                else:  # other fsspec backends: their own create-only write (no compare-and-swap for a take-over)
                    fs.pipe_file(path, body, **({"mode": "create"} if create else {}))
        except Exception as err:  # s3fs: FileExistsError (If-None-Match), OSError(EINVAL) caused by a 412 (If-Match)
            if cond and _precondition_failed(err):
                return False
            raise
        finally:
            fs.invalidate_cache()
        return True

    def claim(self) -> None:
        """Claim the export location for this driver before anything is written there.

        Raises:
            InputError: another driver owns it (the message names it and says when and how a take-over is
                possible), or its export is finished (exports are never overwritten).
            StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
        """
        for _ in range(3):  # a record removed between the failed create and the read: create again
            if self._write(create=True):
                self.held = True
                log.info("off the pod: %s is this batch's export location (owner record %s)", _label(self.dest),
                         _label(owner_target(self.dest)))
                return
            current, etag = _read(self.dest)
            if current is not None:
                break
        else:
            raise InputError(f"the owner record {_label(owner_target(self.dest))} changes under this driver; "
                             "another one is claiming the export location: nothing was written there")
        self._may_take(current)
        if not self._write(if_match=etag):  # another driver wrote the record after it was read
            raise InputError(f"the export location {_label(self.dest)} was claimed meanwhile by "
                             f"{describe_owner(read_owner(self.dest) or {})}; nothing of this batch was written there")
        self.held = True

    def check_claimable(self) -> None:
        """Raise now, writing nothing, when another driver's claim stands in the way (a resume checks it before it
        downloads). A finished export passes: the batch then only re-checks it, or is refused by :meth:`claim`.

        Raises:
            InputError: as :meth:`claim`.
            StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
        """
        current = read_owner(self.dest)
        if current is not None and current.get("state") != "exported":  # a finished copy is only re-checked
            self._may_take(current, say=False)

    def _may_take(self, current: dict[str, Any], say: bool = True) -> None:
        """Return when this driver may replace the record ``current`` (logged if ``say``); raise the refusal otherwise."""
        own_folder = current.get("host") == self.host and current.get("run_dir") == str(self.run_dir.resolve())
        if current.get("state") == "exported" and not own_folder:
            raise InputError(f"the export location {_label(self.dest)} holds the finished export of "
                             f"{describe_owner(current)}; exports are never overwritten: run this batch under "
                             f"another batch id (or another --export-dir)")
        age = heartbeat_age_s(current)
        stale_after = float(current.get("stale_after_s") or STALE_AFTER_S)
        stale = age is None or age > stale_after
        if own_folder:
            if say:
                log.info("off the pod: taking back %s from an earlier driver of this run folder (%s)",
                         _label(self.dest), describe_owner(current))
        elif self.take_over and stale:
            if say:
                log.warning("off the pod: %s given: taking over %s from %s", user_flag("--take-over-export"),
                            _label(self.dest), describe_owner(current))
        elif self.take_over:
            raise InputError(f"cannot take over {_label(self.dest)}: its owner is alive ({describe_owner(current)}; "
                             f"a heartbeat is stale after {eta_text(stale_after)}); stop that batch first, or wait "
                             f"until its heartbeat is {eta_text(stale_after)} old if its pod is gone")
        else:
            raise InputError(f"the export location {_label(self.dest)} is owned by another driver: "
                             f"{describe_owner(current)}; nothing was written there. One export has one writer: stop "
                             f"that batch, or give this one another batch id or --export-dir; if that pod is gone, "
                             f"run the same command with {user_flag('--take-over-export')} once its heartbeat is "
                             f"{eta_text(stale_after)} old")

    def heartbeat(self) -> None:
        """Refresh the heartbeat if the record is still this driver's (compare-and-swap on its ETag); else set
        :attr:`lost` and stop holding the claim.

        Raises:
            StoreUnreachable: the store did not answer (the caller retries at the next beat).
        """
        if not self.held:
            return
        current, etag = _read(self.dest)
        self._record["heartbeat_at"] = _now()
        if current is not None and current.get("token") == self.token and self._write(if_match=etag):
            return
        if current is None and self._write(create=True):  # removed by hand: this driver still runs, claim again
            return
        self.held = False
        now = read_owner(self.dest) or {}
        self.lost = (f"the export location {_label(self.dest)} was taken over by {describe_owner(now)}; this driver "
                     "writes nothing more there")
        log.error("off the pod: %s", self.lost)

    @contextlib.contextmanager
    def beating(self) -> Iterator[None]:
        """Keep the heartbeat going in a daemon thread while inside (the final export, after the uploader stopped).

        A failed beat is logged and tried again at the next one; a lost claim sets :attr:`lost` (checked by
        :meth:`check` and :meth:`finished`).
        """
        done = threading.Event()

        def beat() -> None:
            while not done.wait(HEARTBEAT_EVERY_S) and self.held:
                try:
                    self.heartbeat()
                except Exception as err:  # noqa: BLE001 - a missed beat; the next one tries again
                    log.warning("off the pod: heartbeat of %s failed: %s", _label(owner_target(self.dest)), err)

        thread = threading.Thread(target=beat, name="export-owner-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()

    def check(self) -> None:
        """Raise when the claim is not held (never claimed, refused, or taken over)."""
        if self.lost:
            raise InputError(self.lost)
        if not self.held:
            raise InputError(f"the export location {_label(self.dest)} is not claimed by this driver; nothing is "
                             "written there")

    def finished(self) -> None:
        """Mark the record ``exported`` (the copy is final: never taken over). Best effort: logged on failure."""
        if not self.held:
            return
        self._record.update(state="exported", heartbeat_at=_now())
        try:
            current, etag = _read(self.dest)
            if current is not None and current.get("token") == self.token:
                self._write(if_match=etag)
        except Exception as err:  # noqa: BLE001 - the export is verified; the record is a guard, not the copy
            log.warning("off the pod: could not mark %s exported: %s", _label(owner_target(self.dest)), err)

    def release(self) -> None:
        """Remove the record (a failed or stopped attempt), if it is still this driver's. Best effort."""
        if not self.held:
            return
        self.held = False
        try:
            current = read_owner(self.dest)
            if current is not None and current.get("token") == self.token:
                fs, path = storage.filesystem(owner_target(self.dest))
                with storage.store_call("remove", owner_target(self.dest)):
                    fs.rm_file(path)
        except Exception as err:  # noqa: BLE001 - a stale record is taken over later (--take-over-export)
            log.warning("off the pod: could not remove the owner record %s (%s: %s); a resume elsewhere takes it over "
                        "with %s once its heartbeat is stale", _label(owner_target(self.dest)), type(err).__name__,
                        err, user_flag("--take-over-export"))


def _precondition_failed(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        text = f"{type(seen).__name__} {seen}"
        if "PreconditionFailed" in text or "412" in text or isinstance(seen, FileExistsError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _label(url: str) -> str:
    return str(url).split("?", 1)[0]
