"""The Ray pool: engine actors on the lot's GPUs (or CPU core groups) and the shard scheduler.

scheduler.py  run_pool, ShardPool: dispatch shards to actors, retry, blame and drop by the pool's rules
actor.py      EngineActor: one vLLM classifier per actor, classifying whole shards
placement.py  cpu_core_groups, actor_options: where each actor runs
local_ray.py  start, stop: the local Ray session a batch starts when no cluster is given
"""

_PUBLIC = {
    "run_pool": "scheduler",
    "ShardPool": "scheduler",
    "EngineActor": "actor",
    "cpu_core_groups": "placement",
    "actor_options": "placement",
    "LocalRay": "local_ray",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562), so that importing one module of this room
    does not import the others (the pool's imports start Ray's, the run's start vLLM's)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
