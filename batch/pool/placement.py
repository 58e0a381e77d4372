"""Private Ray machinery for ``make batch``: where engine actors go (CPU cores, resources) and whether Ray placed them."""

from __future__ import annotations

import logging
import os
from typing import Any

from classify.errors import ConfigError
from classify.machine.device import detect_device
from classify.usercommand import user_flag

log = logging.getLogger(__name__)

ENV_PASSED_TO_ACTORS = ("DOCPILOT_HOME", "DOCPILOT_MODEL_CACHE", "DOCPILOT_REGISTRY", "DOCPILOT_RUNS",
                        "DOCPILOT_EXPORTS", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                        "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY",
                        "RAY_LOGGER_LEVEL", "RAY_BACKEND_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS", "DOCPILOT_VERBOSE")


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


def node_gpus(nodes: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """GPUs each alive node of the connected Ray cluster declares (``ray.nodes()``), by node id.

    Args:
        nodes: ``ray.nodes()`` (default: asked now).

    Returns:
        ``{node id: GPUs}`` for every alive node, nodes without GPUs included (0).
    """
    if nodes is None:
        import ray

        nodes = ray.nodes()
    return {n["NodeID"]: int(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive")}


def tp_groups(gpus_per_node: dict[str, int], tp: int) -> int:
    """Engine actors of ``tp`` GPUs each that the nodes hold: ``sum(GPUs // tp)`` (a TP group never spans nodes).

    Raises:
        ConfigError: the cluster has GPUs but no node has ``tp`` of them (the message lists the nodes' GPUs).

    Example:
        >>> tp_groups({"a": 2, "b": 2}, 2)
        2
    """
    count = sum(g // tp for g in gpus_per_node.values())
    if count == 0 and any(gpus_per_node.values()):
        per_node = sorted((g for g in gpus_per_node.values() if g), reverse=True)
        raise ConfigError(
            f"`engine.tensor_parallel_size` {tp} needs {tp} GPUs on one node, but the Ray cluster's nodes have "
            f"{per_node} GPU(s): a tensor-parallel group never spans nodes (lots); lower "
            f"`engine.tensor_parallel_size` to at most {per_node[0]}, or rent a lot with {tp} cards (a B200 lot holds 2)")
    return count


def actor_options(n_cpu_actors: int, actor_num_cpus: float, cpu_bind: str = "split",
                  device: str | None = None, tensor_parallel_size: int = 1) -> tuple[int, list[dict[str, Any]]]:
    """How many engine actors to start and with which resources, from the connected Ray cluster.

    When the cluster has GPUs and the run computes on them: one actor per tensor-parallel group of
    ``tensor_parallel_size`` GPUs (``num_gpus=tp``), ``GPUs // tp`` of them on each node. Ray gives one
    actor's resources from one node, so an actor's ``tp`` GPUs are one node's (what a ``STRICT_PACK``
    placement group of ``tp`` one-GPU bundles would give), and its ``CUDA_VISIBLE_DEVICES`` names them
    all; vLLM's ``mp`` executor inside the actor runs one worker per card
    (:meth:`classify.config.engine.EngineSettings.parallel_kwargs`). Otherwise
    ``n_cpu_actors`` actors of ``actor_num_cpus`` CPUs each. The run's device is the one decision
    (:func:`classify.machine.device.detect_device`): a CPU venv on a machine whose cards Ray counts through NVML
    (a GPU pod with ``PROFILE=cpu``) keeps the CPU rules, the core split and the CPU-fit check, and says so. With ``cpu_bind="split"``, 2 or more CPU actors on a
    local Ray (no ``RAY_ADDRESS``) and no ``VLLM_CPU_OMP_THREADS_BIND`` set by the user, each
    actor slot gets its own cores (:func:`cpu_core_groups`).

    Args:
        n_cpu_actors: ``batch.cpu_actors``.
        actor_num_cpus: ``batch.actor_num_cpus``.
        cpu_bind: ``batch.cpu_bind``: ``"split"`` or ``"auto"`` (vLLM's own binding in every actor).
        device: where the engines compute, ``cpu``, ``cuda`` or ``rocm``; ``None``: this driver's
            (:func:`classify.machine.device.detect_device`).
        tensor_parallel_size: GPUs per engine actor (``engine.tensor_parallel_size`` resolved to a number);
            ignored on CPU (each CPU engine runs with 1).

    Returns:
        ``(count, options for .options() per actor slot)``; the list has ``count`` entries.

    Raises:
        ConfigError: the CPU actors do not fit the cluster's CPUs, or no node has ``tensor_parallel_size`` GPUs.
    """
    import ray

    resources = ray.cluster_resources()
    env = {k: os.environ[k] for k in ENV_PASSED_TO_ACTORS if k in os.environ}
    gpus = int(resources.get("GPU", 0))
    if device is None:
        device = detect_device()
    if gpus and device == "cpu":
        log.warning("the Ray cluster declares %d GPU(s), but this venv computes on the CPU: %d CPU engine actor(s), "
                    "the GPUs unused (`make doctor` says why)", gpus, n_cpu_actors)
        gpus = 0
    if gpus:
        count = tp_groups(node_gpus(), tensor_parallel_size)
        runtime_env = {"env_vars": env} if env else None
        return count, [gpu_actor_option(tensor_parallel_size, runtime_env) for _ in range(count)]
    if tensor_parallel_size > 1:
        log.warning("`engine.tensor_parallel_size` %d applies to GPUs; this run's CPU engines run with 1",
                    tensor_parallel_size)
    cpus = float(resources.get("CPU", 0))
    if n_cpu_actors * actor_num_cpus > cpus:
        raise ConfigError(
            f"`batch.cpu_actors` x `batch.actor_num_cpus` = {n_cpu_actors} x {actor_num_cpus} CPUs, "
            f"but the Ray cluster has {cpus:g} CPUs; lower one of them, e.g. {user_flag('--cpu-actors', str(max(1, int(cpus // actor_num_cpus))))} "
            "(actors that do not fit never start)"
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


def gpu_actor_option(tp: int, runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The ``.options()`` of one GPU engine actor: ``tp`` GPUs (one node's) and one CPU."""
    return {"num_gpus": tp, "num_cpus": 1, "runtime_env": runtime_env}


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


class NodeWatch:
    """Room for more engine actors on nodes that joined the cluster after the pool started (a lot added mid-run).

    Nodes alive when the watch is made are known; each later call looks at ``ray.nodes()`` and, for every alive
    node not seen before, makes the options of as many actors as it holds (GPU run: ``GPUs // tp`` of
    :func:`gpu_actor_option`; CPU run: ``CPUs // actor_num_cpus``), each pinned to that node
    (``NodeAffinitySchedulingStrategy``, not soft: a replacement after that node is lost waits for it and is
    dropped by the pool's placement rule). A node that leaves is a lost node as before.

    Args:
        options: the pool's per-slot options; new slots' options are appended to it.
        device: where the engines compute.
        tensor_parallel_size: GPUs per engine actor on a GPU run.
        actor_num_cpus: CPUs per engine actor on a CPU run.
        nodes: ``ray.nodes``-like callable (tests).
    """

    def __init__(self, options: list[dict[str, Any]], device: str, tensor_parallel_size: int, actor_num_cpus: float,
                 nodes: Any = None):
        import ray

        self.options, self.device, self.tp, self.actor_num_cpus = options, device, tensor_parallel_size, actor_num_cpus
        self.nodes = nodes or ray.nodes
        self.env = {k: os.environ[k] for k in ENV_PASSED_TO_ACTORS if k in os.environ}
        self.gpu_run = device != "cpu" and any(node_gpus(self.nodes()).values())
        self.known = {n["NodeID"] for n in self.nodes() if n.get("Alive")}

    def __call__(self) -> int:
        """Options for the actors new nodes hold, appended to ``options``; returns how many."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        added = 0
        for node in self.nodes():
            node_id = node["NodeID"]
            if not node.get("Alive") or node_id in self.known:
                continue
            self.known.add(node_id)
            resources = node.get("Resources", {})
            if self.gpu_run:
                count = int(resources.get("GPU", 0)) // self.tp
                base = gpu_actor_option(self.tp, {"env_vars": self.env} if self.env else None)
            else:
                count = int(float(resources.get("CPU", 0)) // self.actor_num_cpus)
                base = {"num_cpus": self.actor_num_cpus, "runtime_env": {"env_vars": self.env} if self.env else None}
            pin = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            self.options += [{**base, "scheduling_strategy": pin} for _ in range(count)]
            added += count
            log.info("node %s joined (%s): room for %d more engine actor(s)", node.get("NodeManagerAddress"),
                     {k: resources[k] for k in ("CPU", "GPU") if k in resources}, count)
        return added
