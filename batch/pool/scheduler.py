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

:class:`ShardPool` holds the pool's state (a :class:`Slot` per actor, the :class:`Flight` of each shard
in flight, the queue and the retry counts) and has one method per rule: :meth:`ShardPool.blame`,
:meth:`ShardPool.charge`, :meth:`ShardPool.on_failure`, :meth:`ShardPool.drop_slot`,
:meth:`ShardPool.check_placement`, :meth:`ShardPool.check_deadlines`. It makes every Ray call through
a :class:`RayCalls`, so the rules are unit-tested with fakes (``tests/unit/batch/pool/test_pool_rules.py``).
:func:`run_pool` is the entry point.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from batch.corpus.shard import ShardInput
from batch.pool.actor import reap
from batch.pool.placement import actor_placed
from classify.errors import EngineError

log = logging.getLogger(__name__)

IN_FLIGHT_PER_ACTOR = 2
"""Shards queued on one actor at a time: one running, one waiting, so the engine never idles."""

GROW_EVERY_S = 5.0
"""Seconds between two looks for a node that joined the cluster (:meth:`ShardPool.add_slots`)."""

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


@runtime_checkable
class LazyShard(Protocol):
    """A shard read only when it is dispatched, so the driver holds only the shards in flight
    (:class:`batch.corpus.plan.PendingShard`)."""

    def __len__(self) -> int: ...

    def load(self) -> ShardInput: ...


ShardJob = tuple[int, "ShardInput | LazyShard | Sequence[Any]"]
"""``(shard index, payload)``: what the pool is given to run. The payload (or what a :class:`LazyShard` loads) goes to
the actor's ``classify`` as it is: a :class:`~batch.corpus.shard.ShardInput` for the engine actor, any sized
sequence for a test actor; ``len()`` of it is the shard's documents (its deadline)."""


class RayCalls:
    """The Ray calls the pool makes, in one place, so the pool's rules can be driven without Ray.

    Attributes:
        failures: the exceptions a shard's or an actor's reference raises when the actor failed:
            ``(RayActorError, RayTaskError)``.
        actor_lost: the one of them that means the actor process is gone (``RayActorError``).
    """

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.failures: tuple[type[BaseException], ...] = (ray.exceptions.RayActorError, ray.exceptions.RayTaskError)
        self.actor_lost: type[BaseException] = ray.exceptions.RayActorError

    def wait(self, refs: list[Any], timeout: float) -> list[Any]:
        """The references (at most one) that are ready within ``timeout`` seconds; ``[]`` when none is."""
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        return ready

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        """The value of ``ref``, waiting up to ``timeout`` seconds (``None``: for ever); raises what the task raised."""
        return self.ray.get(ref, timeout=timeout)

    def kill(self, actor: Any) -> None:
        """End ``actor`` for good (no restart)."""
        self.ray.kill(actor, no_restart=True)

    def info(self, actor: Any) -> Any:
        """A reference to :meth:`EngineActor.info`: ready once the actor has started its engine."""
        return actor.info.remote()

    def classify(self, actor: Any, payload: Any) -> Any:
        """A reference to the shard's result (:meth:`EngineActor.classify` of a :class:`~batch.corpus.shard.ShardInput`)."""
        return actor.classify.remote(payload)

    def shutdown(self, actor: Any) -> Any:
        """A reference to the actor's clean engine stop."""
        return actor.shutdown.remote()

    def placed(self, actor: Any) -> bool | None:
        """:func:`batch.pool.placement.actor_placed`."""
        return actor_placed(actor)

    def reap(self, info: dict[str, Any]) -> None:
        """Stop what a dead actor left on this node (:func:`batch.pool.actor.reap`)."""
        reap([info])


@dataclass
class Slot:
    """One place in the pool and the actor now in it.

    Attributes:
        index: the slot number (``make_actor(index)``); a replacement actor keeps it.
        actor: the actor handle.
        generation: 0 for the first actor of the slot, one more for each replacement.
        info_ref: the reference to the actor's :meth:`EngineActor.info` (its processes, for reaping).
        created_at: monotonic seconds when the actor was created.
        running_since: monotonic seconds since the engine started and the earliest shard in flight
            runs; ``None`` until the actor has started.
        active: ``False`` once the slot was dropped (its actor could not be placed).
        load: shards in flight on the actor (at most :data:`IN_FLIGHT_PER_ACTOR`).
    """

    index: int
    actor: Any
    generation: int = 0
    info_ref: Any = None
    created_at: float = 0.0
    running_since: float | None = None
    active: bool = True
    load: int = 0


@dataclass(frozen=True)
class Flight:
    """A shard sent to an actor: the slot and actor generation it went to, and the shard."""

    slot: int
    generation: int
    shard: ShardJob


PLACE_MESSAGE = ("engine actor could not be placed on any node within {s:g} s (batch.actor_place_timeout_s: no node "
                 "has the free resources it asks for, e.g. a node was lost); slot dropped for this attempt")


class ShardPool:
    """Shards over a pool of engine actors, by the rules of the module docstring (modelled on Ray Data's ``_ActorPool``).

    Args:
        make_actor: creates the actor handle of one slot (``make_actor(slot)``, already
            ``.options(...).remote(...)``); a replacement actor gets the same slot.
        n_actors: pool size; at most one actor per shard.
        shards: ``(shard index, payload)`` still to do (:data:`ShardJob`).
        on_done: called in the driver with ``(index, what the actor returned)`` as each shard completes.
        max_shard_retries: re-runs allowed per shard.
        on_event: optional callback ``(event, detail)`` (see :func:`run_pool`).
        deadlines: when an actor counts as stuck (default :class:`Deadlines`).
        calls: the Ray calls (default :class:`RayCalls`; tests give fakes).
        clock: monotonic seconds (default :func:`time.monotonic`).
        grow: optional; asked every ``grow_every_s`` while shards wait: how many slots the cluster now has room
            for beyond the pool's (a node joined); ``make_actor`` must then accept those new slot numbers.
            The pool adds at most one slot per waiting shard (:meth:`add_slots`).
        grow_every_s: seconds between two ``grow`` calls.

    Attributes:
        slots: one :class:`Slot` per slot, dropped ones included.
        inflight: each shard reference in flight and its :class:`Flight`, in submission order.
        queue: the shards waiting for an actor.
        attempts: failed runs per shard index.
        info_waiting: each :meth:`RayCalls.info` reference not yet ready and its ``(slot, generation)``.
        observed: the slowest seconds per document on a completed shard, ``None`` before one.
        stats: :class:`PoolStats`.
    """

    def __init__(self, make_actor: Callable[[int], Any], n_actors: int, shards: Sequence[ShardJob],
                 on_done: Callable[[int, Any], None], max_shard_retries: int, *,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None, deadlines: Deadlines | None = None,
                 calls: RayCalls | None = None, clock: Callable[[], float] = time.monotonic,
                 grow: Callable[[], int] | None = None, grow_every_s: float = GROW_EVERY_S):
        self.make_actor, self.on_done, self.max_shard_retries = make_actor, on_done, max_shard_retries
        self.grow, self.grow_every_s = grow, grow_every_s
        self.grown_at = clock()
        self.event = on_event or (lambda name, detail: None)
        self.limits = deadlines or Deadlines()
        self.calls = calls if calls is not None else RayCalls()
        self.clock = clock
        self.stats = PoolStats()
        self.t0 = clock()
        self.n_actors = max(1, min(n_actors, len(shards)))
        self.slots: list[Slot] = []
        self.info_waiting: dict[Any, tuple[int, int]] = {}
        self.queue: deque[ShardJob] = deque(shards)
        self.attempts: dict[int, int] = {}
        self.inflight: dict[Any, Flight] = {}
        self.observed: float | None = None

    # -- slots -------------------------------------------------------------------------------------------------

    def start_slot(self, index: int, generation: int) -> Slot:
        """Create the actor of slot ``index`` (its ``generation``-th) and ask for its info (ready when it has started)."""
        actor = self.make_actor(index)
        self.stats.actors_started += 1
        info_ref = self.calls.info(actor)
        self.info_waiting[info_ref] = (index, generation)
        return Slot(index, actor, generation, info_ref, created_at=self.clock())

    def live(self) -> list[Slot]:
        """The slots not dropped."""
        return [slot for slot in self.slots if slot.active]

    def running_ref(self, slot: Slot) -> Any:
        """The reference of the shard ``slot``'s actor runs now (its earliest in flight), or ``None``."""
        return next((r for r, f in self.inflight.items() if f.slot == slot.index and f.generation == slot.generation),
                    None)

    def take_flights(self, slot: Slot) -> list[ShardJob]:
        """Remove the shards in flight on ``slot``'s actor from :attr:`inflight`; they come back in submission order."""
        mine = [r for r, f in self.inflight.items() if f.slot == slot.index and f.generation == slot.generation]
        return [self.inflight.pop(r).shard for r in mine]

    def reap_slot(self, slot: Slot) -> None:
        """Stop what ``slot``'s actor left behind (its engine processes), if it ever reported them."""
        try:
            self.calls.reap(self.calls.get(slot.info_ref, timeout=5))
        except Exception:  # noqa: BLE001 - the actor died before it could report; nothing to reap
            pass

    # -- the failure rules ---------------------------------------------------------------------------------------

    def blame(self, slot: Slot, flight: Flight, err: BaseException) -> ShardJob:
        """The shard a failure is charged to.

        An actor runs its tasks in submission order: when the actor is lost, the shard it was running
        is the earliest submitted one still in flight on it (the others fail as collateral, free); when a
        task raised, that shard (``flight``'s) is the one that failed.
        """
        running = self.running_ref(slot)
        if isinstance(err, self.calls.actor_lost) and running is not None:
            return self.inflight[running].shard
        return flight.shard

    def charge(self, index: int, message: str, cause: BaseException | None) -> str:
        """Count a failed run of shard ``index``; returns the message as recorded (``shard N: ...``).

        Raises:
            EngineError: the shard has now failed more than ``max_shard_retries`` times (the batch's
                first error is kept in the message).
        """
        attempts = self.attempts[index] = self.attempts.get(index, 0) + 1
        message = f"shard {index}: {message}"
        self.stats.errors.append(message)
        log.warning("%s (attempt %d of %d)", message, attempts, self.max_shard_retries + 1)
        if attempts > self.max_shard_retries:
            raise EngineError(f"{self.stats.errors[0]}; shard {index} failed {attempts} times "
                              f"(batch.max_shard_retries {self.max_shard_retries}); rerun the same batch id to resume"
                              ) from cause
        return message

    def on_failure(self, slot: Slot, blamed: ShardJob | None, message: str, cause: BaseException | None = None) -> None:
        """``slot``'s actor failed: charge ``blamed`` one attempt, replace the actor and queue all its shards again.

        ``blamed`` (when given) goes first in the queue; the other shards that were in flight on the
        actor are requeued free. ``None`` blames nothing (an actor that failed to start with no shard running).

        Raises:
            EngineError: from :meth:`charge`, before the actor is replaced.
        """
        requeue = [sh for sh in self.take_flights(slot) if blamed is None or sh[0] != blamed[0]]
        if blamed is not None:
            message = self.charge(blamed[0], message, cause)
            requeue.insert(0, blamed)
        self.calls.kill(slot.actor)
        self.reap_slot(slot)
        self.slots[slot.index] = self.start_slot(slot.index, slot.generation + 1)
        self.queue.extendleft(reversed(requeue))
        if blamed is not None:
            self.stats.retries += 1
            self.event("retry", {"shard": blamed[0], "error": message})

    def drop_slot(self, slot: Slot, reason: str) -> None:
        """Give up ``slot`` for this attempt: kill its (unplaced) actor and queue its shards again, uncharged."""
        requeue = self.take_flights(slot)
        slot.active = False
        slot.load = 0
        self.calls.kill(slot.actor)
        self.queue.extendleft(reversed(requeue))
        message = f"slot {slot.index}: {reason}"
        self.stats.dropped.append(message)
        log.warning("%s; the pool goes on with %d actor(s)", message, len(self.live()))
        self.event("slot-dropped", {"slot": slot.index, "reason": reason})

    def check_placement(self, now: float) -> None:
        """Drop slots whose actor has waited longer than ``actor_place_s`` for a node, while another slot has one.

        A slot counts as working when its actor has started or is placed (or Ray cannot tell); with no
        such other slot the unplaced ones are kept (``actor_start_s`` still bounds them).
        """
        waiting = [s for s in self.live() if s.running_since is None and now - s.created_at > self.limits.actor_place_s]
        if not waiting:
            return
        unplaced = [s for s in waiting if self.calls.placed(s.actor) is False]
        if not unplaced:
            return
        others = [s for s in self.live() if s not in unplaced
                  and (s.running_since is not None or self.calls.placed(s.actor) is not False)]
        if not others:
            return  # nothing else could do the work: wait (actor_start_s still bounds it)
        for slot in unplaced:
            self.drop_slot(slot, PLACE_MESSAGE.format(s=self.limits.actor_place_s))

    def check_deadlines(self, now: float) -> None:
        """Apply the time rules at ``now`` (monotonic seconds): placement, actor start, shard run.

        An actor not started within ``actor_start_s`` fails (its running shard, if any, is blamed); a
        shard running longer than :meth:`Deadlines.shard_s` fails its actor and is blamed.

        Raises:
            EngineError: a blamed shard ran out of retries (:meth:`charge`).
        """
        self.check_placement(now)
        limits = self.limits
        for slot in self.live():
            ref = self.running_ref(slot)
            if slot.running_since is None:
                if now - slot.created_at > limits.actor_start_s:
                    blamed = self.inflight[ref].shard if ref is not None else None
                    self.on_failure(slot, blamed, f"engine actor did not start within {limits.actor_start_s:g} s "
                                    "(batch.actor_start_timeout_s); stuck actor killed")
            elif ref is not None:
                shard = self.inflight[ref].shard
                bound = limits.shard_s(len(shard[1]), self.observed)
                if now - slot.running_since > bound:
                    self.on_failure(slot, shard, f"engine stuck: no answer for {len(shard[1])} documents within "
                                    f"{bound:g} s (batch.shard_timeout_base_s + shard_timeout_per_doc_s x documents); "
                                    "actor killed")

    def next_wakeup(self, now: float) -> float:
        """Seconds until the next deadline of :meth:`check_deadlines` (at least 0.05; 1 with nothing to watch)."""
        waits = []
        for slot in self.live():
            if slot.running_since is None:
                waits.append(slot.created_at + self.limits.actor_start_s - now)
                place_wait = slot.created_at + self.limits.actor_place_s - now
                # past the placement bound but kept (no other live slot): look again every 10 s
                waits.append(place_wait if place_wait > 0 else 10.0)
            elif (ref := self.running_ref(slot)) is not None:
                bound = self.limits.shard_s(len(self.inflight[ref].shard[1]), self.observed)
                waits.append(slot.running_since + bound - now)
        return max(0.05, min(waits)) if waits else 1.0

    # -- growth: a node that joins mid-run ----------------------------------------------------------------------

    def add_slots(self, now: float) -> None:
        """Ask ``grow`` (every ``grow_every_s``, while shards wait) for room on a node that joined; start new slots.

        New slots get the next slot numbers and generation 0, take shards from the same queue (so every shard
        still runs once) and follow every rule of the other slots. ``actors-added`` is reported with the count.
        """
        if self.grow is None or not self.queue or now - self.grown_at < self.grow_every_s:
            return
        self.grown_at = now
        room = self.grow()
        if room <= 0:
            return
        add = min(room, len(self.queue))
        first = len(self.slots)
        self.slots += [self.start_slot(index, 0) for index in range(first, first + add)]
        log.info("a node joined the cluster: %d engine actor(s) added, %d in the pool", add, len(self.live()))
        self.event("actors-added", {"added": add, "slots": list(range(first, first + add)), "actors": len(self.live())})

    def in_flight(self) -> dict[int, list[int]]:
        """The shard indices in flight on each slot's current actor, earliest (the running one) first."""
        out: dict[int, list[int]] = {}
        for flight in self.inflight.values():
            if flight.generation == self.slots[flight.slot].generation:
                out.setdefault(flight.slot, []).append(flight.shard[0])
        return out

    # -- the loop ------------------------------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Send queued shards to the live actors until each has :data:`IN_FLIGHT_PER_ACTOR` in flight (``in-flight``
        is reported when any was sent)."""
        sent = False
        for slot in self.live():
            while self.queue and slot.load < IN_FLIGHT_PER_ACTOR:
                shard = self.queue.popleft()
                payload = shard[1].load() if isinstance(shard[1], LazyShard) else shard[1]  # read when dispatched
                ref = self.calls.classify(slot.actor, payload)
                del payload  # the actor's copy is in Ray's object store; the driver keeps only the reference
                self.inflight[ref] = Flight(slot.index, slot.generation, shard)
                slot.load += 1
                sent = True
        if sent:
            self.event("in-flight", {"in_flight": self.in_flight()})

    def on_ready(self, ref: Any) -> None:
        """An actor finished starting (its info ``ref``): its shard clock starts; ``actor-ready`` is reported."""
        index, generation = self.info_waiting.pop(ref)
        try:
            detail = self.calls.get(ref)
        except self.calls.failures:
            return  # its shards fail too and are retried by on_result
        if generation == self.slots[index].generation:
            self.slots[index].running_since = self.clock()
        self.event("actor-ready", {"slot": index, "generation": generation, **detail})

    def on_result(self, ref: Any) -> None:
        """A shard reference is ready: hand its result to ``on_done``, or fail its actor by the blame rule.

        Raises:
            EngineError: the blamed shard ran out of retries (:meth:`charge`).
        """
        if ref not in self.inflight:
            return  # a ref of an actor already replaced
        flight = self.inflight[ref]
        slot = self.slots[flight.slot]
        try:
            rows = self.calls.get(ref)
        except self.calls.failures as err:
            text = str(err).strip()
            first_line = text.splitlines()[-1][:500] if text else type(err).__name__
            self.on_failure(slot, self.blame(slot, flight, err), f"{type(err).__name__}: {first_line}", err)
            return
        self.inflight.pop(ref)
        slot.load -= 1
        now = self.clock()
        n_docs = len(flight.shard[1])
        if slot.running_since is not None and n_docs:
            per_doc = (now - slot.running_since) / n_docs
            self.observed = per_doc if self.observed is None else max(self.observed, per_doc)
        slot.running_since = now  # the next shard of this actor starts now
        if self.stats.first_ready_s is None:
            self.stats.first_ready_s = self.clock() - self.t0
        self.on_done(flight.shard[0], rows)
        if not self.queue:  # nothing to dispatch next: say what is still in flight now
            self.event("in-flight", {"in_flight": self.in_flight()})

    def close(self, failed: bool) -> None:
        """Stop every slot's actor: a clean engine stop (``failed``: wait 5 s, else 60 s), else reap; then kill."""
        stop_wait_s = 5 if failed else 60
        for slot in self.slots:
            try:  # a clean engine stop; a dead actor's leftovers are reaped instead
                self.calls.get(self.calls.shutdown(slot.actor), timeout=stop_wait_s)
            except Exception:  # noqa: BLE001
                self.reap_slot(slot)
            self.calls.kill(slot.actor)

    def open(self) -> None:
        """Start one actor per slot (:meth:`start_slot`, generation 0)."""
        self.slots = [self.start_slot(index, 0) for index in range(self.n_actors)]

    def run(self) -> PoolStats:
        """Start the actors and run every shard; see :func:`run_pool`."""
        self.open()
        try:
            while self.queue or self.inflight:
                # every turn, not only when nothing came back: one busy actor must not hide another's deadline
                self.check_deadlines(self.clock())
                self.add_slots(self.clock())
                self.dispatch()
                wakeup = self.next_wakeup(self.clock())
                if self.grow is not None and self.queue:
                    wakeup = min(wakeup, self.grow_every_s)
                ready = self.calls.wait([*self.inflight, *self.info_waiting], timeout=wakeup)
                if ready and ready[0] in self.info_waiting:
                    self.on_ready(ready[0])
                elif ready:
                    self.on_result(ready[0])
        finally:
            # on an error or an interrupt (SIGTERM, Ctrl-C) an actor may still be loading its engine: do not wait for it
            self.close(failed=sys.exc_info()[0] is not None)
        return self.stats


def run_pool(make_actor: Callable[[int], Any], n_actors: int, shards: Sequence[ShardJob],
             on_done: Callable[[int, Any], None], max_shard_retries: int, *,
             on_event: Callable[[str, dict[str, Any]], None] | None = None,
             deadlines: Deadlines | None = None, grow: Callable[[], int] | None = None,
             grow_every_s: float = GROW_EVERY_S) -> PoolStats:
    """Run shards over a pool of engine actors, retrying a failed shard on a fresh actor (a :class:`ShardPool`).

    Args:
        make_actor: creates the actor handle of one slot (``make_actor(slot)``, already
            ``.options(...).remote(...)``); a replacement actor gets the same slot.
        n_actors: pool size.
        shards: ``(shard index, payload)`` still to do (:data:`ShardJob`); the payload is what the actor's
            ``classify`` takes (a :class:`~batch.corpus.shard.ShardInput`), or a :class:`LazyShard` that reads it when
            the shard is dispatched (the driver then holds only the shards in flight).
        on_done: called in the driver with ``(index, result)`` as each shard completes; ``result`` is
            what the actor's ``classify`` returned (the batch run takes a :class:`batch.corpus.shard.ShardOutput`
            only, as :class:`EngineActor` returns; the pool passes it on unread).
        max_shard_retries: re-runs allowed per shard.
        on_event: optional callback ``(event, detail)`` for ``actor-ready`` (with :meth:`EngineActor.info`),
            ``retry`` (progress file) and ``slot-dropped`` (``{"slot", "reason"}``).
        deadlines: when an actor counts as stuck (default :class:`Deadlines`).
        grow: optional room for more slots on nodes that joined (see :class:`ShardPool`); reported as
            ``actors-added``. ``in-flight`` (``{"in_flight": {slot: [shard, ...]}}``) is reported as shards go out.
        grow_every_s: seconds between two looks for room.

    Returns:
        :class:`PoolStats`.

    Raises:
        EngineError: a shard failed more than ``max_shard_retries + 1`` times (the first error is kept).
    """
    return ShardPool(make_actor, n_actors, shards, on_done, max_shard_retries, on_event=on_event,
                     deadlines=deadlines, grow=grow, grow_every_s=grow_every_s).run()
