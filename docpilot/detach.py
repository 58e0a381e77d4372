"""Detached runs: ``docpilot batch --detach`` / ``docpilot train --detach`` outlive the terminal that started them.

:func:`start_detached` starts a small supervisor (``python -m docpilot.detach supervise ...``) in a new
session (``start_new_session``: its own process group, no controlling terminal, standard input from
``/dev/null``), so a dropped SSH connection, a closed terminal or a killed login shell (SIGHUP or
SIGKILL to the starting session) does not reach it. The supervisor runs the real command as its child,
with standard output and error appended to the log in the run folder, and when the child ends writes
the exit status to ``<run folder>/exit.json`` (:data:`EXIT_RECORD`; a child killed by signal N is
recorded as 128 + N, as a shell reports it). ``docpilot status ID --follow`` waits on that record.

With ``--stop-when-done`` the supervisor then runs the verified wrap-up (:func:`batch.lot.wrapup.wrap_up`)
to the export location and the lease's stop command only if every copy was re-checked where it
landed (:func:`batch.lease.stop.stop_the_meter`); a failed run never stops the lease. Every decision is
recorded in the run folder's ``lease-stop.json``.

This is the front door's half of ``--detach``: ``docpilot.cli`` sends a detachable command's arguments here with
that command's ``prepare_detach`` (which checks its options and opens its run folder through a
:class:`~classify.runs.detached.DetachPlan`), so neither ``batch`` nor ``adapters`` imports this module. What a command
checks in its run folder once its child ended comes with the plan too, as an import string
(:attr:`~classify.runs.detached.DetachPlan.after_exit`): nothing here asks which command it runs.

Files in the run folder: ``detach.json`` (:data:`DETACH_RECORD`: the supervisor's and the child's pid,
host, command, log), ``<kind>.log`` and ``exit.json``.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import pkgutil
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batch.lease.stop import check_stop_command, stop_settings, stop_the_meter
from batch.lot.wrapup import wrap_up
from classify.errors import InputError
from classify.runs.detached import (
    DETACH_RECORD,
    EXIT_RECORD,
    DetachPlan,
    log_path,
    process_identity,
    read_detach,
    read_exit,
    record_exit,
)
from classify.runs.records import utc_now, write_json_atomic
from classify.runs.storage import redact
from classify.usercommand import user_command
from docpilot.logs import log_lines

log = logging.getLogger("docpilot.detach")

STOP_FLAGS = ("--detach", "--stop-when-done")
VALUE_FLAGS = ("--wrap-up-to",)
DETACH_LOCK = ".detach.lock"
"""The run folder's supervisor lock: taken by :func:`start_detached` before it touches the folder, then held by
the supervisor process (the open file is inherited) until it has written ``exit.json`` and wrapped up."""


def child_argv(argv: list[str]) -> list[str]:
    """``argv`` without the detach options (``--detach``, ``--stop-when-done``, ``--wrap-up-to X``).

    Args:
        argv: the command's arguments as given (after ``docpilot batch`` / ``docpilot train``).

    Returns:
        The arguments the detached child runs with.
    """
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--":
            out += argv[i:]
            break
        if arg in STOP_FLAGS or any(arg.startswith(f"{f}=") for f in VALUE_FLAGS):
            continue
        if arg in VALUE_FLAGS:
            skip = True
            continue
        out.append(arg)
    return out


def start_detached(kind: str, run_id: str, run_dir: Path, argv: list[str], *, stop_when_done: bool = False,
                   wrap_up_to: str | None = None, lots_config: str | None = "config/lots.json",
                   after_exit: str | None = None) -> int:
    """Start ``docpilot <kind> <argv>`` detached from this terminal; print its id, log and status command.

    Args:
        kind: ``batch`` or ``train``.
        run_id: the run folder's name (the batch id, or the training job's folder).
        run_dir: the run folder (exists); it receives ``detach.json``, ``<kind>.log`` and ``exit.json``.
        argv: the child's arguments (:func:`child_argv`, with ``--batch-id`` for a batch).
        stop_when_done: after a successful run, wrap up to ``wrap_up_to`` and run the lease's stop command
            if every copy verified.
        wrap_up_to: the wrap-up destination (folder or URL); required with ``stop_when_done``.
        lots_config: the lots config holding ``lease.stop_command``.
        after_exit: the command's check of its run folder after the child ended
            (:attr:`~classify.runs.detached.DetachPlan.after_exit`), given to the supervisor.

    Returns:
        0 (the detached run's own status is recorded in ``exit.json``).

    Raises:
        InputError: another detached start of the same run holds its folder (:data:`DETACH_LOCK`); the message
            names its supervisor's pid and how to follow or stop it.
    """
    lock_fd = _take_detach_lock(run_id, run_dir)
    try:
        return _start(kind, run_id, run_dir, argv, lock_fd=lock_fd, stop_when_done=stop_when_done, wrap_up_to=wrap_up_to,
                      lots_config=lots_config, after_exit=after_exit)
    finally:
        os.close(lock_fd)  # the supervisor holds its inherited copy


def _take_detach_lock(run_id: str, run_dir: Path) -> int:
    """Take :data:`DETACH_LOCK` without waiting (``flock``: released by the kernel when its holder ends, however)."""
    fd = os.open(run_dir / DETACH_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = read_detach(run_dir) or {}
        pid = holder.get("supervisor_pid", "?")
        raise InputError(f"{run_id} is already running detached (supervisor pid {pid}, started "
                         f"{holder.get('started_at', '?')}, holds {run_dir / DETACH_LOCK}); follow it with "
                         f"`{user_command(f'docpilot status {run_id} --follow')}`, stop it with `kill {pid}`; start it "
                         "again once it "
                         "ended") from None
    return fd


def _start(kind: str, run_id: str, run_dir: Path, argv: list[str], *, lock_fd: int, stop_when_done: bool,
           wrap_up_to: str | None, lots_config: str | None, after_exit: str | None) -> int:
    previous = read_exit(run_dir)  # the attempt that last ran: kept if this start is refused before its own begins
    (run_dir / EXIT_RECORD).unlink(missing_ok=True)  # a resumed run's earlier record: follow waits for this one
    logfile = log_path(run_dir, kind)
    command = [sys.executable, "-m", "docpilot", kind, *argv]
    sup = [sys.executable, "-m", "docpilot.detach", "supervise", "--run-dir", str(run_dir.resolve()), "--kind", kind]
    if stop_when_done:
        sup += ["--stop-when-done", "--wrap-up-to", str(wrap_up_to)]
    if lots_config:
        sup += ["--lots-config", str(Path(lots_config).resolve()) if Path(lots_config).exists() else lots_config]
    if after_exit:
        sup += ["--after-exit", after_exit]
    sup += ["--", *command]
    shown = [redact(a) for a in command]  # a URL's user:password@ never lands in the log or the record
    with open(logfile, "ab") as out:
        out.write(f"--- {utc_now()} detached: {shlex.join(shown)}\n".encode())
        out.flush()
        proc = subprocess.Popen(sup, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, pass_fds=(lock_fd,), cwd=os.getcwd())
    ident = process_identity(proc.pid)
    write_json_atomic(run_dir / DETACH_RECORD, {
        "kind": kind, "run_id": run_id, "supervisor_pid": proc.pid, "supervisor_started": ident["pid_started"],
        "boot_id": ident["boot_id"], "child_pid": None, "child_started": None, "host": socket.gethostname(),
        "command": shown, "log": str(logfile), "started_at": utc_now(), "stop_when_done": stop_when_done,
        "wrap_up_to": redact(wrap_up_to) if wrap_up_to else wrap_up_to, "previous_exit": previous})
    what = "batch" if kind == "batch" else "training job"
    print(f"{what} {run_id} detached (pid {proc.pid}, its own session: closing this terminal does not stop it)")
    print(f"log:    {logfile}")
    print(f"follow: {user_command(f'docpilot status {run_id} --follow')}")
    print(f"stop:   kill {proc.pid}   (a clean, resumable stop, as SIGTERM)")
    return 0


def detach(argv: list[str], prepare: Callable[[list[str]], DetachPlan]) -> int:
    """``docpilot batch|train --detach [--stop-when-done --wrap-up-to DEST]``: start the command in its own session.

    The command's own ``prepare_detach`` checks its options and returns a :class:`DetachPlan`; here the lease's stop
    command is checked (now, not after the whole run), the run folder opened and the supervisor started.

    Args:
        argv: the command's arguments as given (after ``docpilot batch`` / ``docpilot train``).
        prepare: the command's ``prepare_detach`` (``docpilot.cli.DETACHABLE``).

    Returns:
        0 once the detached run started.

    Raises:
        InputError: the command refused its detach options (``--stop-when-done`` without ``--detach`` or
            without a destination), or the run is already running detached.
        ConfigError: the lots config's ``lease.stop_command`` cannot run here (:func:`batch.lease.stop.check_stop_command`).
    """
    plan = prepare(argv)
    if plan.stop_when_done:
        check_stop_command(stop_settings(plan.lots_config))
    run_id, run_dir, added = plan.open_run()
    return start_detached(plan.kind, run_id, run_dir, child_argv(argv) + list(added), stop_when_done=plan.stop_when_done,
                          wrap_up_to=plan.wrap_up_to, lots_config=plan.lots_config, after_exit=plan.after_exit)


def _supervise(args: argparse.Namespace) -> int:
    """Run the child command, record its exit status, then (``--stop-when-done``) wrap up and decide the stop."""
    run_dir = Path(args.run_dir)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal: a stray SIGHUP must not end the supervisor
    child = subprocess.Popen(args.command, stdin=subprocess.DEVNULL)

    def forward(signum: int, frame: Any) -> None:  # `kill <supervisor pid>` stops the run cleanly (exit 130)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    record = read_detach(run_dir) or {}
    record["child_pid"] = child.pid
    record["child_started"] = process_identity(child.pid)["pid_started"]
    write_json_atomic(run_dir / DETACH_RECORD, record)
    code = child.wait()
    if code < 0:
        code = 128 - code  # killed by signal N: 128 + N, as a shell reports it
    _record_child_exit(run_dir, args, code, child.pid, (read_detach(run_dir) or {}).get("previous_exit"))
    print(f"--- {utc_now()} {args.kind} exited {code}", flush=True)
    if args.stop_when_done:
        stop_when_done(run_dir, args.kind, code, args.wrap_up_to, args.lots_config)
    return code


def _record_child_exit(run_dir: Path, args: argparse.Namespace, code: int, child_pid: int,
                       previous: dict[str, Any] | None) -> None:
    """Write ``exit.json`` for the child that ended with ``code``.

    A start that recorded no attempt of its own (a batch: a resume refused before it began, a changed config or
    corpus; the re-check of a complete batch; a stop during its start) must not pass for the run's status: when the
    command's plan names a check of its run folder (``--after-exit``, :attr:`DetachPlan.after_exit`; a batch's is
    :func:`batch.run.driver.attempt_recorded_by`) and it says the child recorded none, the record of the attempt that
    last ran is written back, with this start under ``last_start`` (``{exit_code, ended_at, attempt: false,
    command}``), as a foreground ``docpilot batch`` leaves it. ``docpilot status --follow`` returns ``last_start``'s code.
    """
    if args.after_exit and previous:
        recorded_by = pkgutil.resolve_name(args.after_exit)  # the command's own module, named by its plan
        if not recorded_by(run_dir, child_pid, socket.gethostname()):
            kept = {k: v for k, v in previous.items() if k != "last_start"}
            kept["last_start"] = {"exit_code": int(code), "ended_at": utc_now(), "attempt": False,
                                  "command": args.command}
            write_json_atomic(run_dir / EXIT_RECORD, kept)
            return
    record_exit(run_dir, code, command=args.command, stop_when_done=bool(args.stop_when_done))


def stop_when_done(run_dir: Path, kind: str, code: int, dest: str | None, lots_config: str | None) -> dict[str, Any]:
    """After a detached run: wrap up to ``dest`` and stop the lease only if the run succeeded and every copy verified.

    Args:
        run_dir: the detached run's folder (records ``lease-stop.json``).
        kind: ``batch`` or ``train``.
        code: the run's exit status.
        dest: the wrap-up destination.
        lots_config: the lots config holding ``lease.stop_command``.

    Returns:
        The stop decision (:func:`batch.lease.stop.stop_the_meter`).
    """
    lease = stop_settings(lots_config)
    if code != 0:
        return stop_the_meter(run_dir, lease, False, f"the {kind} exited {code} (failed or stopped): the lease is "
                                                    "left running so it can be resumed or copied off by hand")
    if not dest:
        return stop_the_meter(run_dir, lease, False, "no wrap-up destination: nothing was exported")
    try:
        outcome = wrap_up(dest)
    except Exception as err:  # noqa: BLE001 - whatever went wrong, the stop is skipped and the reason kept
        return stop_the_meter(run_dir, lease, False, f"the wrap-up to {dest} failed: {type(err).__name__}: {err}")
    return stop_the_meter(run_dir, lease, outcome["verified"], outcome["verdict"])


def main(argv: list[str] | None = None) -> int:
    """``python -m docpilot.detach supervise --run-dir D --kind K [--stop-when-done --wrap-up-to X] [--after-exit M:F]
    -- COMMAND...``.

    Internal: started by :func:`start_detached` in its own session; not a ``docpilot`` subcommand.

    Returns:
        The child's exit status (128 + N when a signal N ended it).
    """
    p = argparse.ArgumentParser(prog="python -m docpilot.detach")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("supervise")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--kind", required=True, choices=("batch", "train"))
    s.add_argument("--stop-when-done", action="store_true")
    s.add_argument("--wrap-up-to")
    s.add_argument("--lots-config")
    s.add_argument("--after-exit", metavar="MODULE:FUNCTION")
    s.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    log_lines()
    return _supervise(args)


if __name__ == "__main__":
    sys.exit(main())
