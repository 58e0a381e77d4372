"""A stalled store never holds a finished batch (issue 55): the real ``docpilot batch`` command (real Ray, the instant
stand-in engine) with an ``s3://`` export location whose endpoint accepts connections and never answers a byte
(:func:`tests.support.s3server.stalled_s3`).

* Its work done here, the batch ends within ``DOCPILOT_STORE_DEADLINE_S`` with its own state: exit 9, "done here, not
  yet off the pod", the command that finishes the copy later; the run folder holds the merged results.
* SIGTERM once the work is done (the driver waiting on the store) ends it within seconds, exit 130.

On the code before the fix the first ended with exit 6 (the export's own store error) and the second waited on the
uploader and the final progress mirror for a store call's whole budget and more.
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

from tests.support.s3server import stalled_s3

ROOT = Path(__file__).resolve().parents[2]
N_DOCS = 200

DRIVER = r'''
import sys
import batch.run.driver as d
from bench.instant_engine import remote_class
real = d.run_batch
d.run_batch = lambda options, **kw: real(options, _engine_actor=remote_class())
from docpilot.cli import main
sys.exit(main(["batch", *sys.argv[1:]]))
'''


def _start(tmp_path: Path, env: dict[str, str], batch_id: str, **extra: str) -> subprocess.Popen:
    from tests.support.corpora import write_config

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d-{i:04d}", "text": f"Shares rose {i} points."}) + "\n"
                              for i in range(N_DOCS)))
    config = write_config(tmp_path / "b.json", shard_docs=50, shard_target_bytes=100_000)
    run_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run_env.update(env, DOCPILOT_RUNS=str(tmp_path / "runs"), DOCPILOT_EXPORTS=str(tmp_path / "exports"),
                   PYTHONPATH=str(ROOT), **extra)
    args = ["--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--no-progress",
            "--batch-id", batch_id, "--export-dir", "s3://docpilot-stalled/exports"]
    return subprocess.Popen([sys.executable, "-c", DRIVER, *args], cwd=ROOT, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@pytest.mark.timeout(400)
def test_a_batch_done_here_ends_within_the_store_deadline_with_exit_9_and_the_command(tmp_path):
    with stalled_s3(timeout_s=2.0, attempts=2) as (env, _held):
        proc = _start(tmp_path, env, "stall9", DOCPILOT_STORE_DEADLINE_S="6")
        try:
            summary = tmp_path / "runs" / "stall9" / "summary.json"
            deadline = time.monotonic() + 300
            while not summary.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert summary.exists(), proc.communicate(timeout=30)[0][-4000:]
            t_done = time.monotonic()
            out, _ = proc.communicate(timeout=120)
            took = time.monotonic() - t_done
        finally:
            _stop(proc)
    assert proc.returncode == 9, out[-4000:]
    assert took < 6 + 15, took  # the deadline, and the process's own exit
    assert "error [offpod_pending]: batch stall9: done here, not yet off the pod: every shard is classified" in out
    assert "Finish the copy later (it re-checks what is there and sends the rest) with:\n  docpilot batch " in out
    assert "--batch-id stall9" in out.split("Finish the copy later")[1]
    assert "waits at most 6 s in all for the store (DOCPILOT_STORE_DEADLINE_S)" in out  # said at the start
    assert "done here; copying it off the pod to s3://docpilot-stalled/exports/stall9 (at most 6 s" in out
    rows = (tmp_path / "runs" / "stall9" / "results.jsonl").read_text().splitlines()
    assert len(rows) == N_DOCS  # the work is here, whole


@pytest.mark.timeout(400)
def test_sigterm_while_a_finished_batch_waits_on_the_store_ends_it_in_seconds(tmp_path):
    with stalled_s3(timeout_s=5.0, attempts=3) as (env, _held):
        proc = _start(tmp_path, env, "stall130")
        try:
            summary = tmp_path / "runs" / "stall130" / "summary.json"
            deadline = time.monotonic() + 300
            while not summary.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert summary.exists(), proc.communicate(timeout=30)[0][-4000:]
            time.sleep(1.0)  # inside the copy off the pod, waiting on the store
            assert proc.poll() is None
            t_term = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
            took = time.monotonic() - t_term
        finally:
            _stop(proc)
    assert proc.returncode == 130, out[-4000:]
    assert took < 8.0, took
    assert "already stopping" not in out
