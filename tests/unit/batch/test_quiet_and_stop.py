"""Stopping ``docpilot batch`` leaves no Ray process behind; commands are quiet unless ``--verbose``; the bar shows docs/s.

The stop tests run the real command in a subprocess with a real local Ray and send it SIGTERM
(issue 12 item 10); the logging test runs a command that imports vLLM (issue 12, quiet output).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
RAY_DAEMONS = ("raylet", "gcs_server")


def _docpilot_popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "docpilot", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env or os.environ.copy())


def _is_ray(name: str) -> bool:
    return name.startswith(("ray::", "VLLM::")) or name in RAY_DAEMONS


def _title(proc: psutil.Process) -> str:
    """``ray::RuntimeEnvAgent``, ``raylet``, ...: the process title (``name()`` is cut at 15 characters)."""
    cmdline = proc.cmdline()
    first = cmdline[0].split()[0] if cmdline and cmdline[0].strip() else proc.name()
    return first if "::" in first else os.path.basename(first)


def _watch(proc: subprocess.Popen, until: str, timeout_s: float, seen: dict[int, tuple[str, float]]) -> None:
    """Record descendants of ``proc`` in ``seen`` (pid -> (title, start time)) until one titled ``until`` exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            break
        for child in children:
            try:  # the latest title: Ray workers and vLLM's engine core start as "python", then retitle themselves
                seen[child.pid] = (_title(child), child.create_time())
            except psutil.Error:
                pass
        if any(name == until for name, _ in seen.values()):
            return
        time.sleep(0.1)
    proc.kill()
    out = proc.communicate()[0]
    pytest.fail(f"no {until} within {timeout_s} s (exit {proc.poll()}); seen {sorted({n for n, _ in seen.values()})}\n{out[-3000:]}")


def _alive(seen: dict[int, tuple[str, float]]) -> list[str]:
    left = []
    for pid, (name, created) in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{name} ({pid})")
        except psutil.Error:
            pass
    return left


def _kill(seen: dict[int, tuple[str, float]]) -> None:
    for pid, (_, created) in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()
        except psutil.Error:
            pass


@pytest.fixture
def tiny_batch(tmp_path):
    """A 2-document corpus and the shipped batch config with one CPU actor: ``(corpus, config)``."""
    from tests.test_batch_helpers import write_config

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
        _watch(proc, until, watch_s, seen)
        assert any(_is_ray(name) for name, _ in seen.values())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=exit_s)
        assert proc.returncode == 130, out[-3000:]
        assert "error [interrupted]: stopped by SIGTERM" in out
        deadline = time.monotonic() + 10  # reparented processes may take a moment to be reaped
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(seen) == [], f"left behind after SIGTERM: {_alive(seen)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill(seen)


@pytest.mark.ray
def test_sigterm_while_ray_starts_leaves_no_ray_process(tiny_batch):
    """SIGTERM as soon as Ray's agents exist (inside ``ray.init``): exit 130, raylet/GCS/agents all gone."""
    _sigterm_leaves_nothing(tiny_batch, "ray::RuntimeEnvAgent", watch_s=120, exit_s=60)


@pytest.mark.ray
@pytest.mark.engine
def test_sigterm_during_engine_start_leaves_no_ray_or_engine_process(tiny_batch):
    """SIGTERM once the actor's ``VLLM::EngineCore`` exists: exit 130, no worker or engine core survives."""
    _sigterm_leaves_nothing(tiny_batch, "VLLM::EngineCore", watch_s=240, exit_s=150)


def test_local_ray_stop_of_a_joined_cluster_does_nothing():
    from batch import _ray_local

    assert _ray_local.stop(None) == []


def test_interrupts_turns_the_first_sigterm_into_interrupted_and_ignores_the_next():
    from batch import _ray_local
    from classify.errors import Interrupted

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="^stopped by SIGTERM$"), _ray_local.interrupts():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up: ignored
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) == before


def test_progress_bar_shows_docs_per_second_below_one_doc_per_second():
    from batch._progress import progress_bar

    out = io.StringIO()
    bar = progress_bar(total=10, initial=0, desc="batch x", disable=False, file=out)
    bar.start_t -= 4.0  # 2 docs in about 4 s: 0.5 docs/s, where tqdm's default would show "2.00s/doc"
    bar.last_print_t -= 4.0
    bar.update(2)
    bar.refresh()
    bar.close()
    text = out.getvalue()
    assert "docs/s" in text and "s/doc" not in text, text
    assert "0.50docs/s" in text or "0.49docs/s" in text, text


QUIET_PROBE = """
import logging, sys
from docpilot import cli
verbose, rest = cli._verbose(sys.argv[1:])
cli.configure_logging(verbose)
from vllm.logger import init_logger  # vLLM configures its logging from VLLM_LOGGING_LEVEL at this import
init_logger("vllm.probe").info("vllm-info-line")
init_logger("vllm.probe").error("vllm-error-line")
logging.getLogger("ray.probe").warning("ray-warning-line")
logging.getLogger("docpilot.probe").info("docpilot-info-line")
from classify.config import EngineConfig, ModelConfig
from classify.device import engine_kwargs
from classify.model import ModelRef
print("tqdm-on-load", engine_kwargs(ModelRef("m", "/m", "sha256:0", "local"), ModelConfig(dtype="float32"), EngineConfig(), False,
                                    device="cpu")["use_tqdm_on_load"])
# what vLLM's engine processes print: a fresh interpreter (as its spawned engine core and worker) with a library's
# FutureWarning and vLLM's c10 NUMA-binding warning
import subprocess
subprocess.run([sys.executable, "-c", "import warnings; warnings.warn('a-future-warning', FutureWarning); "
                "import torch, vllm._C; torch.ops._C.init_cpu_memory_env([0])"], check=True)
"""


@pytest.mark.parametrize("args", [[], ["--verbose"], ["batch", "--verbose"]])
def test_third_party_logs_are_quiet_unless_verbose(args):
    env = {k: v for k, v in os.environ.items() if k not in ("DOCPILOT_VERBOSE", "VLLM_LOGGING_LEVEL", "RAY_LOGGER_LEVEL",
                                                            "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")}
    out = subprocess.run([sys.executable, "-c", QUIET_PROBE, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    verbose = "--verbose" in args
    assert ("vllm-info-line" in text) == verbose and ("ray-warning-line" in text) == verbose, text[-3000:]
    assert ("a-future-warning" in text) == verbose and ("NUMA binding" in text) == verbose, text[-3000:]
    assert f"tqdm-on-load {verbose}" in text, text[-3000:]
    assert "vllm-error-line" in text and "docpilot-info-line" in text  # errors and docpilot's own lines stay


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["batch", "--corpus", "x"], "", (False, ["batch", "--corpus", "x"])),
        (["--verbose", "batch"], "", (True, ["batch"])),
        (["batch", "--verbose", "--corpus", "x"], "", (True, ["batch", "--corpus", "x"])),
        (["batch", "--", "--verbose"], "", (False, ["batch", "--", "--verbose"])),
        (["pilot"], "1", (True, ["pilot"])),
    ],
)
def test_verbose_flag_before_or_after_the_command_or_env(monkeypatch, argv, env, expected):
    from docpilot.cli import _verbose

    monkeypatch.setenv("DOCPILOT_VERBOSE", env)
    assert _verbose(argv) == expected


def test_terminate_then_kill_stops_polite_and_stubborn_processes():
    import subprocess
    import sys

    import psutil

    from batch._ray_local import terminate_then_kill

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c",
                                 "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"  # its SIGTERM handler is in place
    procs = [psutil.Process(polite.pid), psutil.Process(stubborn.pid)]
    t0 = time.monotonic()
    assert terminate_then_kill(procs, grace_s=2) == []
    # psutil reaps its children and records how each ended (Popen.wait then only sees a reaped pid)
    assert [p.returncode for p in procs] == [-signal.SIGTERM, -signal.SIGKILL]
    assert time.monotonic() - t0 >= 2  # the stubborn one got its grace period before SIGKILL
