"""The lease's stop: the lots config's ``lease.stop_command``, checked when a run starts and run only after every copy verified.

:func:`stop_the_meter` is the one place the stop command runs (from ``docpilot wrap-up`` and from a detached run's
``--stop-when-done``); each decision, run or skipped, is recorded with its reason in ``lease-stop.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("batch.lot.stop")


LEASE_STOP_RECORD = "lease-stop.json"
"""The file in a run folder that records every decision to run the lease's stop command or not, with its reason."""


def stop_settings(lots_config: str | Path | None) -> Any:
    """The ``lease`` section of the lots config (:class:`batch.plan.lots.LeaseSection`); defaults when there is no file.

    Args:
        lots_config: ``config/lots.json`` (``None`` or a missing file: no stop command).

    Raises:
        ConfigError: an invalid lots config.
    """
    from batch.plan.lots import LeaseSection, load_lease_part

    if lots_config is None or not Path(lots_config).is_file():
        return LeaseSection()
    return load_lease_part(lots_config).lease


def check_stop_command(lease: Any) -> None:
    """Refuse, when a run starts, a stop command that could only fail at its end (after the whole batch).

    Args:
        lease: the lots config's ``lease`` section (:func:`stop_settings`); no stop command passes.

    Raises:
        ConfigError: the program is not found on ``PATH`` (or is not an executable file), or the command is one
            string holding spaces instead of an argv list; the message names the value and the fix.
    """
    import os
    import shlex
    import shutil

    from classify.errors import ConfigError

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
                          f"{list(lease.stop_command)!r}; write it as {words!r}")
    where = "is not an executable file" if os.sep in program else f"is not found on PATH ({os.environ.get('PATH', '')})"
    raise ConfigError(f"lease.stop_command's program {program!r} {where}; install it or give its full path "
                      f"(the command would only run after the whole run, and fail there)")


def _decode(data: bytes | str | None) -> str:
    """A command's output as text whatever its bytes (not UTF-8: kept as ``\\xNN`` escapes)."""
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", errors="backslashreplace")


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
    import subprocess

    from classify.runs.records import utc_now, write_json_atomic

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
        try:  # bytes, decoded leniently: output that is not UTF-8 is recorded, never a traceback
            done = subprocess.run(command, shell=False, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=lease.stop_timeout_s, check=False)
            decision.update(exit_code=done.returncode, output_tail=(_decode(done.stdout) + _decode(done.stderr))[-2000:],
                            decision="ran" if done.returncode == 0 else "failed")
        except subprocess.TimeoutExpired as err:
            decision.update(decision="failed", output_tail=(f"TimeoutExpired: {err}; output: "
                                                            f"{_decode(err.stdout) + _decode(err.stderr)}")[-2000:])
        except Exception as err:  # noqa: BLE001 - not startable (OSError, a NUL in an argument...): recorded, not raised
            decision.update(decision="failed", output_tail=f"{type(err).__name__}: {err}"[-2000:])
        if decision["decision"] == "ran":
            log.info("lease: stop command %s ran (exit 0): %s", command, reason)
        else:
            log.error("lease: stop command %s FAILED (%s): the rental is still running; stop it yourself",
                      command, decision["exit_code"] if decision["exit_code"] is not None else decision["output_tail"])
    path = record_dir / LEASE_STOP_RECORD
    try:
        import json

        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"decisions": []}
    except (OSError, ValueError):
        old = {"decisions": []}
    old.setdefault("decisions", []).append(decision)
    write_json_atomic(path, old)
    return decision
