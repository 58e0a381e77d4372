"""Slow batch tests on real Ray with the real engine: crash + resume, actor loss, ``docpilot submit`` (Ray job client), full corpus.

Run with ``make test-slow`` (``pytest -m slow tests/slow/test_batch_slow.py``). Each starts one vLLM
engine at a time (the crash test three in sequence) and cleans up every process it caused by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.corpora import ROOT, bbc_rows, kill_recorded, make_corpus, write_config

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.engine, pytest.mark.timeout(3600)]  # long tests: an hour each at most


def _progress(run: Path) -> dict:
    try:
        return json.loads((run / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"driver exited {proc.returncode} while waiting for {what}")
        time.sleep(1)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def _recorded_procs(run: Path) -> list[dict]:
    return [rec for actor in _progress(run).get("actors", []) for rec in actor.get("procs", [])]


def _alive(rec: dict) -> bool:
    import psutil

    try:
        return abs(psutil.Process(rec["pid"]).create_time() - rec["create_time"]) < 0.01
    except psutil.Error:
        return False


def test_sigkill_driver_and_actor_then_resume_gives_each_id_once(tmp_path, bbc_dir):
    import psutil

    from classify.paths import runs_dir
    from classify.runs.records import read_jsonl

    spec = make_corpus(tmp_path / "corpus", bbc_dir, 40)
    config = write_config(tmp_path / "batch.json", shard_docs=4)
    run = runs_dir() / "crash"
    cmd = [sys.executable, "-m", "docpilot", "batch", "--config", str(config), "--corpus", str(spec["path"]),
           "--batch-id", "crash", "--skip-pilot-gate", "--no-progress"]
    log1 = open(tmp_path / "attempt1.log", "w")
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT, start_new_session=True)
    seen: list[dict] = []
    tree: list = []
    try:
        # 1. an actor is killed mid-shard (two shards are queued on it): its shard is retried on a fresh actor
        first = _wait_for(lambda: (p := _progress(run)).get("done", 0) >= 4 and p.get("actors") and p, 900, "a first shard", driver)
        actor = first["actors"][0]
        seen += actor["procs"]
        os.kill(actor["pid"], signal.SIGKILL)
        after = _wait_for(lambda: (p := _progress(run)).get("retries", 0) >= 1
                          and any(a.get("generation") == 1 and a.get("procs") for a in p.get("actors", []))
                          and p["done"] >= first["done"] + 4 and p, 900, "a shard done by the fresh actor", driver)
        assert "shard" in after["last_error"] and "Actor" in after["last_error"]
        seen += _recorded_procs(run)
        # 2. the driver is killed with SIGKILL part-way (its local Ray goes with it)
        assert after["done"] < len(spec["ids"]), "the batch finished before the driver could be killed"
        tree = psutil.Process(driver.pid).children(recursive=True)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        log1.close()
    time.sleep(20)  # let Ray's fate sharing stop the killed driver's node processes
    ray_leftovers = [p for p in tree if p.is_running() and p.pid not in {r["pid"] for r in seen}]
    done_before = [int(p.stem) for p in (run / "shards").rglob("*.jsonl")]
    planned_shards = len(json.loads((run / "manifest.json").read_text())["shards"])
    assert 0 < len(done_before) < planned_shards and not (run / "summary.json").exists()
    # 3. the rerun with the same batch id finishes; every id exactly once
    killed_attempt = list(seen)
    try:
        again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert again.returncode == 0, again.stderr[-3000:]
        rerun = [rec for rec in _recorded_procs(run) if rec not in killed_attempt]
        seen += rerun
        rows = read_jsonl(run / "results.jsonl")
        assert sorted(r["id"] for r in rows) == sorted(spec["ids"])
        summary = json.loads((run / "summary.json").read_text())
        assert summary["accepted"] + summary["rejected"] == summary["total"] == len(spec["ids"])
        assert summary["attempts"] == 2
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["pilot_gate"]["override"] is True and "error" not in manifest["attempts"][1]
        planned = {s["index"]: s["n_docs"] for s in manifest["shards"]}
        assert summary["this_attempt"]["processed_docs"] == len(spec["ids"]) - sum(planned[i] for i in done_before)
        assert summary["this_attempt"]["processed_docs"] < len(spec["ids"])  # completed shards were not redone
        # 4. no engine process of the killed attempt is left running (the rerun reaps them before it starts) ...
        leftovers = [rec for rec in killed_attempt if _alive(rec)]
        assert leftovers == [], f"engine processes of the killed attempt left running: {leftovers}"
        # ... and the rerun's own actors and engines exit with it (Ray stops its worker processes asynchronously)
        deadline = time.monotonic() + 60
        while any(_alive(rec) for rec in rerun) and time.monotonic() < deadline:
            time.sleep(1)
        assert [rec for rec in rerun if _alive(rec)] == [], "the rerun's engine processes outlived it by 60 s"
    finally:
        kill_recorded(seen)
        for proc in ray_leftovers:
            if proc.is_running():
                proc.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head on 127.0.0.1 with dashboard + job server and token auth, owned by this test (stopped by pid)."""
    import psutil

    port, dash = _free_port(), _free_port()
    temp_dir = tempfile.mkdtemp(prefix="b4ray-", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    log = open(tmp_path / "ray-head.log", "w")
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
         "--port", str(port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
         "--include-dashboard", "true", "--temp-dir", temp_dir, "--num-cpus", "2", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 240
        while True:
            probe = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "list", "--address", address],
                                   env=env, capture_output=True, text=True, timeout=60)
            if probe.returncode == 0:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Ray head did not come up: {(tmp_path / 'ray-head.log').read_text()[-2000:]}")
            time.sleep(3)
        yield {"address": address, "env": env}
    finally:
        procs = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        _, alive = psutil.wait_procs(procs, timeout=20)
        for proc in alive:
            proc.kill()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_docpilot_submit_runs_the_batch_on_a_ray_head(tmp_path, bbc_dir, ray_head):
    from classify.paths import exports_dir, runs_dir
    from classify.runs.records import read_jsonl

    spec = make_corpus(tmp_path / "corpus", bbc_dir, 24)
    proc = subprocess.run(
        [sys.executable, "-m", "docpilot", "submit", "--address", ray_head["address"], "--corpus", str(spec["path"]),
         "--batch-id", "job1", "--skip-pilot-gate", "--python", sys.executable],
        cwd=ROOT, env=ray_head["env"], capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
    assert "working_dir" in proc.stdout and "results: " in proc.stdout
    assert "Job 'docpilot-job1' succeeded" in proc.stdout
    assert "export (SHA256SUMS verified)" in proc.stdout  # the job's own log, followed until it ended
    run = runs_dir() / "job1"
    rows = read_jsonl(run / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(spec["ids"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["accepted"] + summary["rejected"] == len(spec["ids"])
    assert (exports_dir() / "job1" / "SHA256SUMS").is_file()

    # a job that fails (unknown adapter: refused before any engine starts) makes `docpilot submit` fail too
    failed = subprocess.run(
        [sys.executable, "-m", "docpilot", "submit", "--address", ray_head["address"], "--corpus", str(spec["path"]),
         "--batch-id", "job2", "--adapter", "no-such-adapter@1", "--python", sys.executable],
        cwd=ROOT, env=ray_head["env"], capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1, (failed.stdout[-3000:], failed.stderr[-2000:])
    assert "Job 'docpilot-job2' failed" in failed.stdout and "no-such-adapter" in failed.stdout


def test_full_bbc_test_set_334_articles(tmp_path, bbc_dir):
    from classify.paths import runs_dir
    from classify.runs.records import read_jsonl

    spec = make_corpus(tmp_path / "corpus", bbc_dir, None)
    proc = subprocess.run(
        [sys.executable, "-m", "docpilot", "batch", "--config", str(ROOT / "config" / "docpilot.json"),
         "--corpus", str(spec["path"]), "--batch-id", "full", "--skip-pilot-gate", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(runs_dir() / "full" / "results.jsonl")
    assert len(bbc_rows(bbc_dir, None)) == 334
    assert sorted(r["id"] for r in rows) == sorted(spec["ids"])
    summary = json.loads((runs_dir() / "full" / "summary.json").read_text())
    assert summary["accepted"] + summary["rejected"] == summary["total"] == 334 + 7
    labels = spec["labels"]
    hits = sum(r.get("category") == labels[r["id"]] for r in rows if r["id"] in labels)
    assert hits / 333 > 0.25  # above chance (0.2): SmolLM2-135M base model without adapter gets ~0.35
