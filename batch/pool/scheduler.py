"""Private Ray machinery for ``make batch``: the shard scheduler over a pool of engine actors.

Each actor (:class:`batch.pool.actor.EngineActor`) builds the one vLLM classifier once and
classifies whole shards; actors are placed by :mod:`batch.pool.placement`. The scheduler keeps two shards in flight per actor (so an actor
never idles between shards), and when an actor fails it kills that actor, starts a fresh one
in its slot and queues the shard again, up to ``max_shard_retries`` times per shard. An actor
fails when:

* its process dies (killed, out of memory, node lost): Ray reports ``RayActorError``;
* its vLLM engine core dies: vLLM's offline ``LLM`` then blocks for ever in its output queue
  (``SyncMPClient.get_output``), so the actor watches its ``VLLM::`` child processes and
  exits itself (:meth:`batch.pool.actor.EngineActor._watch_engine`), which Ray reports as above;
* a shard task raises (vLLM failed): the whole shard is retried; engine errors are never
  written as reject reasons;
* its engine hangs: a shard runs longer than its bound (:class:`Deadlines`, from the shard's
  size) or the actor does not start in time; the driver kills it.

A slot whose actor cannot be placed (no node has the free resources it asks for, e.g. after a
node of the cluster was lost and its replacement waits for that node's CPUs or GPU) is dropped
after :attr:`Deadlines.actor_place_s` while other slots still work: the pool shrinks, the slot's
queued shards go back to the queue free, and the surviving actors finish the batch. With no
other slot left it waits up to ``actor_start_s`` like any actor that does not start.

An actor runs its shards one after the other, so when it fails, the shard it was running (the
earliest submitted) is charged the retry and the shard queued behind it is requeued free.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batch.pool.actor import reap
from batch.pool.placement import actor_placed
from classify.errors import EngineError
from classify.records import Document

log = logging.getLogger(__name__)

IN_FLIGHT_PER_ACTOR = 2
"""Shards queued on one actor at a time: one running, one waiting, so the engine never idles."""

@dataclass(frozen=True)
class Deadlines:
    """How long an engine actor may take before it counts as stuck (``batch.*_timeout_*`` settings).

    Attributes:
        shard_base_s: seconds any shard may run on a started engine.
        shard_per_doc_s: seconds added per document of the shard.
        actor_start_s: seconds from creating an actor until it has started its engine.
        actor_place_s: seconds an actor may wait to be placed on a node (Ray has not given it a
            worker process: no node has the resources it asks for) before its slot is dropped,
            when other slots still have a placed actor.
    """

    shard_base_s: float = 120.0
    shard_per_doc_s: float = 10.0
    actor_start_s: float = 1800.0
    actor_place_s: float = 120.0

    def shard_s(self, n_docs: int, observed_s_per_doc: float | None = None) -> float:
        """The bound in seconds for a shard of ``n_docs`` documents: ``base + per_doc x n``.

        Args:
            n_docs: documents in the shard.
            observed_s_per_doc: the slowest seconds per document seen on a completed shard of this
                batch, if any; then ``per_doc`` is at most ``OBSERVED_FACTOR`` times that, so a
                stuck engine on a fast card is found in minutes, not hours.
        """
        per_doc = self.shard_per_doc_s
        if observed_s_per_doc is not None:
            per_doc = min(per_doc, OBSERVED_FACTOR * observed_s_per_doc)
        return self.shard_base_s + per_doc * n_docs


OBSERVED_FACTOR = 10.0
"""A shard may take this many times the slowest per-document time seen so far (plus the base)."""


@dataclass
class PoolStats:
    """What the scheduler saw.

    Attributes:
        actors_started: actors created, replacements included.
        retries: shard re-runs after a failure.
        errors: the failures, first first (``shard N: <error>``).
        first_ready_s: seconds from pool start until the first shard came back (engine start + warm-up).
        dropped: slots given up because their actor could not be placed (``slot N: <why>``).
    """

    actors_started: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)
    first_ready_s: float | None = None
    dropped: list[str] = field(default_factory=list)


def run_pool(
    make_actor: Callable[[int], Any],
    n_actors: int,
    shards: list[tuple[int, list[Document]]],
    on_done: Callable[[int, list[dict[str, Any]]], None],
    max_shard_retries: int,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    deadlines: Deadlines | None = None,
) -> PoolStats:
    """Run shards over a pool of engine actors, retrying a failed shard on a fresh actor.

    Args:
        make_actor: creates the actor handle of one slot (``make_actor(slot)``, already
            ``.options(...).remote(...)``); a replacement actor gets the same slot.
        n_actors: pool size.
        shards: ``(shard index, documents)`` still to do; ``documents`` is a list, or an object with
            ``len()`` and ``load()`` that reads the list when the shard is dispatched (the driver then holds
            only the shards in flight).
        on_done: called in the driver with ``(index, result rows)`` as each shard completes.
        max_shard_retries: re-runs allowed per shard.
        on_event: optional callback ``(event, detail)`` for ``actor-ready`` (with :meth:`EngineActor.info`),
            ``retry`` (progress file) and ``slot-dropped`` (``{"slot", "reason"}``).
        deadlines: when an actor counts as stuck (default :class:`Deadlines`).

    Returns:
        :class:`PoolStats`.

    Raises:
        EngineError: a shard failed more than ``max_shard_retries + 1`` times (the first error is kept).
    """
    import ray

    stats = PoolStats()
    event = on_event or (lambda name, detail: None)
    limits = deadlines or Deadlines()
    t0 = time.monotonic()
    n_actors = max(1, min(n_actors, len(shards)))
    slots: list[list[Any]] = []  # [actor, generation]
    infos: dict[tuple[int, int], Any] = {}
    info_waiting: dict[Any, tuple[int, int]] = {}
    created_at = [0.0] * n_actors
    running_since: list[float | None] = [None] * n_actors  # engine started; the earliest shard in flight runs
    observed: list[float | None] = [None]  # slowest seconds per document on a completed shard
    active = [True] * n_actors  # False: the slot was dropped (its actor could not be placed)

    def start(slot: int, generation: int) -> Any:
        actor = make_actor(slot)
        stats.actors_started += 1
        infos[(slot, generation)] = actor.info.remote()
        info_waiting[infos[(slot, generation)]] = (slot, generation)
        created_at[slot], running_since[slot] = time.monotonic(), None
        return actor

    for slot in range(n_actors):
        slots.append([start(slot, 0), 0])
    queue = deque(shards)
    attempts: dict[int, int] = {}
    inflight: dict[Any, tuple[int, int, tuple[int, list[Document]]]] = {}  # in submission order
    load = [0] * n_actors

    def live() -> list[int]:
        return [slot for slot in range(n_actors) if active[slot]]

    def running_ref(slot: int) -> Any:
        return next((r for r, (s, g, _) in inflight.items() if s == slot and g == slots[slot][1]), None)

    def fail_slot(slot: int, blamed: tuple[int, list[Document]] | None, message: str, cause: BaseException | None) -> None:
        """Charge ``blamed`` one attempt, replace the slot's actor and queue all its shards again."""
        generation = slots[slot][1]
        mine = [(r, sh) for r, (s, g, sh) in inflight.items() if s == slot and g == generation]
        for r, _ in mine:
            inflight.pop(r)
        requeue = [sh for _, sh in mine if blamed is None or sh[0] != blamed[0]]
        if blamed is not None:
            index = blamed[0]
            attempts[index] = attempts.get(index, 0) + 1
            message = f"shard {index}: {message}"
            stats.errors.append(message)
            log.warning("%s (attempt %d of %d)", message, attempts[index], max_shard_retries + 1)
            if attempts[index] > max_shard_retries:
                raise EngineError(f"{stats.errors[0]}; shard {index} failed {attempts[index]} times "
                                  f"(batch.max_shard_retries {max_shard_retries}); rerun the same batch id to resume") from cause
            requeue.insert(0, blamed)
        ray.kill(slots[slot][0], no_restart=True)
        try:
            reap([ray.get(infos[(slot, generation)], timeout=5)])
        except Exception:  # noqa: BLE001 - the actor died before it could report; nothing to reap
            pass
        slots[slot] = [start(slot, generation + 1), generation + 1]
        load[slot] = 0
        queue.extendleft(reversed(requeue))
        if blamed is not None:
            stats.retries += 1
            event("retry", {"shard": blamed[0], "error": message})

    def drop_slot(slot: int, reason: str) -> None:
        """Give up ``slot`` for this attempt: kill its (unplaced) actor and queue its shards again, uncharged."""
        generation = slots[slot][1]
        mine = [(r, sh) for r, (s, g, sh) in inflight.items() if s == slot and g == generation]
        for r, _ in mine:
            inflight.pop(r)
        active[slot] = False
        load[slot] = 0
        ray.kill(slots[slot][0], no_restart=True)
        queue.extendleft(reversed([sh for _, sh in mine]))
        message = f"slot {slot}: {reason}"
        stats.dropped.append(message)
        log.warning("%s; the pool goes on with %d actor(s)", message, len(live()))
        event("slot-dropped", {"slot": slot, "reason": reason})

    def check_placement(now: float) -> None:
        """Drop slots whose actor has waited longer than ``actor_place_s`` for a node, while another slot has one."""
        waiting = [s for s in live() if running_since[s] is None and now - created_at[s] > limits.actor_place_s]
        if not waiting:
            return
        unplaced = [s for s in waiting if actor_placed(slots[s][0]) is False]
        if not unplaced:
            return
        others = [s for s in live() if s not in unplaced
                  and (running_since[s] is not None or actor_placed(slots[s][0]) is not False)]
        if not others:
            return  # nothing else could do the work: wait (actor_start_s still bounds it)
        for slot in unplaced:
            drop_slot(slot, f"engine actor could not be placed on any node within {limits.actor_place_s:g} s "
                      "(batch.actor_place_timeout_s: no node has the free resources it asks for, e.g. a node "
                      "was lost); slot dropped for this attempt")

    def check_deadlines(now: float) -> None:
        check_placement(now)
        for slot in live():
            ref = running_ref(slot)
            if running_since[slot] is None:
                if now - created_at[slot] > limits.actor_start_s:
                    blamed = inflight[ref][2] if ref is not None else None
                    fail_slot(slot, blamed, f"engine actor did not start within {limits.actor_start_s:g} s "
                              "(batch.actor_start_timeout_s); stuck actor killed", None)
            elif ref is not None:
                shard = inflight[ref][2]
                bound = limits.shard_s(len(shard[1]), observed[0])
                if now - running_since[slot] > bound:
                    fail_slot(slot, shard, f"engine stuck: no answer for {len(shard[1])} documents within "
                              f"{bound:g} s (batch.shard_timeout_base_s + shard_timeout_per_doc_s x documents); "
                              "actor killed", None)

    def next_wakeup(now: float) -> float:
        waits = []
        for slot in live():
            if running_since[slot] is None:
                waits.append(created_at[slot] + limits.actor_start_s - now)
                place_wait = created_at[slot] + limits.actor_place_s - now
                # past the placement bound but kept (no other live slot): look again every 10 s
                waits.append(place_wait if place_wait > 0 else 10.0)
            elif (ref := running_ref(slot)) is not None:
                waits.append(running_since[slot] + limits.shard_s(len(inflight[ref][2][1]), observed[0]) - now)
        return max(0.05, min(waits)) if waits else 1.0

    try:
        while queue or inflight:
            # every turn, not only when nothing came back: one busy actor must not hide another's deadline
            check_deadlines(time.monotonic())
            for slot in live():
                while queue and load[slot] < IN_FLIGHT_PER_ACTOR:
                    shard = queue.popleft()
                    docs = shard[1].load() if hasattr(shard[1], "load") else shard[1]  # read when dispatched
                    ref = slots[slot][0].classify.remote(docs)
                    del docs  # the actor's copy is in Ray's object store; the driver keeps only the reference
                    inflight[ref] = (slot, slots[slot][1], shard)
                    load[slot] += 1
            ready, _ = ray.wait([*inflight, *info_waiting], num_returns=1, timeout=next_wakeup(time.monotonic()))
            if not ready:
                continue
            ref = ready[0]
            if ref in info_waiting:  # an actor finished starting: report its processes (progress.json)
                slot, generation = info_waiting.pop(ref)
                try:
                    detail = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                    continue  # its shards fail too and are retried below
                if generation == slots[slot][1]:
                    running_since[slot] = time.monotonic()
                event("actor-ready", {"slot": slot, "generation": generation, **detail})
                continue
            if ref not in inflight:
                continue  # a ref of an actor already replaced
            slot, generation, shard = inflight[ref]
            try:
                rows = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                # an actor runs its tasks in submission order: when the actor is lost, the shard it was running
                # is the earliest submitted one still in flight on it (the others fail as collateral, free);
                # when a task raised, that shard is the one that failed
                running = running_ref(slot)
                blamed = inflight[running][2] if isinstance(err, ray.exceptions.RayActorError) and running else shard
                first_line = str(err).strip().splitlines()[-1][:500] if str(err).strip() else type(err).__name__
                fail_slot(slot, blamed, f"{type(err).__name__}: {first_line}", err)
                continue
            inflight.pop(ref)
            load[slot] -= 1
            now = time.monotonic()
            if running_since[slot] is not None and shard[1]:
                per_doc = (now - running_since[slot]) / len(shard[1])
                observed[0] = per_doc if observed[0] is None else max(observed[0], per_doc)
            running_since[slot] = now  # the next shard of this actor starts now
            if stats.first_ready_s is None:
                stats.first_ready_s = time.monotonic() - t0
            on_done(shard[0], rows)
    finally:
        # on an error or an interrupt (SIGTERM, Ctrl-C) an actor may still be loading its engine: do not wait for it
        stop_wait_s = 5 if sys.exc_info()[0] is not None else 60
        for slot, (actor, generation) in enumerate(slots):
            try:  # a clean engine stop; a dead actor's leftovers are reaped instead
                ray.get(actor.shutdown.remote(), timeout=stop_wait_s)
            except Exception:  # noqa: BLE001
                try:
                    reap([ray.get(infos[(slot, generation)], timeout=5)])
                except Exception:  # noqa: BLE001 - never started: nothing to reap
                    pass
            ray.kill(actor, no_restart=True)
    return stats
