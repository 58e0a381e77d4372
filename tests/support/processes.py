"""The ``docpilot`` command in a subprocess and the processes it leaves: run it, watch its descendants, find and
kill what is left (by pid and start time, never by name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import ROOT


def docpilot_env(tmp_path: Path) -> dict[str, str]:
    """This environment without ``RAY_ADDRESS``, with run folders under ``tmp_path/runs`` and the repository on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(DOCPILOT_RUNS=str(tmp_path / "runs"), PYTHONPATH=str(ROOT))
    return env

def run_docpilot(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m docpilot *args`` from the repository root, output captured; raises ``TimeoutExpired`` past ``timeout`` s."""
    return subprocess.run([sys.executable, "-m", "docpilot", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)

def process_title(proc: psutil.Process) -> str:
    """``ray::RuntimeEnvAgent``, ``raylet``, ...: the process title (``name()`` is cut at 15 characters)."""
    cmdline = proc.cmdline()
    first = cmdline[0].split()[0] if cmdline and cmdline[0].strip() else proc.name()
    return first if "::" in first else os.path.basename(first)

def watch_descendants(proc: subprocess.Popen, until: str, timeout_s: float, seen: dict[int, tuple[str, float]]) -> None:
    """Record descendants of ``proc`` in ``seen`` (pid -> (title, start time)) until one titled ``until`` exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            break
        for child in children:
            try:  # the latest title: Ray workers and vLLM's engine core start as "python", then retitle themselves
                seen[child.pid] = (process_title(child), child.create_time())
            except psutil.Error:
                pass
        if any(name == until for name, _ in seen.values()):
            return
        time.sleep(0.1)
    proc.kill()
    out = proc.communicate()[0]
    pytest.fail(f"no {until} within {timeout_s} s (exit {proc.poll()}); seen {sorted({n for n, _ in seen.values()})}\n{out[-3000:]}")

def still_alive(seen: dict[int, tuple[str, float]]) -> list[str]:
    """``"title (pid)"`` of each process in ``seen`` still running (same pid and start time, not a zombie)."""
    left = []
    for pid, (name, created) in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{name} ({pid})")
        except psutil.Error:
            pass
    return left

def kill_seen(seen: dict[int, tuple[str, float]]) -> None:
    """SIGKILL each process in ``seen`` that still runs (same pid and start time): a failed test's clean-up."""
    for pid, (_, created) in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()
        except psutil.Error:
            pass
