"""Start a local Ray for one driver and leave no process of it behind when it stops.

``ray.shutdown()`` alone leaks: ``Node.kill_all_processes`` (``ray/_private/node.py``) sends the
raylet SIGTERM, waits one second and then SIGKILLs it, but ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` are the *raylet's* children, not processes the driver's ``Node`` knows,
so they are orphaned and keep running (they ignore a late SIGTERM while their event loop is busy).
Worker processes and the ``VLLM::EngineCore`` an actor forked are killed only when they notice
the raylet is gone, which an actor stuck in an engine start may never do. And the path that
would call ``ray.shutdown()`` was not always reached: ``ray.init`` installs its own SIGTERM
handler (``sys.exit(15)``), replacing the driver's.

:func:`start` records the session; :func:`stop` lists every process of the session (the ones
Ray's ``Node`` started, every descendant of those, and every process whose command line names
the session folder), calls ``ray.shutdown()``, then SIGTERMs what is left and SIGKILLs what
survives a grace period. A Ray that the driver joined (``RAY_ADDRESS``, a job's cluster) is
never touched: :func:`start` returns ``None`` for it and :func:`stop` does nothing.

Example:
    >>> session = start(include_dashboard=False)  # doctest: +SKIP
    >>> try:
    ...     run_the_batch()
    ... finally:
    ...     stop(session)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from classify.runs.records import signals_raise_interrupted

log = logging.getLogger("docpilot.batch")

GRACE_S = 5.0
"""Seconds the processes left after ``ray.shutdown()`` get between SIGTERM and SIGKILL."""


@dataclass(frozen=True)
class LocalRay:
    """A local Ray session this process started.

    Attributes:
        session_dir: the session folder (``/tmp/ray/session_...``), named on its daemons' command lines.
        node_pids: pids of the processes Ray's ``Node`` started (gcs_server, raylet, log monitor, ...).
    """

    session_dir: str
    node_pids: tuple[int, ...]


def start(**init_kwargs: Any) -> LocalRay | None:
    """Join ``RAY_ADDRESS`` or start a local Ray with ``ray.init(**init_kwargs)``.

    The SIGTERM handler in place before the call is put back after ``ray.init`` (which replaces it),
    and a SIGTERM that Ray's handler took during ``ray.init`` is handed to it after the local Ray
    is cleaned up. If ``ray.init`` fails or is interrupted, whatever it had started is stopped.

    Args:
        init_kwargs: keyword arguments of ``ray.init`` for a local start (ignored when joining).

    Returns:
        The session to pass to :func:`stop`, or ``None`` when Ray was already initialized in this
        process or a running cluster was joined (those are never shut down here).
    """
    import ray

    if ray.is_initialized():
        return None
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    if os.environ.get("RAY_ADDRESS"):
        try:
            ray.init(address=os.environ["RAY_ADDRESS"], **{k: v for k, v in init_kwargs.items() if k == "log_to_driver"})
        finally:
            _restore_sigterm(previous)
        return None
    before = {p.pid for p in _children()}
    try:
        ray.init(**init_kwargs)
        session = _describe()
    except BaseException as err:
        # Node() may have started daemons before ray.init could record it: end Ray's new children too
        stray = [p for p in _children() if p.pid not in before and _is_ray(p)]
        _end(stray + _session_processes(_describe() or LocalRay("", ())), f"init failed ({type(err).__name__})")
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - already ending its processes
            pass
        _restore_sigterm(previous)
        if isinstance(err, SystemExit) and err.code == signal.SIGTERM and callable(previous):
            previous(signal.SIGTERM, None)  # Ray's handler took the SIGTERM; the driver's own handler decides
        raise
    _restore_sigterm(previous)
    return session


def stop(session: LocalRay | None, reason: str = "shutdown") -> list[int]:
    """Shut down a local Ray started by :func:`start` and end every process of its session.

    Args:
        session: what :func:`start` returned; ``None`` (a joined cluster) does nothing.
        reason: why, for the log line when processes had to be signalled.

    Returns:
        The pids that were still alive after ``ray.shutdown()`` and were signalled.
    """
    import ray

    if session is None:
        return []
    procs = _session_processes(session)
    try:
        ray.shutdown()
    except Exception as err:  # noqa: BLE001 - the processes are ended below either way
        log.warning("ray.shutdown() failed (%s: %s); ending the session's processes directly", type(err).__name__, err)
    return _end(procs, reason)


def interrupts() -> Any:
    """While inside, the first SIGTERM, SIGINT or SIGHUP stops the work; it leaves as :class:`Interrupted` (exit 130).

    :func:`classify.runs.records.signals_raise_interrupted` with ``via_keyboard_interrupt``: inside
    Ray's blocking calls only ``KeyboardInterrupt`` gets through from a signal handler.

    Raises:
        Interrupted: a handled signal arrived.
    """
    return signals_raise_interrupted(via_keyboard_interrupt=True, doing="ending the local Ray")


def _restore_sigterm(previous: Any) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


def _describe() -> LocalRay | None:
    """The running local session of this process, or None when there is none."""
    try:
        from ray._private import worker

        node = worker._global_node
        if node is None:
            return None
        pids = tuple(info.process.pid for infos in node.all_processes.values() for info in infos)
        return LocalRay(session_dir=node.get_session_dir_path(), node_pids=pids)
    except Exception:  # noqa: BLE001 - Ray's private API changed or init failed early: reap by session dir only
        return None


def _session_processes(session: LocalRay) -> list[Any]:
    """Every live process of ``session``: Ray's own daemons, their descendants, and those naming the session dir."""
    import psutil

    found: dict[int, psutil.Process] = {}
    roots: list[psutil.Process] = []
    for pid in session.node_pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or ()
            if session.session_dir and proc.pid != os.getpid() and any(session.session_dir in a for a in cmdline):
                roots.append(proc)
        except psutil.Error:
            pass
    for root in roots:
        found[root.pid] = root
        try:
            for child in root.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.Error:
            pass
    found.pop(os.getpid(), None)
    return list(found.values())


def terminate_then_kill(procs: list[Any], grace_s: float) -> list[Any]:
    """SIGTERM ``procs`` (``psutil.Process``), SIGKILL those still running after ``grace_s`` seconds.

    psutil checks pid reuse (start time) before it signals, so a recycled pid is never hit.

    Args:
        procs: the processes to stop (already gone ones are skipped).
        grace_s: seconds to wait after SIGTERM, and again after SIGKILL.

    Returns:
        The processes that survived SIGKILL too (normally none).
    """
    import psutil

    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(procs, timeout=grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return psutil.wait_procs(still, timeout=grace_s)[1]


def _end(procs: list[Any], reason: str) -> list[int]:
    """SIGTERM the processes of ``procs`` still running (same pid and start time), SIGKILL them after :data:`GRACE_S`."""

    alive = [p for p in procs if _running(p)]
    if not alive:
        return []
    log.info("ray %s: ending %d leftover process(es) of the local Ray session: %s", reason, len(alive),
             ", ".join(sorted({_name(p) for p in alive})))
    for proc in terminate_then_kill(alive, GRACE_S):
        log.warning("ray %s: process %d (%s) survived SIGKILL", reason, proc.pid, _name(proc))
    return [p.pid for p in alive]


def _children() -> list[Any]:
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _is_ray(proc: Any) -> bool:
    try:
        return "ray" in proc.name().lower() or any("ray" in a for a in proc.cmdline()[:3])
    except Exception:  # noqa: BLE001 - gone already
        return False


def _running(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(proc: Any) -> str:
    try:
        return proc.name()
    except Exception:  # noqa: BLE001
        return str(proc.pid)
