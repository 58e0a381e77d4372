"""The shard pool's rules, one by one, without Ray: fake actors, fake references, a hand-moved clock.

:class:`batch.pool.scheduler.ShardPool` makes every Ray call through a :class:`RayCalls`; here a
:class:`FakeCalls` stands in for it, so each rule (blame the running shard, requeue the one behind
it free, the retry limit, drop an unplaceable slot only while another works, the deadlines) is
driven directly. The same rules on a real local Ray: ``tests/ray/test_batch_ray.py``,
``tests/ray/test_batch_dead_engine.py``, ``tests/ray/test_batch_lost_node.py``.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from batch.pool.scheduler import IN_FLIGHT_PER_ACTOR, Deadlines, ShardPool, run_pool
from classify.errors import EngineError
from classify.records import Document


class ActorLost(Exception):
    """Stands in for ``ray.exceptions.RayActorError``."""


class TaskFailed(Exception):
    """Stands in for ``ray.exceptions.RayTaskError``."""


class Ref:
    """A fake object reference."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Ref({self.name})"


class FakeActor:
    """A fake actor handle: ``placed`` is what the GCS would say; ``fail`` maps shard index -> exception (once)."""

    def __init__(self, slot: int, placed: bool | None = True, fail: dict[int, BaseException] | None = None):
        self.slot, self.placed, self.fail = slot, placed, dict(fail or {})


class FakeCalls:
    """Records what the pool asks of Ray; a reference's value is set when it is made (or later by a test)."""

    failures = (ActorLost, TaskFailed)
    actor_lost = ActorLost

    def __init__(self) -> None:
        self.n = 0
        self.values: dict[Ref, object] = {}
        self.sent: list[tuple[FakeActor, int, Ref]] = []  # (actor, shard's first doc number, ref)
        self.killed: list[FakeActor] = []
        self.reaped: list[object] = []
        self.stop_timeouts: list[float | None] = []
        self.stops: set[Ref] = set()

    def _ref(self, kind: str) -> Ref:
        self.n += 1
        return Ref(f"{kind}-{self.n}")

    def info(self, actor: FakeActor) -> Ref:
        ref = self._ref("info")
        self.values[ref] = {"pid": 100 + actor.slot, "procs": []}
        return ref

    def classify(self, actor: FakeActor, docs: list[Document]) -> Ref:
        ref = self._ref("shard")
        index = int(docs[0].id.split("-")[1]) // 4
        self.values[ref] = actor.fail.pop(index) if index in actor.fail else [{"id": d.id} for d in docs]
        self.sent.append((actor, index, ref))
        return ref

    def shutdown(self, actor: FakeActor) -> Ref:
        ref = self._ref("stop")
        self.stops.add(ref)
        return ref

    def get(self, ref: Ref, timeout: float | None = None) -> object:
        if ref in self.stops:
            self.stop_timeouts.append(timeout)
        value = self.values.get(ref)
        if isinstance(value, BaseException):
            raise value
        return value

    def kill(self, actor: FakeActor) -> None:
        self.killed.append(actor)

    def placed(self, actor: FakeActor) -> bool | None:
        return actor.placed

    def reap(self, info: object) -> None:
        self.reaped.append(info)

    def wait(self, refs: list[Ref], timeout: float) -> list[Ref]:
        """Actors start first, then shards come back in submission order."""
        infos = [r for r in refs if r.name.startswith("info")]
        return (infos or refs)[:1]


class Clock:
    """Monotonic seconds moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LIMITS = Deadlines(shard_base_s=3.0, shard_per_doc_s=1.0, actor_start_s=60.0, actor_place_s=5.0)


def shards(n: int) -> list[tuple[int, list[Document]]]:
    docs = [Document(f"d-{i:04d}", "text", "", 4) for i in range(4 * n)]
    return [(i, docs[4 * i:4 * i + 4]) for i in range(n)]


def make_pool(n_actors: int = 1, n_shards: int = 3, retries: int = 2, actors: dict[int, FakeActor] | None = None,
              start: bool = True):
    """A pool over ``n_shards`` fake shards; ``start``: its actors started (not yet ready)."""
    calls, clock, done, events = FakeCalls(), Clock(), {}, []
    actors = actors or {}
    pool = ShardPool(lambda slot: actors.pop(slot, None) or FakeActor(slot), n_actors, shards(n_shards),
                     done.__setitem__, retries, on_event=lambda name, detail: events.append((name, detail)),
                     deadlines=LIMITS, calls=calls, clock=clock)
    if start:
        pool.open()
    return pool, calls, clock, done, events


def ready(pool: ShardPool, index: int = 0) -> None:
    """Slot ``index``'s actor reports it has started."""
    pool.on_ready(pool.slots[index].info_ref)


def queued(pool: ShardPool) -> list[int]:
    return [shard[0] for shard in pool.queue]


def in_flight(pool: ShardPool) -> list[int]:
    return [flight.shard[0] for flight in pool.inflight.values()]


def ref_of(pool: ShardPool, index: int) -> Ref:
    return next(r for r, f in pool.inflight.items() if f.shard[0] == index)


def test_dispatch_keeps_two_shards_in_flight_per_actor():
    pool, calls, *_ = make_pool(n_actors=2, n_shards=5)
    pool.dispatch()
    assert [s.load for s in pool.slots] == [IN_FLIGHT_PER_ACTOR] * 2 == [2, 2]
    assert [(a.slot, i) for a, i, _ in calls.sent] == [(0, 0), (0, 1), (1, 2), (1, 3)] and queued(pool) == [4]


def test_the_pool_has_at_most_one_actor_per_shard():
    pool, *_ = make_pool(n_actors=4, n_shards=2)
    assert len(pool.slots) == 2 and pool.stats.actors_started == 2


def test_a_lost_actor_blames_its_running_shard_and_requeues_the_one_behind_it_free():
    pool, calls, _, done, events = make_pool(n_shards=3)
    ready(pool)
    pool.dispatch()  # shards 0 (running) and 1 (behind it) on slot 0
    calls.values[ref_of(pool, 1)] = ActorLost("The actor died unexpectedly\nnode lost")  # collateral, seen first
    old = pool.slots[0]
    pool.on_result(ref_of(pool, 1))
    assert pool.attempts == {0: 1} and queued(pool) == [0, 1, 2] and pool.inflight == {}
    assert pool.stats.errors == ["shard 0: ActorLost: node lost"] and pool.stats.retries == 1
    assert events[-1] == ("retry", {"shard": 0, "error": "shard 0: ActorLost: node lost"})
    assert calls.killed == [old.actor] and calls.reaped == [{"pid": 100, "procs": []}]
    new = pool.slots[0]
    assert (new.generation, new.load, new.running_since, pool.stats.actors_started) == (1, 0, None, 2)
    assert new.actor is not old.actor and done == {}


def test_a_shard_whose_task_raised_is_blamed_itself():
    pool, calls, *_ = make_pool(n_shards=3)
    ready(pool)
    pool.dispatch()
    calls.values[ref_of(pool, 1)] = TaskFailed("EngineError: vLLM generate failed")
    pool.on_result(ref_of(pool, 1))
    assert pool.attempts == {1: 1} and queued(pool) == [1, 0, 2]  # the blamed first, the running one free
    assert pool.stats.errors == ["shard 1: TaskFailed: EngineError: vLLM generate failed"]


def test_an_error_without_text_is_named_by_its_type():
    pool, calls, *_ = make_pool(n_shards=1)
    pool.dispatch()
    calls.values[ref_of(pool, 0)] = TaskFailed("")
    pool.on_result(ref_of(pool, 0))
    assert pool.stats.errors == ["shard 0: TaskFailed: TaskFailed"]


def test_a_shard_over_its_retry_limit_stops_the_pool_with_the_first_error(caplog):
    pool, calls, *_ = make_pool(n_shards=1, retries=1)
    for attempt in (1, 2):
        ready(pool)
        pool.dispatch()
        calls.values[ref_of(pool, 0)] = TaskFailed(f"boom {attempt}")
        if attempt == 1:
            pool.on_result(ref_of(pool, 0))
    with pytest.raises(EngineError) as err:
        pool.on_result(ref_of(pool, 0))
    assert str(err.value) == ("shard 0: TaskFailed: boom 1; shard 0 failed 2 times (batch.max_shard_retries 1); "
                              "rerun the same batch id to resume")
    assert isinstance(err.value.__cause__, TaskFailed) and pool.stats.retries == 1
    assert "shard 0: TaskFailed: boom 2 (attempt 2 of 2)" in caplog.text
    assert len(calls.killed) == 1  # the last actor is left to close()


def test_a_reference_of_a_replaced_actor_is_ignored():
    pool, calls, _, done, _ = make_pool(n_shards=2)
    ready(pool)
    pool.dispatch()
    stale = ref_of(pool, 1)
    calls.values[ref_of(pool, 0)] = ActorLost("gone")
    pool.on_result(ref_of(pool, 0))
    pool.on_result(stale)  # the old actor's second shard: already requeued
    assert done == {} and queued(pool) == [0, 1] and pool.attempts == {0: 1}


def test_a_completed_shard_is_handed_on_and_restarts_the_actors_clock():
    pool, calls, clock, done, _ = make_pool(n_shards=2)
    ready(pool)
    pool.dispatch()
    clock.now += 8.0
    pool.on_result(ref_of(pool, 0))
    assert done == {0: [{"id": f"d-{i:04d}"} for i in range(4)]}
    assert pool.observed == 2.0 and pool.slots[0].running_since == clock.now and pool.slots[0].load == 1
    assert pool.stats.first_ready_s == 8.0
    clock.now += 4.0
    pool.on_result(ref_of(pool, 1))
    assert pool.observed == 2.0  # the slowest per-document time is kept


def test_an_actor_ready_only_starts_the_clock_of_its_own_generation():
    pool, calls, clock, _, events = make_pool(n_shards=2)
    old_info = pool.slots[0].info_ref
    pool.dispatch()
    calls.values[ref_of(pool, 0)] = ActorLost("gone")
    pool.on_result(ref_of(pool, 0))
    pool.on_ready(old_info)  # the dead actor's info answered late
    assert pool.slots[0].running_since is None
    assert events[-1] == ("actor-ready", {"slot": 0, "generation": 0, "pid": 100, "procs": []})
    ready(pool)
    assert pool.slots[0].running_since == clock.now


def test_an_actor_whose_info_fails_is_left_to_its_shards():
    pool, calls, _, _, events = make_pool(n_shards=1)
    calls.values[pool.slots[0].info_ref] = ActorLost("gone")
    ready(pool)
    assert pool.info_waiting == {} and events == [] and pool.slots[0].running_since is None


def test_an_unplaceable_slot_is_dropped_while_another_works(caplog):
    pool, calls, clock, _, events = make_pool(n_actors=2, n_shards=5, actors={1: FakeActor(1, placed=False)})
    ready(pool, 0)
    pool.dispatch()  # 0, 1 on slot 0; 2, 3 on slot 1
    clock.now += LIMITS.actor_place_s - 1
    pool.check_deadlines(clock.now)
    assert all(s.active for s in pool.slots)  # not yet
    clock.now += 2
    pool.check_deadlines(clock.now)
    unplaced = pool.slots[1]
    reason = ("engine actor could not be placed on any node within 5 s (batch.actor_place_timeout_s: no node has the "
              "free resources it asks for, e.g. a node was lost); slot dropped for this attempt")
    assert (unplaced.active, unplaced.load, calls.killed) == (False, 0, [unplaced.actor])
    assert queued(pool) == [2, 3, 4] and in_flight(pool) == [0, 1] and pool.attempts == {} and pool.stats.retries == 0
    assert pool.stats.dropped == [f"slot 1: {reason}"] and events[-1] == ("slot-dropped", {"slot": 1, "reason": reason})
    assert "the pool goes on with 1 actor(s)" in caplog.text
    pool.dispatch()
    assert in_flight(pool) == [0, 1] and [s.index for s in pool.live()] == [0]  # a dropped slot gets no shard


@pytest.mark.parametrize("other", [True, None])
def test_a_placed_or_unknown_actor_still_starting_counts_as_working(other):
    pool, _, clock, _, _ = make_pool(n_actors=2, actors={0: FakeActor(0, placed=other), 1: FakeActor(1, placed=False)})
    clock.now += LIMITS.actor_place_s + 1
    pool.check_deadlines(clock.now)
    assert [s.active for s in pool.slots] == [True, False]


def test_an_unplaceable_slot_is_kept_while_no_other_slot_works():
    pool, calls, clock, _, _ = make_pool(n_actors=2, actors={0: FakeActor(0, placed=False), 1: FakeActor(1, placed=False)})
    clock.now += LIMITS.actor_place_s + 1
    pool.check_deadlines(clock.now)
    assert all(s.active for s in pool.slots) and calls.killed == [] and pool.stats.dropped == []
    assert pool.next_wakeup(clock.now) == 10.0  # past the placement bound but kept: look again every 10 s


def test_an_actor_that_does_not_start_in_time_fails_its_running_shard():
    pool, calls, clock, *_ = make_pool(n_shards=2, retries=0, actors={0: FakeActor(0, placed=False)})
    pool.dispatch()
    clock.now += LIMITS.actor_start_s + 1
    with pytest.raises(EngineError, match=r"^shard 0: engine actor did not start within 60 s "
                                          r"\(batch.actor_start_timeout_s\); stuck actor killed; shard 0 failed 1 times"):
        pool.check_deadlines(clock.now)


def test_an_actor_that_does_not_start_with_nothing_in_flight_is_replaced_uncharged():
    pool, calls, clock, _, events = make_pool(n_shards=1)
    clock.now += LIMITS.actor_start_s + 1
    pool.check_deadlines(clock.now)
    assert pool.slots[0].generation == 1 and pool.attempts == {} and pool.stats.retries == 0 and events == []
    assert pool.slots[0].created_at == clock.now and len(calls.killed) == 1


def test_a_shard_past_its_bound_fails_its_actor():
    pool, calls, clock, *_ = make_pool(n_shards=2)
    ready(pool)
    pool.dispatch()
    bound = LIMITS.shard_s(4)
    assert bound == 7.0 and pool.next_wakeup(clock.now) == 7.0
    clock.now += bound
    pool.check_deadlines(clock.now)
    assert pool.attempts == {}
    clock.now += 0.5
    pool.check_deadlines(clock.now)
    assert pool.stats.errors == ["shard 0: engine stuck: no answer for 4 documents within 7 s "
                                 "(batch.shard_timeout_base_s + shard_timeout_per_doc_s x documents); actor killed"]
    assert queued(pool) == [0, 1] and pool.slots[0].generation == 1


def test_the_shard_bound_tightens_once_a_shard_was_timed():
    pool, calls, clock, *_ = make_pool(n_shards=3)
    ready(pool)
    pool.dispatch()
    clock.now += 0.2  # 0.05 s per document: at most 10 x 0.05 s per document now, not the configured 1 s
    pool.on_result(ref_of(pool, 0))
    assert pool.observed == pytest.approx(0.05) and pool.next_wakeup(clock.now) == pytest.approx(3.0 + 0.5 * 4)


def test_next_wakeup_watches_the_nearest_deadline():
    pool, _, clock, *_ = make_pool(n_actors=2, n_shards=4)
    assert pool.next_wakeup(clock.now) == LIMITS.actor_place_s  # both starting: the placement bound comes first
    clock.now += LIMITS.actor_place_s + 1
    assert pool.next_wakeup(clock.now) == 10.0
    ready(pool, 0)
    ready(pool, 1)
    assert pool.next_wakeup(clock.now) == 1.0  # started, nothing in flight: nothing to watch
    pool.dispatch()
    clock.now += 100
    assert pool.next_wakeup(clock.now) == 0.05  # overdue: check again at once


def test_run_finishes_every_shard_once_after_a_lost_actor():
    pool, calls, _, done, events = make_pool(n_actors=2, n_shards=5, actors={1: FakeActor(1, fail={2: ActorLost("x")})},
                                             start=False)
    stats = pool.run()
    assert sorted(done) == [0, 1, 2, 3, 4] and stats.retries == 1 and stats.actors_started == 3
    assert stats.errors == ["shard 2: ActorLost: x"] and stats.first_ready_s == 0.0
    assert calls.stop_timeouts == [60, 60] and len(calls.killed) == 1 + 2
    assert [name for name, _ in events].count("actor-ready") == 3


def test_run_after_an_error_stops_the_actors_without_waiting():
    calls = FakeCalls()
    with pytest.raises(EngineError, match="failed 1 times"):
        ShardPool(lambda slot: FakeActor(slot, fail={0: TaskFailed("no")}), 1, shards(1), lambda i, r: None, 0,
                  calls=calls, clock=Clock()).run()
    assert calls.stop_timeouts == [5] and len(calls.killed) == 1


def test_run_pool_takes_at_most_five_positional_arguments():
    with pytest.raises(TypeError):
        run_pool(FakeActor, 1, shards(1), lambda i, r: None, 0, None)  # type: ignore[misc]


POOL = Path(importlib.util.find_spec("batch.pool").submodule_search_locations[0])


def test_no_function_in_the_pool_is_long_or_takes_many_positional_parameters():
    """Every function body in ``batch/pool/`` is at most 80 lines and takes at most 5 positional parameters."""
    found = []
    for path in sorted(POOL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1
            lines = node.end_lineno - (body[1] if doc else body[0]).lineno + 1
            positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
            if lines > 80 or len(positional) > 5:
                found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines, {len(positional)} positional")
    assert found == []
