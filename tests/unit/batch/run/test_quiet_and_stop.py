"""Stopping ``docpilot batch`` leaves no Ray process behind; commands are quiet unless ``--verbose``; the bar shows docs/s.

The stop tests run the real command in a subprocess with a real local Ray and send it SIGTERM
(issue 12 item 10); the logging test runs a command that imports vLLM (issue 12, quiet output).

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_quiet_and_stop_ray.py``, ``tests/process/test_quiet_logs.py``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest


def test_local_ray_stop_of_a_joined_cluster_does_nothing():
    from batch.pool import local_ray as _ray_local

    assert _ray_local.stop(None) == []


def test_interrupts_turns_the_first_sigterm_into_interrupted_and_ignores_the_next():
    from batch.pool import local_ray as _ray_local
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
    from batch.run.progress import progress_bar

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

    from batch.pool.local_ray import terminate_then_kill

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


def test_the_bar_reads_100_percent_only_at_the_end_and_shows_the_steady_rate():
    """Issue 42 item 4: 333/334 is 99% (tqdm's rounding drew 100% twice at the end of a BBC batch)."""
    import io

    from batch.run.progress import progress_bar

    out = io.StringIO()
    bar = progress_bar(total=334, initial=0, desc="batch x", file=out)
    bar.show_steady((5.75, 1792.0))
    bar.update(333)
    bar.refresh()
    assert " 99%|" in out.getvalue().split("\r")[-1] and "steady 5.75 docs/s 1792 tokens/s" in out.getvalue()
    bar.update(1)
    bar.close()
    assert [p for p in out.getvalue().replace("\n", "\r").split("\r") if "100%" in p] == [
        p for p in out.getvalue().replace("\n", "\r").split("\r") if "334/334" in p]
