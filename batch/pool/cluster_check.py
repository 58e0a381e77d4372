"""``docpilot cluster-check`` (``make cluster-check``): one probe actor per card across the Ray cluster, before the volume.

For each tensor-parallel group the batch would start (``GPUs // tp`` per node, :func:`batch.pool.placement.tp_groups`),
a placement group of ``tp`` one-GPU bundles with ``STRICT_PACK`` (all on one node, as the engine actor's ``tp``
GPUs are) is reserved, and one probe actor is placed in each bundle. Each probe reports its node, the card Ray gave it
(``ray.get_gpu_ids()``) and its ``CUDA_VISIBLE_DEVICES``. The check passes when every card of every alive node holds
exactly one probe, each group sits on one node, and no two probes share a card. Nothing loads a model.
On a cluster without GPUs it lists the nodes and their CPUs (the batch's CPU actors) and passes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from batch.pool.placement import node_gpus, tp_groups
from classify.config.sections import EngineConfig, ModelConfig, parse_config
from classify.errors import ConfigError, EnvironmentCheckError
from classify.machine.device import detect_device
from classify.model.memory import resolve_tensor_parallel
from classify.usercommand import cli_description

log = logging.getLogger(__name__)


class CardProbe:
    """Reports where Ray placed it (wrapped with ``ray.remote`` by :func:`check_cluster`)."""

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
                "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def check_cluster(tp: int = 1, timeout_s: float = 120.0, cards: bool = True) -> dict[str, Any]:
    """Place one probe per card of the connected Ray cluster in its tensor-parallel group and report where each landed.

    Args:
        tp: the engine's tensor-parallel size (cards per group; a group never spans nodes).
        timeout_s: seconds to wait for the placement groups and the probes.
        cards: place probes on the GPUs; ``False`` (a run whose engines compute on the CPU, GPUs declared or
            not): list the nodes only.

    Returns:
        ``{"ok", "nodes": [{node_id, ip, gpus, cpus}], "cards": [{group, node_id, node_ip, host, gpu_ids,
        cuda_visible_devices}], "groups", "problems"}``.

    Raises:
        ConfigError: no node has ``tp`` GPUs (:func:`batch.pool.placement.tp_groups`).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    described = [{"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress"), "gpus": int(n["Resources"].get("GPU", 0)),
                  "cpus": n["Resources"].get("CPU", 0)} for n in nodes]
    gpus = node_gpus(nodes) if cards else {}
    groups = tp_groups(gpus, tp)
    out: dict[str, Any] = {"ok": True, "tensor_parallel_size": tp, "nodes": described, "groups": groups, "cards": [],
                           "problems": []}
    if not groups:
        return out
    probe = ray.remote(num_cpus=0, num_gpus=1)(CardProbe)
    pgs = [placement_group([{"GPU": 1}] * tp, strategy="STRICT_PACK") for _ in range(groups)]
    actors = []
    try:
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
        if len(ready) < len(pgs):
            out["problems"].append(f"{len(pgs) - len(ready)} of {len(pgs)} TP groups of {tp} GPU(s) could not be "
                                   f"reserved within {timeout_s:g} s (another job holds the cards?)")
        for g, pg in enumerate(pgs):
            for bundle in range(tp):
                actor = probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=bundle)).remote()
                actors.append((g, actor))
        refs = [a.where.remote() for _, a in actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for (g, _), ref in zip(actors, refs, strict=True):
            if ref in done:
                out["cards"].append({"group": g, **ray.get(ref)})
    finally:
        for _, actor in actors:
            ray.kill(actor)
        for pg in pgs:
            remove_placement_group(pg)
    out["problems"] += _problems(out["cards"], gpus, groups, tp)
    out["ok"] = not out["problems"]
    return out


def _problems(cards: list[dict[str, Any]], gpus: dict[str, int], groups: int, tp: int) -> list[str]:
    problems = []
    if len(cards) != groups * tp:
        problems.append(f"{len(cards)} of {groups * tp} probes reported (one per card of {groups} TP group(s) of {tp})")
    seen = [(c["node_id"], g) for c in cards for g in c["gpu_ids"]]
    if len(seen) != len(set(seen)):
        problems.append("two probes were given the same card")
    for group in {c["group"] for c in cards}:
        on = {c["node_id"] for c in cards if c["group"] == group}
        if len(on) > 1:
            problems.append(f"TP group {group} spans {len(on)} nodes")
    unused = {n: g - g // tp * tp for n, g in gpus.items() if g % tp}
    if unused:
        problems.append(f"cards left out by TP {tp} (a node's GPUs not a multiple of it): {unused}")
    return problems


def report_lines(result: dict[str, Any]) -> list[str]:
    """:func:`check_cluster`'s result as the table ``make cluster-check`` prints (and the pilot logs): the nodes, then
    one row per card (node, ip, card, ``CUDA_VISIBLE_DEVICES``, TP group), the problems and the verdict."""
    tp = result["tensor_parallel_size"]
    out = [f"Ray cluster: {len(result['nodes'])} node(s), {sum(n['gpus'] for n in result['nodes'])} GPU(s), "
           f"tensor parallel {tp}: {result['groups']} engine actor(s)"]
    out += [f"  node {n['node_id'][:12]} {n['ip']}: {n['gpus']} GPU(s), {n['cpus']:g} CPU(s)" for n in result["nodes"]]
    if result["cards"]:
        out.append(f"  {'node':<14}{'ip':<16}{'card':<6}{'CUDA_VISIBLE_DEVICES':<22}TP group")
    out += [f"  {c['node_id'][:12]:<14}{c['node_ip']:<16}{','.join(c['gpu_ids']):<6}"
            f"{str(c['cuda_visible_devices']):<22}{c['group']}"
            for c in sorted(result["cards"], key=lambda c: (c["group"], c["gpu_ids"]))]
    if not result["groups"]:
        out.append("  no GPUs: the batch runs CPU engine actors (batch.cpu_actors)")
    out += [f"problem: {p}" for p in result["problems"]]
    return [*out, "cluster check: " + ("ok" if result["ok"] else "FAILED")]


def main(argv: list[str] | None = None) -> int:
    """``docpilot cluster-check [--config config/docpilot.json] [--timeout-s 120] [--json]``: joins ``RAY_ADDRESS``.

    Returns:
        0 when every card holds one probe of its TP group.

    Raises:
        EnvironmentCheckError: a probe is missing, a group spans nodes, a card is shared or left out (exit 6).
        ConfigError: no node has ``engine.tensor_parallel_size`` GPUs (``auto``: resolved as the batch resolves it,
            :func:`classify.model.memory.resolve_tensor_parallel`).
    """
    from pathlib import Path

    import ray

    p = argparse.ArgumentParser(prog="docpilot cluster-check", description=cli_description(__doc__))
    p.add_argument("--config", default="config/docpilot.json", help="the job's config (its engine.tensor_parallel_size)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="seconds to wait for the probes (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)

    try:
        data = json.loads(Path(args.config).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{args.config}: cannot read the job's config: {err}") from None
    engine = parse_config(EngineConfig, data.get("engine", {}), f"{args.config}: engine")
    model = parse_config(ModelConfig, data.get("model", {}), f"{args.config}: model")
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        log.warning("RAY_ADDRESS is not set: checking a local Ray of this machine only (docs/cluster.md)")
    ray.init(address=address or None, log_to_driver=False)
    try:
        tp = engine.tensor_parallel_size
        if tp == "auto":  # the batch's own resolution: this machine's card memory, the cluster's largest node
            device = detect_device()
            tp = resolve_tensor_parallel(engine, model, "cuda" if device == "cpu" else device,
                                         cards_per_node=max(node_gpus().values(), default=0))
        result = check_cluster(tp, args.timeout_s)
    finally:
        ray.shutdown()
    print(json.dumps(result, indent=2) if args.json else "\n".join(report_lines(result)))
    if not result["ok"]:
        raise EnvironmentCheckError(f"cluster check failed: {'; '.join(result['problems'])}")
    return 0
