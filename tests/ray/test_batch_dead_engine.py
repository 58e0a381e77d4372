"""A dead or stuck engine is an actor failure: detected, the actor replaced, the shard retried whole.

These tests drive the real Ray scheduler (:func:`batch.pool.scheduler.run_pool`) with stand-in actors that
hang, hang at start or raise. The real vLLM engine core killed or frozen part-way through a real
batch is ``tests/slow/test_batch_dead_engine_core.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from classify.errors import EngineError
from classify.records import Document
from tests.support.corpora import (
    fake_shards,
    output_rows,
)


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

    def classify(self, docs: list[Document]) -> object:
        if docs[0].id == "d-0004" and not self.marker.exists():
            self.marker.touch()
            if self.mode == "hang":
                time.sleep(3600)  # an engine that stopped answering
            if self.mode == "raise":
                raise EngineError("vLLM generate failed: EngineDeadError: engine core died")
        # what the engine actor returns, imported in the Ray worker
        from batch.corpus.shard import ShardOutput
        from classify.records import Result

        return ShardOutput.of([Result(id=d.id, status="accepted", category="tech", n_tokens=1) for d in docs])

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("mode, message", [
    ("hang", "engine stuck: no answer for 4 documents within"),
    # waits out the 20 s start bound (make test-slow); the start deadline's rule is in tests/unit/batch/pool
    pytest.param("hang-at-start", "engine actor did not start within 20 s", marks=pytest.mark.slow),
    ("raise", "EngineDeadError"),
])
def test_a_stuck_or_failing_engine_is_replaced_and_its_shard_retried_whole(local_ray, tmp_path, mode, message):
    from batch.pool.scheduler import Deadlines, run_pool

    remote = local_ray.remote(max_restarts=0)(StuckOrFailingActor).options(num_cpus=0.5)
    done: dict[int, list] = {}
    t0 = time.monotonic()
    stats = run_pool(lambda slot: remote.remote(str(tmp_path), mode), 1, fake_shards(), done.__setitem__, 2,
                     deadlines=Deadlines(shard_base_s=1.0, shard_per_doc_s=0.5, actor_start_s=20.0))
    assert time.monotonic() - t0 < 120
    ids = [r["id"] for i in sorted(done) for r in output_rows(done[i])]
    assert ids == [f"d-{i:04d}" for i in range(12)]  # each id exactly once, none rejected with an engine error
    assert all(r["status"] == "accepted" for out in done.values() for r in output_rows(out))
    assert stats.retries == 1 and stats.actors_started == 2
    assert message in stats.errors[0]


def test_a_shard_that_always_hangs_stops_the_batch_resumable(local_ray, tmp_path):
    from batch.pool.scheduler import Deadlines, run_pool

    class AlwaysHangs(StuckOrFailingActor):
        def classify(self, docs):
            time.sleep(3600)

    remote = local_ray.remote(max_restarts=0)(AlwaysHangs).options(num_cpus=0.5)
    with pytest.raises(EngineError, match=r"engine stuck.*failed 2 times \(batch.max_shard_retries 1\); rerun"):
        run_pool(lambda slot: remote.remote(str(tmp_path), "none"), 1, fake_shards()[:1], lambda i, r: None, 1,
                 deadlines=Deadlines(shard_base_s=1.0, shard_per_doc_s=0.0, actor_start_s=60.0))


def test_deadline_grows_with_the_shard_size():
    from batch.pool.scheduler import Deadlines

    d = Deadlines(shard_base_s=120, shard_per_doc_s=10)
    assert (d.shard_s(0), d.shard_s(16), d.shard_s(1000)) == (120, 280, 10_120)
    # once a shard has completed, a fast engine (1 ms/doc on a card) gets a tighter bound: 10x the slowest seen
    assert d.shard_s(1000, observed_s_per_doc=0.001) == pytest.approx(130)
    assert d.shard_s(1000, observed_s_per_doc=5.0) == 10_120  # never looser than the configured bound
