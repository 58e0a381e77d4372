"""What a detached run leaves in its run folder, and whether its process still lives.

``detach.json`` (:data:`DETACH_RECORD`), ``<kind>.log`` and ``exit.json`` (:data:`EXIT_RECORD`) are written
by the supervisor of :mod:`docpilot.detach` and read by ``docpilot status`` (:mod:`batch.lot.status`);
both import them from here, so that status does not import the supervisor (which imports the wrap-up,
which imports status).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classify.runs.records import utc_now, write_json_atomic

EXIT_RECORD = "exit.json"
DETACH_RECORD = "detach.json"


def log_path(run_dir: Path, kind: str) -> Path:
    """The detached run's log: ``<run_dir>/<kind>.log``."""
    return run_dir / f"{kind}.log"


def read_exit(run_dir: Path) -> dict[str, Any] | None:
    """The exit record of a run that ended (``exit.json``), or ``None`` while it runs (or for a damaged file)."""
    try:
        return json.loads((run_dir / EXIT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_detach(run_dir: Path) -> dict[str, Any] | None:
    """The detach record (``detach.json``) of a detached run, or ``None``."""
    try:
        return json.loads((run_dir / DETACH_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record_exit(run_dir: Path, exit_code: int, **fields: Any) -> None:
    """Write ``exit.json``: ``{exit_code, ended_at, host, ...fields}`` (atomically)."""
    write_json_atomic(run_dir / EXIT_RECORD, {"exit_code": int(exit_code), "ended_at": utc_now(),
                                              "host": socket.gethostname(), **fields})


PID_START_TOLERANCE_S = 1.0
"""Most seconds a live process's start time may differ from the recorded one and still be the recorded process
(``psutil.Process.create_time`` is rounded to clock ticks)."""


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``: new at every boot, the same under any host name), or ``None``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """What identifies a process beyond its number: ``{pid, host, boot_id, pid_started}``.

    ``pid_started`` is the process's start time (``psutil.Process.create_time``, seconds since the epoch): a pid
    reused by a later process has another one. ``boot_id`` tells a reboot, and the same machine under a new host name.

    Args:
        pid: the process (default: this one).

    Returns:
        The identity (``pid_started`` ``None`` when psutil cannot read it).
    """
    import psutil

    pid = os.getpid() if pid is None else int(pid)
    try:
        started: float | None = psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        started = None
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(), "pid_started": started}


def pid_alive(pid: int | None, host: str | None, started: float | None = None, boot: str | None = None,
              seen_at: str | None = None) -> bool | None:
    """Whether the recorded process (``pid`` on ``host``, started at ``started``, in boot ``boot``) is still running here.

    Process identity by start time is psutil's (``Process.create_time``, as ``psutil.Process.is_running`` uses it).

    Args:
        pid: the recorded process id.
        host: the host name recorded with it.
        started: its recorded start time (seconds since the epoch), when recorded.
        boot: the boot id recorded with it (:func:`boot_id`), when recorded.
        seen_at: when the record was written while that process ran (UTC ISO 8601, :func:`utc_now`). Used only
            without ``started`` (a record written by an earlier docpilot, :func:`record_is_old`): a process holding
            the pid that started after this time cannot be the recorded one (a pid has one process at a time), so a
            reused pid is told even there.

    Returns:
        ``True`` while that process runs; ``False`` when it is gone: no such pid, a zombie, the pid now belongs
        to a process started at another time (reused; without ``started``: after ``seen_at``), this machine rebooted since, or the record names another
        host and another boot (the folder was copied or moved off the machine that ran it, or the pod came back
        under a new name after a restart); ``None`` when there is no pid.
    """
    if not pid:
        return None
    here = boot_id()
    if host != socket.gethostname() and not (boot and here and boot == here):
        return False  # another machine (or this one after a reboot under a new name): not running here
    if boot and here and boot != here:
        return False  # rebooted since: no process of that boot survives
    import psutil

    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its parent
            return False
        if started is not None and abs(proc.create_time() - float(started)) > PID_START_TOLERANCE_S:
            return False  # the pid was reused by another process
        if started is None and (seen := _epoch(seen_at)) is not None and proc.create_time() > seen + 1 + PID_START_TOLERANCE_S:
            return False  # started after the record was written (1 s: the record's time is cut to the second): reused
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return True


def _epoch(stamp: str | None) -> float | None:
    """Seconds since the epoch of a UTC ISO 8601 time (:func:`utc_now`'s form), or ``None`` when there is none."""
    if not stamp:
        return None
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def record_is_old(started: float | None, pid: int | None) -> bool:
    """Whether a record names a process without its start time (written by an earlier docpilot):
    its pid alone cannot be told from a later process that reuses it, only by the record's time (``seen_at``)."""
    return bool(pid) and started is None


OLD_RECORD_NOTE = ("the run folder's record is old (written by an earlier docpilot, without process start times): "
                   "a process that now holds its pid started after the record and is not the run")
"""What ``docpilot status`` adds when a record without start times was found gone."""


@dataclass(frozen=True)
class DetachPlan:
    """A detachable command's share of ``--detach``: what its ``prepare_detach(argv)`` returns to the front door.

    The front door (:mod:`docpilot.detach`) checks the lease's stop command, calls :attr:`open_run` and starts
    the supervisor, so no command package imports the detach machinery.

    Attributes:
        kind: ``batch`` or ``train``: the subcommand the supervisor runs, and the log's name.
        stop_when_done: after a successful run, wrap up to :attr:`wrap_up_to` and stop the lease if every copy verified.
        wrap_up_to: the wrap-up destination (folder or URL); set whenever :attr:`stop_when_done` is.
        lots_config: the lots config holding ``lease.stop_command``.
        open_run: runs the command's own start checks that need no engine (a batch: config, corpus, export
            location, adapter, pilot gate; raising as the foreground start does), then makes (or opens) the run
            folder: ``(run id, folder, arguments added to the child's)``.
        after_exit: an import string ``"package.module:function"`` naming the command's check, in the supervisor
            once the child ended, ``(run folder, child pid, host) -> bool``: whether that child recorded an attempt of
            its own there. When it did not (a batch resume refused before it began), the exit record of the attempt
            that last ran is kept. ``None`` (training): every start's exit status is the run's.
    """

    kind: str
    stop_when_done: bool
    wrap_up_to: str | None
    lots_config: str | None
    open_run: Callable[[], tuple[str, Path, tuple[str, ...]]]
    after_exit: str | None = None
