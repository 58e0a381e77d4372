"""The batch lives off the pod (issue 38): complete shards copied to the S3 export location as they complete.

A real driver process (real Ray, the instant stand-in engine, its shard writes slowed so the batch lasts a few
seconds) runs with an ``s3://`` export location on moto's S3 server (127.0.0.1):

* pod loss: the driver and every process under it are SIGKILLed once some shards are safe off the pod, the whole
  local run folder is deleted, and ``--resume-from s3://.../<batch-id>`` in a fresh runs folder finishes the batch:
  every id exactly once, no shard that was copied computed again, the export re-check green;
* a store that fails every upload for a while (the server stopped, then started again on the same port) slows only
  the copy: shards keep being written meanwhile, the lag shows in ``progress.json``, and the batch exports once the
  store is back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "docpilot-offpod-test"
N_DOCS = 600
SHARD_DOCS = 20  # 30 shards
STALE_S = 3.0  # an owner record's heartbeat counts as stale after this (batch.run.owner.STALE_AFTER_S in the tests)

DRIVER = r'''
import json, logging, sys, time
logging.basicConfig(level=logging.INFO)
slow = float(sys.argv[1])
if slow:
    import batch.run.attempt as a
    real = a.write_bytes_atomic
    def write(path, data):
        real(path, data)
        if "shards" in str(path):
            time.sleep(slow)  # a shard takes a while, as a real engine's does
    a.write_bytes_atomic = write
import os
import batch.run.offpod as o
o.RETRY_FIRST_S, o.RETRY_MAX_S = 0.2, 1.0
import batch.run.owner as ow
ow.STALE_AFTER_S = float(os.environ.get("TEST_OWNER_STALE_S", ow.STALE_AFTER_S))  # a gone pod's claim, soon stale
from batch.run.driver import parse_args, run_batch
from bench.instant_engine import remote_class
summary = run_batch(parse_args(sys.argv[2:]), _engine_actor=remote_class())
print("PROCESSED", summary["this_attempt"]["processed_docs"])
print("EXPORT", summary["export_dir"])
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Moto:
    """moto's S3 server on a fixed port of 127.0.0.1 that can be stopped and started again (its buckets are kept)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = _free_port()
        self._cls = ThreadedMotoServer
        self.server = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        self.server.stop()


@pytest.fixture
def s3(monkeypatch):
    moto = _Moto()
    moto.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto.url}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    try:
        yield moto, fs
    finally:
        try:
            moto.stop()
        except Exception:  # noqa: BLE001 - already stopped by the test
            pass
        s3fs.S3FileSystem.clear_instance_cache()


def _setup(tmp_path: Path, name: str):
    from tests.support.corpora import write_config

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d-{i:04d}", "text": f"Shares rose {i} points."}) + "\n"
                              for i in range(N_DOCS)))
    config = write_config(tmp_path / "b.json", shard_docs=SHARD_DOCS, shard_target_bytes=100_000)
    export_root = f"s3://{BUCKET}/{name}"
    args = ["--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--no-progress"]
    return args, export_root


def _env(runs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(DOCPILOT_RUNS=str(runs), DOCPILOT_EXPORTS=str(runs.parent / "exports"), PYTHONPATH=str(ROOT),
               AWS_MAX_ATTEMPTS="2", AWS_RETRY_MODE="standard", TEST_OWNER_STALE_S=str(STALE_S))
    return env


def _ledger(fs, dest: str) -> dict[str, str]:
    fs.invalidate_cache()
    try:
        text = fs.cat_file(f"{dest.removeprefix('s3://')}/offpod.sha256").decode()
    except FileNotFoundError:
        return {}
    return {rel: h for h, _, rel in (line.partition("  ") for line in text.splitlines()) if rel}


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and every process under it (Ray's raylet, workers, the actors), by pid."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(procs, timeout=30)


def _start_slow_batch(args: list[str], batch_id: str, export_root: str, runs) -> subprocess.Popen:
    """The driver waiting 0.4 s after each shard it writes (a real engine's pace), copying to ``export_root``."""
    return subprocess.Popen([sys.executable, "-c", DRIVER, "0.4", *args, "--batch-id", batch_id, "--export-dir",
                             export_root], cwd=ROOT, env=_env(runs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait_for_ledger(proc: subprocess.Popen, fs, dest: str, n: int, timeout_s: float = 240) -> None:
    """Wait until the store's ledger at ``dest`` lists ``n`` shards (the batch still running)."""
    deadline = time.monotonic() + timeout_s
    while len(_ledger(fs, dest)) < n:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"no {n} shards off the pod within {timeout_s:.0f} s"
        time.sleep(0.2)


def test_pod_loss_resumes_from_the_s3_copy_every_id_exactly_once(tmp_path, s3):
    from batch.run.export import check_export
    from classify.runs.export import verify_export

    moto, fs = s3
    args, export_root = _setup(tmp_path, "podloss")
    dest = f"{export_root}/lost"
    runs = tmp_path / "runs"
    proc = _start_slow_batch(args, "lost", export_root, runs)
    try:
        _wait_for_ledger(proc, fs, dest, 4)
    finally:
        _kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    safe = _ledger(fs, dest)  # what the store holds once the pod is gone
    n_shards = len(json.loads(fs.cat_file(f"{dest.removeprefix('s3://')}/manifest.json"))["shards"])
    assert 4 <= len(safe) < n_shards, len(safe)
    assert not fs.exists(f"{dest.removeprefix('s3://')}/SHA256SUMS")
    from batch.lot.status import remote_status

    st = remote_status(dest)  # from any machine: how much is safe off the pod
    assert st["off_pod"]["shards_safe"] == len(safe) and st["off_pod"]["shards_total"] == n_shards
    shutil.rmtree(runs)  # the pod's disk is gone

    fresh = tmp_path / "new-pod" / "runs"
    refused = subprocess.run([sys.executable, "-c", DRIVER, "0", *args, "--resume-from", dest], cwd=ROOT,
                             env=_env(fresh), capture_output=True, text=True, timeout=400)
    assert refused.returncode != 0  # the killed pod's claim is there: taken over only on purpose
    assert "is owned by another driver: batch lost on host" in refused.stderr, refused.stderr[-3000:]
    assert "--take-over-export" in refused.stderr and _ledger(fs, dest) == safe
    assert not (fresh / "lost" / "manifest.json").exists()  # refused before anything was restored
    time.sleep(STALE_S + 1)  # the killed pod's heartbeat is stale now
    resumed = subprocess.run([sys.executable, "-c", DRIVER, "0", *args, "--resume-from", dest, "--take-over-export"],
                             cwd=ROOT, env=_env(fresh), capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "--take-over-export given: taking over" in resumed.stderr
    assert f"{len(safe)} of {n_shards} shards verified" in resumed.stderr
    manifest = json.loads((fresh / "lost" / "manifest.json").read_text())
    copied_docs = sum(s["n_docs"] for s in manifest["shards"] if f"shards/000/{s['index']:06d}.jsonl" in safe)
    processed = int(resumed.stdout.split("PROCESSED ")[1].split()[0])
    assert processed == N_DOCS - copied_docs  # no copied shard computed again
    rows = [json.loads(line) for line in (fresh / "lost" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"d-{i:04d}" for i in range(N_DOCS)]  # exactly once
    assert verify_export(dest, check_export) == []  # the export re-check, read back from the store
    assert len(_ledger(fs, dest)) == n_shards


@pytest.mark.slow  # about 22 s (make test-slow); the pod-loss resume from the S3 copy stays in make test
def test_resume_from_refuses_another_corpus(tmp_path, s3):
    moto, fs = s3
    args, export_root = _setup(tmp_path, "refuse")
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-c", DRIVER, "0", *args, "--batch-id", "b1", "--export-dir", export_root],
                          cwd=ROOT, env=_env(runs), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": f"x-{i}", "text": "other"}) + "\n" for i in range(50)))
    i = args.index("--corpus")
    changed = [*args[:i + 1], str(other), *args[i + 2:]]
    refused = subprocess.run([sys.executable, "-c", DRIVER, "0", *changed, "--resume-from", f"{export_root}/b1"],
                             cwd=ROOT, env=_env(tmp_path / "pod2" / "runs"), capture_output=True, text=True, timeout=400)
    assert refused.returncode != 0
    assert "cannot resume: corpus changed" in refused.stderr, refused.stderr[-3000:]


@pytest.mark.slow  # about 50 s (make test-slow); the pod-loss resume from the S3 copy stays in make test
def test_a_store_down_for_a_while_slows_only_the_copy(tmp_path, s3):
    from batch.run.export import check_export
    from batch.runfiles import ProgressFile
    from classify.runs.export import verify_export

    moto, fs = s3
    args, export_root = _setup(tmp_path, "outage")
    dest = f"{export_root}/down"
    runs = tmp_path / "runs"
    proc = _start_slow_batch(args, "down", export_root, runs)
    try:
        _wait_for_ledger(proc, fs, dest, 2)
        moto.stop()
        progress = runs / "down" / "progress.json"
        done_at_stop = ProgressFile.read(progress).done
        seen: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # shards go on being written while every copy fails
            time.sleep(0.5)
            p = ProgressFile.read_or_none(progress)
            if p and p.offpod and p.offpod["errors"] >= 1 and p.offpod["shards_pending"] >= 3 and p.done >= done_at_stop + 3 * SHARD_DOCS:
                seen = p.offpod
                break
        assert seen, ProgressFile.read(progress).offpod
        assert seen["oldest_pending_s"] > 0 and seen["last_error"]
        assert proc.poll() is None  # the batch did not stop for the store
        moto.start()
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "off the pod: copying to" in out and "failed" in out
    assert verify_export(dest, check_export) == []
    n_shards = len(json.loads(fs.cat_file(f"{dest.removeprefix('s3://')}/manifest.json"))["shards"])
    assert len(_ledger(fs, dest)) == n_shards
