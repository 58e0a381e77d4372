"""A dead or stuck engine is an actor failure: detected, the actor replaced, the shard retried whole.

Fast tests drive the real Ray scheduler (:func:`batch._pool.run_pool`) with stand-in actors that
hang, hang at start or raise; the slow test runs ``docpilot batch`` with the real vLLM engine and
kills (``SIGKILL``) or freezes (``SIGSTOP``) its ``VLLM::EngineCore`` process part-way, then checks
that the batch finishes with results equal to an uninterrupted run.
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

from classify.errors import EngineError
from classify.records import Document
from tests.answers import assert_same_answers, score_tolerance
from tests.test_batch_helpers import (
    ROOT,
    fake_shards,
    kill_recorded,
    local_ray_session,
    make_corpus,
    write_config,
)

pytestmark = pytest.mark.ray


class StuckOrFailingActor:
    """A stand-in engine actor: ``mode`` decides how the first try of shard 1 (ids d-0004..) goes wrong."""

    def __init__(self, marker_dir: str, mode: str):
        self.marker = Path(marker_dir) / f"{mode}-once"
        self.mode = mode
        if mode == "hang-at-start" and not self.marker.exists():
            self.marker.touch()
            time.sleep(3600)  # an engine that never finishes loading

    def info(self) -> dict:
        return {"pid": os.getpid(), "procs": []}

    def classify(self, docs: list[Document]) -> list[dict]:
        if docs[0].id == "d-0004" and not self.marker.exists():
            self.marker.touch()
            if self.mode == "hang":
                time.sleep(3600)  # an engine that stopped answering
            if self.mode == "raise":
                raise EngineError("vLLM generate failed: EngineDeadError: engine core died")
        return [{"id": d.id, "status": "accepted", "category": "tech", "n_tokens": 1} for d in docs]

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def local_ray():
    yield from local_ray_session(sys.modules[__name__])


@pytest.mark.parametrize("mode, message", [
    ("hang", "engine stuck: no answer for 4 documents within"),
    ("hang-at-start", "engine actor did not start within 20 s"),
    ("raise", "EngineDeadError"),
])
def test_a_stuck_or_failing_engine_is_replaced_and_its_shard_retried_whole(local_ray, tmp_path, mode, message):
    from batch._pool import Deadlines, run_pool

    remote = local_ray.remote(max_restarts=0)(StuckOrFailingActor).options(num_cpus=0.5)
    done: dict[int, list] = {}
    t0 = time.monotonic()
    stats = run_pool(lambda slot: remote.remote(str(tmp_path), mode), 1, fake_shards(), done.__setitem__, 2,
                     deadlines=Deadlines(shard_base_s=1.0, shard_per_doc_s=0.5, actor_start_s=20.0))
    assert time.monotonic() - t0 < 120
    ids = [r["id"] for i in sorted(done) for r in done[i]]
    assert ids == [f"d-{i:04d}" for i in range(12)]  # each id exactly once, none rejected with an engine error
    assert all(r["status"] == "accepted" for rows in done.values() for r in rows)
    assert stats.retries == 1 and stats.actors_started == 2
    assert message in stats.errors[0]


def test_a_shard_that_always_hangs_stops_the_batch_resumable(local_ray, tmp_path):
    from batch._pool import Deadlines, run_pool

    class AlwaysHangs(StuckOrFailingActor):
        def classify(self, docs):
            time.sleep(3600)

    remote = local_ray.remote(max_restarts=0)(AlwaysHangs).options(num_cpus=0.5)
    with pytest.raises(EngineError, match=r"engine stuck.*failed 2 times \(batch.max_shard_retries 1\); rerun"):
        run_pool(lambda slot: remote.remote(str(tmp_path), "none"), 1, fake_shards()[:1], lambda i, r: None, 1,
                 deadlines=Deadlines(shard_base_s=1.0, shard_per_doc_s=0.0, actor_start_s=60.0))


def test_deadline_grows_with_the_shard_size():
    from batch._pool import Deadlines

    d = Deadlines(shard_base_s=120, shard_per_doc_s=10)
    assert (d.shard_s(0), d.shard_s(16), d.shard_s(1000)) == (120, 280, 10_120)
    # once a shard has completed, a fast engine (1 ms/doc on a card) gets a tighter bound: 10x the slowest seen
    assert d.shard_s(1000, observed_s_per_doc=0.001) == pytest.approx(130)
    assert d.shard_s(1000, observed_s_per_doc=5.0) == 10_120  # never looser than the configured bound


def _progress(run: Path) -> dict:
    try:
        return json.loads((run / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _engine_core(progress: dict):
    import psutil

    for actor in progress.get("actors", []):
        for rec in actor.get("procs", []):
            try:
                proc = psutil.Process(rec["pid"])
                if "EngineCore" in f"{proc.name()} {' '.join(proc.cmdline())}":
                    return proc
            except psutil.Error:
                continue
    return None


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["engine-killed", "engine-frozen"])
def test_real_batch_survives_a_dead_or_frozen_engine_core(tmp_path, bbc_dir, engine, sig):
    from batch._config import load_batch_config
    from batch.corpus import read_corpus
    from classify.paths import runs_dir
    from classify.runrecords import read_jsonl

    spec = make_corpus(tmp_path / "corpus", bbc_dir, 20)
    config = write_config(tmp_path / "batch.json", shard_docs=4, shard_timeout_base_s=30, shard_timeout_per_doc_s=5)
    batch_id = f"dead-engine-{sig.name.lower()}"
    run = runs_dir() / batch_id
    cmd = [sys.executable, "-m", "docpilot", "batch", "--config", str(config), "--corpus", str(spec["path"]),
           "--batch-id", batch_id, "--skip-pilot-gate", "--no-progress"]
    log = open(tmp_path / "batch.log", "w")
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            progress = _progress(run)
            core = _engine_core(progress) if progress.get("done", 0) >= 4 else None
            if core is not None or driver.poll() is not None:
                break
            time.sleep(0.5)
        assert core is not None, f"no engine core seen; driver exit {driver.poll()}"
        seen += [rec for a in progress["actors"] for rec in a["procs"]]
        os.kill(core.pid, sig)
        assert driver.wait(timeout=900) == 0, (tmp_path / "batch.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
        seen += [rec for a in _progress(run).get("actors", []) for rec in a.get("procs", [])]
        kill_recorded(seen)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["this_attempt"]["retries"] >= 1
    want = "engine stuck" if sig == signal.SIGSTOP else "Actor"
    assert want in summary["this_attempt"]["errors"][0]
    rows = read_jsonl(run / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(spec["ids"])
    assert not any("engine" in (r.get("reason") or "") for r in rows)
    # equal to an uninterrupted run: the same documents through the session's engine (float32: to rounding;
    # bfloat16 on AMX Xeons: a batch's products depend on which prompts share it, so a near tie may swap)
    cfg = load_batch_config(config)
    corpus = read_corpus(cfg.corpus, cfg.classify.max_doc_bytes, spec["path"])
    assert_same_answers(engine.classify(list(corpus.docs)), rows, score_tolerance(cfg.model),
                        min_clear=len([r for r in rows if r["status"] == "accepted"]) // 2)
