"""Private Ray machinery for ``make batch``: the engine actor and the shard scheduler over a pool of them.

Each actor builds the one vLLM classifier (:func:`classify.engine.build_engine`) once and
classifies whole shards. The scheduler keeps two shards in flight per actor (so an actor
never idles between shards), and when an actor fails it kills that actor, starts a fresh one
in its slot and queues the shard again, up to ``max_shard_retries`` times per shard. An actor
fails when:

* its process dies (killed, out of memory, node lost): Ray reports ``RayActorError``;
* its vLLM engine core dies: vLLM's offline ``LLM`` then blocks for ever in its output queue
  (``SyncMPClient.get_output``), so the actor watches its ``VLLM::`` child processes and
  exits itself (:meth:`EngineActor._watch_engine`), which Ray reports as above;
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
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from classify.config import ClassifyConfig, EngineConfig, ModelConfig
from classify.errors import ConfigError, EngineError
from classify.records import Document
from classify.scoring import AdapterHandle

log = logging.getLogger(__name__)

IN_FLIGHT_PER_ACTOR = 2
"""Shards queued on one actor at a time: one running, one waiting, so the engine never idles."""

ENV_PASSED_TO_ACTORS = ("DOCPILOT_HOME", "DOCPILOT_MODEL_CACHE", "DOCPILOT_REGISTRY", "DOCPILOT_RUNS",
                        "DOCPILOT_EXPORTS", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                        "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY",
                        "RAY_LOGGER_LEVEL", "RAY_BACKEND_LOG_LEVEL", "DOCPILOT_VERBOSE")


class EngineActor:
    """One vLLM engine in a Ray actor (wrapped with ``ray.remote`` by :func:`actor_class`).

    Args:
        model_cfg: base model section.
        engine_cfg: engine sizing.
        classify_cfg: categories and prompt settings.
        adapter: the verified adapter handle, or ``None`` for the base model.
        model_fingerprint: the fingerprint the driver resolved; the actor refuses another model.

    Raises:
        EngineError: vLLM cannot start, or the model on this node has another fingerprint.
    """

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, classify_cfg: ClassifyConfig,
                 adapter: AdapterHandle | None, model_fingerprint: str):
        from classify.engine import build_engine

        self.adapter = adapter
        self.clf = build_engine(model_cfg, engine_cfg, classify_cfg, enable_lora=adapter is not None)
        if model_fingerprint and self.clf.model.fingerprint != model_fingerprint:
            raise EngineError(f"model on this node has fingerprint {self.clf.model.fingerprint}, "
                              f"the batch expects {model_fingerprint} ({model_cfg.base_model})")
        self._stopping = False
        threading.Thread(target=self._watch_engine, args=(engine_processes(),), daemon=True,
                         name="docpilot-engine-watchdog").start()

    def _watch_engine(self, procs: list[Any], interval_s: float = 1.0) -> None:
        """End this actor's process as soon as its vLLM engine is dead, so Ray reports the actor lost.

        vLLM's offline engine does not raise when its engine-core process dies: the next (or the
        running) ``generate`` waits for ever on its output queue. Checked every ``interval_s``:
        each ``VLLM::`` child process recorded at start (engine core, workers) still runs, and
        vLLM's own ``engine_dead`` flag is unset.
        """
        import psutil

        resources = getattr(getattr(getattr(self.clf.llm, "llm_engine", None), "engine_core", None), "resources", None)
        while not self._stopping:
            time.sleep(interval_s)
            dead = []
            for proc in procs:
                try:
                    if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                        dead.append(proc.pid)
                except psutil.Error:
                    dead.append(proc.pid)
            if self._stopping:
                return
            if dead or getattr(resources, "engine_dead", False):
                log.error("vLLM engine of this actor is dead (process(es) %s gone); ending the actor so its "
                          "shard is retried on a fresh one", dead or "?")
                os._exit(70)  # noqa: SLF001 - the only way out of a thread blocked inside vLLM

    def info(self) -> dict[str, Any]:
        """Process id, child process ids (the vLLM engine core), node and CPU binding, for progress and tests."""
        import psutil
        import ray

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "cpu_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
                "procs": [{"pid": p.pid, "create_time": p.create_time()} for p in procs]}

    def classify(self, docs: list[Document]) -> list[dict[str, Any]]:
        """Classify one shard; one JSON-able result per document, in order.

        Documents that cannot be classified (unreadable, empty, prompt too long) are rejected by
        the scorer before the engine sees them. An engine failure is never a document's reject
        reason: it is raised, and the driver retries the whole shard on a fresh actor.

        Raises:
            EngineError: vLLM failed on this shard.
        """
        return [r.model_dump(mode="json") for r in self.clf.classify(docs, self.adapter)]

    def shutdown(self) -> None:
        """Stop the vLLM engine's worker processes (the watchdog first, so a clean stop is not a death)."""
        self._stopping = True
        self.clf.shutdown()


def engine_processes() -> list[Any]:
    """This process's vLLM children (``VLLM::EngineCore``, ``VLLM::Worker``...), as ``psutil.Process``.

    vLLM names its processes with ``setproctitle`` (``vllm/utils/system_utils.py``,
    ``set_process_title``: ``VLLM::<name>``); other children (compilers, tokenizer pools) may
    come and go and are not watched.
    """
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            title = f"{proc.name()} {' '.join(proc.cmdline())}"
        except psutil.Error:
            continue
        if "VLLM::" in title:
            found.append(proc)
    return found


def reap(actor_infos: list[dict[str, Any]]) -> list[int]:
    """Stop what is left of dead engine actors on this node: the actor and its vLLM engine-core processes.

    vLLM's engine core does not watch its parent, so an actor killed with SIGKILL (or whose
    driver was killed) leaves it running. Only processes recorded by :meth:`EngineActor.info`
    on this host, with the same pid AND start time (no pid reuse), are signalled: SIGTERM,
    then SIGKILL after 10 s.

    Args:
        actor_infos: :meth:`EngineActor.info` results (from ``progress.json``).

    Returns:
        The pids that were signalled.
    """
    import psutil
    import ray

    here = ray.util.get_node_ip_address() if ray.is_initialized() else None
    victims = []
    for info in actor_infos:
        if here is not None and info.get("node") not in (here, None):
            continue
        for rec in info.get("procs", []):
            try:
                proc = psutil.Process(rec["pid"])
                if abs(proc.create_time() - rec["create_time"]) < 0.01 and proc.pid != os.getpid():
                    victims.append(proc)
            except (psutil.Error, KeyError, TypeError):
                continue
    for proc in victims:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(victims, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if victims:
        log.warning("stopped %d leftover engine process(es) of dead actors: %s", len(victims), [p.pid for p in victims])
    return [p.pid for p in victims]


def actor_class() -> Any:
    """The ``ray.remote`` version of :class:`EngineActor` (built lazily: importing this module needs no Ray)."""
    import ray

    return ray.remote(max_restarts=0, max_task_retries=0)(EngineActor)


def cpu_core_groups(n_actors: int, cpus: list[int]) -> list[str] | None:
    """Disjoint core lists, one per CPU engine actor, for ``VLLM_CPU_OMP_THREADS_BIND``.

    vLLM's ``auto`` binding chooses the same cores in every engine on one machine (on 2 cores:
    one core for compute, one kept for the front end, in every engine), so two engines share
    one core. Here the machine's cores are cut into ``n_actors`` contiguous groups; a group of
    2 or more cores keeps its first core for that engine's front end (as ``auto`` does) and
    binds the rest, a group of one core binds that core.

    Args:
        n_actors: engine actors on this machine.
        cpus: the CPU ids this process may use (``os.sched_getaffinity(0)``).

    Returns:
        ``n_actors`` strings such as ``"1"`` or ``"9,10,11"``, or ``None`` when there are fewer
        cores than actors (each engine then keeps vLLM's ``auto`` binding).
    """
    cpus = sorted(cpus)
    if n_actors < 1 or len(cpus) < n_actors:
        return None
    size, extra = divmod(len(cpus), n_actors)
    groups, start = [], 0
    for i in range(n_actors):
        end = start + size + (1 if i < extra else 0)
        group = cpus[start:end]
        groups.append(",".join(str(c) for c in (group[1:] if len(group) >= 2 else group)))
        start = end
    return groups


def actor_options(n_cpu_actors: int, actor_num_cpus: float, cpu_bind: str = "split") -> tuple[int, list[dict[str, Any]]]:
    """How many engine actors to start and with which resources, from the connected Ray cluster.

    One actor per GPU (``num_gpus=1``) when the cluster has GPUs; otherwise ``n_cpu_actors``
    actors of ``actor_num_cpus`` CPUs each. With ``cpu_bind="split"``, 2 or more CPU actors on a
    local Ray (no ``RAY_ADDRESS``) and no ``VLLM_CPU_OMP_THREADS_BIND`` set by the user, each
    actor slot gets its own cores (:func:`cpu_core_groups`).

    Args:
        n_cpu_actors: ``batch.cpu_actors``.
        actor_num_cpus: ``batch.actor_num_cpus``.
        cpu_bind: ``batch.cpu_bind``: ``"split"`` or ``"auto"`` (vLLM's own binding in every actor).

    Returns:
        ``(count, options for .options() per actor slot)``; the list has ``count`` entries.

    Raises:
        ConfigError: the CPU actors do not fit the cluster's CPUs.
    """
    import ray

    resources = ray.cluster_resources()
    env = {k: os.environ[k] for k in ENV_PASSED_TO_ACTORS if k in os.environ}
    gpus = int(resources.get("GPU", 0))
    if gpus:
        runtime_env = {"env_vars": env} if env else None
        return gpus, [{"num_gpus": 1, "num_cpus": 1, "runtime_env": runtime_env} for _ in range(gpus)]
    cpus = float(resources.get("CPU", 0))
    if n_cpu_actors * actor_num_cpus > cpus:
        raise ConfigError(
            f"`batch.cpu_actors` x `batch.actor_num_cpus` = {n_cpu_actors} x {actor_num_cpus} CPUs, "
            f"but the Ray cluster has {cpus:g} CPUs; lower one of them (actors that do not fit never start)"
        )
    groups = None
    if (cpu_bind == "split" and n_cpu_actors >= 2 and not os.environ.get("RAY_ADDRESS")
            and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ):
        cores = list(os.sched_getaffinity(0))
        groups = cpu_core_groups(n_cpu_actors, cores)
        if groups is None:
            log.warning("%d CPU actors but only %d cores: every engine keeps vLLM's auto binding",
                        n_cpu_actors, len(cores))
        else:
            log.info("CPU engine actors bound to their own cores (VLLM_CPU_OMP_THREADS_BIND): %s", groups)
    options = []
    for slot in range(n_cpu_actors):
        slot_env = dict(env)
        if groups is not None:
            slot_env["VLLM_CPU_OMP_THREADS_BIND"] = groups[slot]
        options.append({"num_cpus": actor_num_cpus, "runtime_env": {"env_vars": slot_env} if slot_env else None})
    return n_cpu_actors, options


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


def actor_placed(actor: Any) -> bool | None:
    """Whether Ray has given ``actor`` a worker process on some node (it may still be starting its engine).

    Read from the GCS actor table (``ray._private.state.actors``; no dashboard needed): an actor
    waiting for a node with free resources has no worker process yet (``Pid`` 0).

    Args:
        actor: a Ray actor handle.

    Returns:
        ``True`` placed (or already gone: not waiting), ``False`` still waiting for a node, ``None``
        when Ray could not tell (treated as placed by the caller: never drop on a guess).
    """
    try:
        from ray._private import state

        info = state.actors(actor_id=actor._actor_id.hex())  # noqa: SLF001 - the handle's id, no public getter
    except Exception:  # noqa: BLE001 - a private API: unknown is not "unplaced"
        return None
    if not isinstance(info, dict) or not info:
        return None
    if info.get("State") in ("DEPENDENCIES_UNREADY", "PENDING_CREATION"):
        return bool(info.get("Pid"))
    return True


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
