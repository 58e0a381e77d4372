"""What a detached run leaves in its run folder, and whether its process still lives.

``detach.json`` (:data:`DETACH_RECORD`), ``<kind>.log`` and ``exit.json`` (:data:`EXIT_RECORD`) are written
by the supervisor of :mod:`batch.run.detach` and read by ``docpilot status`` (:mod:`batch.run.status`);
both import them from here, so that status does not import the supervisor (which imports the wrap-up,
which imports status).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from classify.runrecords import utc_now, write_json_atomic

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


def pid_alive(pid: int | None, host: str | None) -> bool | None:
    """Whether process ``pid`` on ``host`` is alive (``None``: another host, or no pid, cannot tell)."""
    if not pid or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        import psutil

        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - psutil missing or the process just ended: os.kill said it existed
        return True
