"""A slot whose actor cannot be placed is dropped and the others finish; a lost actor's replacement too.

These tests drive the real Ray scheduler (:func:`batch.pool.scheduler.run_pool`) on a local Ray with
stand-in actors; "cannot be placed" is an actor asking for a custom resource no node has. A real
two-node cluster losing its second node part-way is ``tests/slow/test_batch_node_lost.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from classify.errors import EngineError
from classify.records import Document
from tests.support.corpora import output_rows

NOWHERE = {"lost-node": 1}
"""A custom resource no node offers: an actor asking for it is never placed (like one waiting for a lost node)."""


class StandInActor:
    """A stand-in engine actor; with ``die_on`` it exits (as if its node were lost) on that shard, once."""

    def __init__(self, marker_dir: str, die_on: str | None = None):
        self.marker = Path(marker_dir) / "died-once"
        self.die_on = die_on

    def info(self) -> dict:
        return {"pid": os.getpid(), "procs": []}

    def classify(self, docs: list[Document]) -> object:
        if docs[0].id == self.die_on and not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        time.sleep(0.5)  # slower than Ray needs to report a death, so the lost shards are requeued mid-batch
        # what the engine actor returns, imported in the Ray worker
        from batch.corpus.shard import ShardOutput
        from classify.records import Result

        return ShardOutput.of([Result(id=d.id, status="accepted", category="tech", n_tokens=1) for d in docs])


def _shards(n: int = 6) -> list[tuple[int, list[Document]]]:
    docs = [Document(f"d-{i:04d}", "text", "", 4) for i in range(4 * n)]
    return [(i, docs[4 * i:4 * i + 4]) for i in range(n)]


def test_a_slot_whose_actor_cannot_be_placed_is_dropped_and_the_others_finish(local_ray, tmp_path):
    from batch.pool.scheduler import Deadlines, run_pool

    remote = local_ray.remote(StandInActor)
    done: dict = {}
    events: list = []
    t0 = time.monotonic()
    stats = run_pool(lambda slot: remote.options(num_cpus=1, resources=NOWHERE if slot == 1 else None).remote(str(tmp_path)),
                     2, _shards(), done.__setitem__, 2, on_event=lambda name, detail: events.append(name),
                     deadlines=Deadlines(shard_base_s=30, shard_per_doc_s=0, actor_start_s=600, actor_place_s=3))
    assert sorted(done) == list(range(6)) and time.monotonic() - t0 < 120
    assert sorted(r["id"] for out in done.values() for r in output_rows(out)) == [f"d-{i:04d}" for i in range(24)]
    assert len(stats.dropped) == 1 and stats.dropped[0].startswith("slot 1: ") and "could not be placed" in stats.dropped[0]
    assert stats.retries == 0 and stats.errors == [] and "slot-dropped" in events


def test_a_lost_actors_replacement_that_cannot_be_placed_is_dropped(local_ray, tmp_path):
    """The node-loss case: slot 1's actor dies mid-shard, its replacement finds no node; slot 0 finishes."""
    from batch.pool.scheduler import Deadlines, run_pool

    remote = local_ray.remote(StandInActor)
    made: list[int] = []

    def make_actor(slot: int):
        made.append(slot)
        if slot == 1 and made.count(1) > 1:  # the replacement: the lost node's CPU is gone
            return remote.options(num_cpus=1, resources=NOWHERE).remote(str(tmp_path))
        return remote.options(num_cpus=1).remote(str(tmp_path), "d-0008" if slot == 1 else None)

    done: dict = {}
    stats = run_pool(make_actor, 2, _shards(10), done.__setitem__, 2,
                     deadlines=Deadlines(shard_base_s=30, shard_per_doc_s=0, actor_start_s=600, actor_place_s=3))
    assert sorted(done) == list(range(10))
    ids = [r["id"] for out in done.values() for r in output_rows(out)]
    assert sorted(ids) == [f"d-{i:04d}" for i in range(40)] and len(ids) == len(set(ids))
    assert stats.retries == 1 and stats.errors[0].startswith("shard 2: ")  # slot 1 runs shards 2 and 3 first
    assert stats.actors_started == 3 and len(stats.dropped) == 1


def test_an_unplaceable_actor_is_not_dropped_when_no_other_slot_works(local_ray, tmp_path):
    """With nothing else to do the work, the slot is kept; actor_start_timeout_s stops the batch resumable."""
    from batch.pool.scheduler import Deadlines, run_pool

    remote = local_ray.remote(StandInActor)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not start within 4 s"):
        run_pool(lambda slot: remote.options(num_cpus=1, resources=NOWHERE).remote(str(tmp_path)), 1, _shards(2),
                 lambda i, r: None, 0, deadlines=Deadlines(shard_base_s=30, shard_per_doc_s=0, actor_start_s=4, actor_place_s=1))
    assert time.monotonic() - t0 < 60
