"""Stopping ``docpilot batch`` leaves no Ray process behind; commands are quiet unless ``--verbose``; the bar shows docs/s.

The stop tests run the real command in a subprocess with a real local Ray and send it SIGTERM
(issue 12 item 10); the logging test runs a command that imports vLLM (issue 12, quiet output).

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/run/test_quiet_and_stop.py``, ``tests/process/test_quiet_logs.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import kill_seen, still_alive, watch_descendants

ROOT = Path(__file__).resolve().parents[2]
RAY_DAEMONS = ("raylet", "gcs_server")


def _docpilot_popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "docpilot", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env or os.environ.copy())


def _is_ray(name: str) -> bool:
    return name.startswith(("ray::", "VLLM::")) or name in RAY_DAEMONS


@pytest.fixture
def tiny_batch(tmp_path):
    """A 2-document corpus and the shipped batch config with one CPU actor: ``(corpus, config)``."""
    from tests.support.corpora import write_config

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in
                              enumerate(["Shares rose as the bank's profits beat forecasts.",
                                         "The striker scored twice in the cup final."])), encoding="utf-8")
    return corpus, write_config(tmp_path / "batch.json", cpu_actors=1)


def _sigterm_leaves_nothing(tiny_batch, until: str, watch_s: float, exit_s: float) -> None:
    corpus, config = tiny_batch
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = _docpilot_popen("batch", "--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate",
                           "--no-progress", env=env)
    seen: dict[int, tuple[str, float]] = {}
    try:
        watch_descendants(proc, until, watch_s, seen)
        assert any(_is_ray(name) for name, _ in seen.values())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=exit_s)
        assert proc.returncode == 130, out[-3000:]
        assert "error [interrupted]: stopped by SIGTERM" in out
        deadline = time.monotonic() + 10  # reparented processes may take a moment to be reaped
        while still_alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert still_alive(seen) == [], f"left behind after SIGTERM: {still_alive(seen)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_seen(seen)


def test_sigterm_while_ray_starts_leaves_no_ray_process(tiny_batch):
    """SIGTERM as soon as Ray's agents exist (inside ``ray.init``): exit 130, raylet/GCS/agents all gone."""
    _sigterm_leaves_nothing(tiny_batch, "ray::RuntimeEnvAgent", watch_s=120, exit_s=60)


@pytest.mark.engine  # about 45 s: an engine start to interrupt (its pilot twin, ~55 s, is in make test-slow)
@pytest.mark.slow  # about 60 s (make test-slow); the SIGTERM while Ray starts stays in make test
def test_sigterm_during_engine_start_leaves_no_ray_or_engine_process(tiny_batch):
    """SIGTERM once the actor's ``VLLM::EngineCore`` exists: exit 130, no worker or engine core survives."""
    _sigterm_leaves_nothing(tiny_batch, "VLLM::EngineCore", watch_s=240, exit_s=150)


