"""Private Ray machinery for ``make batch``: the engine actor and the shard scheduler over a pool of them.

Each actor builds the one vLLM classifier (:func:`classify.engine.build_engine`) once and
classifies whole shards. The scheduler keeps two shards in flight per actor (so an actor
never idles between shards), and when an actor dies (process killed, node lost) or a shard
task fails, it kills that actor, starts a fresh one in its slot and queues the shard again,
up to ``max_shard_retries`` times per shard. An actor runs its shards one after the other, so
when it dies, the shard it was running (the earliest submitted) is charged the retry and the
shard queued behind it is requeued free.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from classify.config import ClassifyConfig, EngineConfig, ModelConfig
from classify.engine import AdapterHandle
from classify.errors import ConfigError, EngineError
from classify.records import Document

log = logging.getLogger(__name__)

IN_FLIGHT_PER_ACTOR = 2
"""Shards queued on one actor at a time: one running, one waiting, so the engine never idles."""

ENV_PASSED_TO_ACTORS = ("DOCPILOT_HOME", "DOCPILOT_MODEL_CACHE", "DOCPILOT_REGISTRY", "DOCPILOT_RUNS",
                        "DOCPILOT_EXPORTS", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                        "VLLM_CPU_NUM_OF_RESERVED_CPU")


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

        When the whole-shard call fails, each document is retried alone, and the documents that
        still fail are rejected with the engine's error as reason (one bad document never stops
        the batch). When every document fails the engine itself is broken: the error is raised so
        the shard is retried on a fresh actor.

        Raises:
            EngineError: the engine failed on every document of the shard.
        """
        try:
            return [r.model_dump(mode="json") for r in self.clf.classify(docs, self.adapter)]
        except EngineError as whole:
            out, failures = [], 0
            for doc in docs:
                try:
                    out.append(self.clf.classify([doc], self.adapter)[0].model_dump(mode="json"))
                except EngineError as err:
                    failures += 1
                    from classify.records import Result

                    out.append(Result.rejected(doc, f"engine error: {err}").model_dump(mode="json"))
            if failures == len(docs):
                raise whole
            return out

    def shutdown(self) -> None:
        """Stop the vLLM engine's worker processes."""
        self.clf.shutdown()


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


@dataclass
class PoolStats:
    """What the scheduler saw.

    Attributes:
        actors_started: actors created, replacements included.
        retries: shard re-runs after a failure.
        errors: the failures, first first (``shard N: <error>``).
        first_ready_s: seconds from pool start until the first shard came back (engine start + warm-up).
    """

    actors_started: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)
    first_ready_s: float | None = None


def run_pool(
    make_actor: Callable[[int], Any],
    n_actors: int,
    shards: list[tuple[int, list[Document]]],
    on_done: Callable[[int, list[dict[str, Any]]], None],
    max_shard_retries: int,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> PoolStats:
    """Run shards over a pool of engine actors, retrying a failed shard on a fresh actor.

    Args:
        make_actor: creates the actor handle of one slot (``make_actor(slot)``, already
            ``.options(...).remote(...)``); a replacement actor gets the same slot.
        n_actors: pool size.
        shards: ``(shard index, documents)`` still to do.
        on_done: called in the driver with ``(index, result rows)`` as each shard completes.
        max_shard_retries: re-runs allowed per shard.
        on_event: optional callback ``(event, detail)`` for ``actor-ready`` (with :meth:`EngineActor.info`)
            and ``retry`` (progress file).

    Returns:
        :class:`PoolStats`.

    Raises:
        EngineError: a shard failed more than ``max_shard_retries + 1`` times (the first error is kept).
    """
    import ray

    stats = PoolStats()
    event = on_event or (lambda name, detail: None)
    t0 = time.monotonic()
    n_actors = max(1, min(n_actors, len(shards)))
    slots: list[list[Any]] = []  # [actor, generation]

    infos: dict[tuple[int, int], Any] = {}
    info_waiting: dict[Any, tuple[int, int]] = {}

    def start(slot: int, generation: int) -> Any:
        actor = make_actor(slot)
        stats.actors_started += 1
        infos[(slot, generation)] = actor.info.remote()
        info_waiting[infos[(slot, generation)]] = (slot, generation)
        return actor

    for slot in range(n_actors):
        slots.append([start(slot, 0), 0])
    queue = deque(shards)
    attempts: dict[int, int] = {}
    inflight: dict[Any, tuple[int, int, tuple[int, list[Document]]]] = {}  # in submission order
    load = [0] * n_actors
    try:
        while queue or inflight:
            for slot in range(n_actors):
                while queue and load[slot] < IN_FLIGHT_PER_ACTOR:
                    shard = queue.popleft()
                    ref = slots[slot][0].classify.remote(shard[1])
                    inflight[ref] = (slot, slots[slot][1], shard)
                    load[slot] += 1
            ready, _ = ray.wait([*inflight, *info_waiting], num_returns=1)
            ref = ready[0]
            if ref in info_waiting:  # an actor finished starting: report its processes (progress.json)
                slot, generation = info_waiting.pop(ref)
                try:
                    event("actor-ready", {"slot": slot, "generation": generation, **ray.get(ref)})
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                    pass  # its shards fail too and are retried below
                continue
            # an actor runs its tasks in submission order: when it fails, the shard it was running is the
            # earliest submitted one still in flight on it (another shard queued behind it fails as collateral)
            running = next(r for r in inflight if inflight[r][:2] == inflight[ref][:2])
            slot, generation, shard = inflight.pop(ref)
            if generation == slots[slot][1]:
                load[slot] -= 1
            try:
                rows = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                if running is not ref and isinstance(err, ray.exceptions.RayActorError):
                    blamed = inflight.pop(running)[2]  # the running shard is blamed; this one is requeued free
                    queue.appendleft(shard)
                    shard = blamed
                index = shard[0]
                attempts[index] = attempts.get(index, 0) + 1
                first_line = str(err).strip().splitlines()[-1][:500] if str(err).strip() else type(err).__name__
                message = f"shard {index}: {type(err).__name__}: {first_line}"
                stats.errors.append(message)
                log.warning("%s (attempt %d of %d)", message, attempts[index], max_shard_retries + 1)
                if attempts[index] > max_shard_retries:
                    raise EngineError(f"{stats.errors[0]}; shard {index} failed {attempts[index]} times "
                                      f"(batch.max_shard_retries {max_shard_retries}); rerun the same batch id to resume") from err
                if generation == slots[slot][1]:  # replace the actor once, not once per failed ref
                    ray.kill(slots[slot][0], no_restart=True)
                    try:
                        reap([ray.get(infos[(slot, generation)], timeout=5)])
                    except Exception:  # noqa: BLE001 - the actor died before it could report; nothing to reap
                        pass
                    slots[slot] = [start(slot, generation + 1), generation + 1]
                    load[slot] = 0
                    for other, (s, g, sh) in list(inflight.items()):  # its queued shards are lost with it
                        if s == slot and g == generation:
                            inflight.pop(other)
                            queue.appendleft(sh)
                stats.retries += 1
                event("retry", {"shard": index, "error": message})
                queue.appendleft(shard)
                continue
            if stats.first_ready_s is None:
                stats.first_ready_s = time.monotonic() - t0
            on_done(shard[0], rows)
    finally:
        for slot, (actor, generation) in enumerate(slots):
            try:  # a clean engine stop; a dead actor's leftovers are reaped instead
                ray.get(actor.shutdown.remote(), timeout=60)
            except Exception:  # noqa: BLE001
                try:
                    reap([ray.get(infos[(slot, generation)], timeout=5)])
                except Exception:  # noqa: BLE001 - never started: nothing to reap
                    pass
            ray.kill(actor, no_restart=True)
    return stats
