"""The lease's stop: the lots config's ``lease.stop_command``, checked when a run starts and run only after every copy verified.

:func:`stop_the_meter` is the one place the stop command runs (from ``docpilot wrap-up`` and from a detached run's
``--stop-when-done``); each decision, run or skipped, is recorded with its reason in ``lease-stop.json``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import threading
from collections import deque
from pathlib import Path
from typing import Any

from batch.plan.lots import LeaseSection, load_lease_part
from classify.errors import ConfigError
from classify.runs.records import utc_now, write_json_atomic

log = logging.getLogger(__name__)


LEASE_STOP_RECORD = "lease-stop.json"
"""The file in a run folder that records every decision to run the lease's stop command or not, with its reason."""


def stop_settings(lots_config: str | Path | None) -> Any:
    """The ``lease`` section of the lots config (:class:`batch.plan.lots.LeaseSection`); defaults when there is no file.

    Args:
        lots_config: ``config/lots.json`` (``None`` or a missing file: no stop command).

    Raises:
        ConfigError: an invalid lots config.
    """
    if lots_config is None or not Path(lots_config).is_file():
        return LeaseSection()
    return load_lease_part(lots_config).lease


def check_stop_command(lease: Any, after: str = "the whole run", skip: str | None = None) -> None:
    """Refuse, when a run (or a wrap-up) starts, a stop command that could only fail at its end.

    Args:
        lease: the lots config's ``lease`` section (:func:`stop_settings`); no stop command passes.
        after: what the command would run after, for the message (``"every copy"`` for a wrap-up).
        skip: the option that goes on without the stop command, offered in the message (``--no-stop``).

    Raises:
        ConfigError: the program is not found on ``PATH`` (or is not an executable file), or the command is one
            string holding spaces instead of an argv list; the message names the value and the fix.
    """
    if not lease.stop_command:
        return
    program = lease.stop_command[0]
    if shutil.which(program) is not None:
        return
    if len(lease.stop_command) == 1 and any(c.isspace() for c in program):
        try:
            words = shlex.split(program)
        except ValueError:
            words = program.split()
        raise ConfigError(f"lease.stop_command must be an argv list (it runs without a shell), got one string "
                          f"{list(lease.stop_command)!r}; write it as {words!r}"
                          + (f" (or pass {skip} to go on without stopping the lease)" if skip else ""))
    where = "is not an executable file" if os.sep in program else f"is not found on PATH ({os.environ.get('PATH', '')})"
    raise ConfigError(f"lease.stop_command's program {program!r} {where}; install it or give its full path "
                      f"(the command would only run after {after}, and fail there)"
                      + (f"; or pass {skip} to go on without stopping the lease" if skip else ""))


def _decode(data: bytes | str | None) -> str:
    """A command's output as text whatever its bytes (not UTF-8: kept as ``\\xNN`` escapes)."""
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", errors="backslashreplace")


OUTPUT_TAIL_CHARS = 2000
"""Most characters of the stop command's output kept in its decision (the last ones)."""
OUTPUT_GRACE_S = 1.0
"""Seconds the output is still read after the stop command itself exited: what a background child it left behind
writes later (or its open end of the pipe, held for ever) is not waited for."""


def _run_stop_command(command: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``command`` (no shell, standard input from ``/dev/null``) and judge it by its own exit status.

    Standard output and error go to one pipe read by a thread into a bounded buffer; the command is waited for, not
    its output's end, so a background child that keeps the pipe open (a provider CLI that forks a helper) neither
    holds the decision nor turns a command that exited 0 into a failure.

    Returns:
        ``{decision: ran|failed, exit_code, output_tail}``: ``ran`` when the command exited 0; ``failed`` on another
        exit status, past ``timeout_s`` (the command is killed, its output so far kept), or when it cannot start.
    """
    try:  # bytes, decoded leniently: output that is not UTF-8 is recorded, never a traceback
        proc = subprocess.Popen(command, shell=False, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    except Exception as err:  # noqa: BLE001 - not startable (OSError, a NUL in an argument...): recorded, not raised
        return {"decision": "failed", "exit_code": None, "output_tail": f"{type(err).__name__}: {err}"[-OUTPUT_TAIL_CHARS:]}
    chunks: deque[bytes] = deque()
    kept = [0]
    lock = threading.Lock()

    def read() -> None:  # bounded: only the last OUTPUT_TAIL_CHARS * 4 bytes are kept, whatever is written
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        while data := _read_some(fd):
            with lock:
                chunks.append(data)
                kept[0] += len(data)
                while kept[0] - len(chunks[0]) >= OUTPUT_TAIL_CHARS * 4:
                    kept[0] -= len(chunks.popleft())

    reader = threading.Thread(target=read, name="stop-command-output", daemon=True)
    reader.start()
    timed_out = False
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out, code = True, None
        proc.kill()
        proc.wait()
    reader.join(OUTPUT_GRACE_S)
    held = reader.is_alive()  # a descendant still holds the pipe open: its output is not waited for
    with lock:
        text = _decode(b"".join(chunks))
    if timed_out:
        text = f"TimeoutExpired: {command} did not exit within {timeout_s} s; output: {text}"
    elif held:
        text += "\n(output read so far: a background process the command left still holds its output open)"
    return {"decision": "ran" if code == 0 else "failed", "exit_code": code, "output_tail": text[-OUTPUT_TAIL_CHARS:]}


def _read_some(fd: int) -> bytes:
    """The next bytes of the pipe ``fd`` (``b""`` at its end, or once it is closed)."""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""


def stop_the_meter(record_dir: Path, lease: Any, verified: bool, reason: str) -> dict[str, Any]:
    """Run the lease's stop command if ``verified``, else skip it; either way record why in ``lease-stop.json``.

    The command is the argv list of ``lease.stop_command``, run as written with no shell (no word
    splitting, no variable or user-data interpolation), standard input from ``/dev/null``, bounded by
    ``lease.stop_timeout_s``. Each decision is appended to ``<record_dir>/lease-stop.json``
    (``{"decisions": [...]}``) and logged.

    Args:
        record_dir: the run folder that records the decision (created if missing).
        lease: the lots config's ``lease`` section (:func:`stop_settings`).
        verified: every copy was made and re-checked where it landed (the only case it may run).
        reason: why (the wrap-up's verdict, or why a run did not qualify), recorded as given.

    Returns:
        The decision: ``{at, decision: ran|skipped|failed, reason, command, exit_code, output_tail}``.
    """
    command = list(lease.stop_command) if lease.stop_command else None
    decision: dict[str, Any] = {"at": utc_now(), "command": command, "reason": reason, "exit_code": None,
                                "output_tail": None}
    if not verified:
        decision["decision"] = "skipped"
        log.warning("lease: stop command NOT run: %s", reason)
    elif command is None:
        decision.update(decision="skipped", reason=f"{reason}; no `lease.stop_command` in the lots config "
                                                   "(stop the rental yourself)")
        log.info("lease: %s", decision["reason"])
    else:
        decision.update(_run_stop_command(command, lease.stop_timeout_s))
        if decision["decision"] == "ran":
            log.info("lease: stop command %s ran (exit 0): %s", command, reason)
        else:
            log.error("lease: stop command %s FAILED (%s): the rental is still running; stop it yourself",
                      command, decision["exit_code"] if decision["exit_code"] is not None else decision["output_tail"])
    path = record_dir / LEASE_STOP_RECORD
    try:
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"decisions": []}
    except (OSError, ValueError):
        old = {"decisions": []}
    old.setdefault("decisions", []).append(decision)
    write_json_atomic(path, old)
    return decision
