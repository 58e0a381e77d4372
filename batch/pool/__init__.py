"""The Ray pool: engine actors on the lot's GPUs (or CPU core groups) and the shard scheduler.

scheduler.py  run_pool, ShardPool: dispatch shards to actors, retry, blame and drop by the pool's rules
actor.py      EngineActor: one vLLM classifier per actor, classifying whole shards
placement.py  cpu_core_groups, actor_options: where each actor runs
local_ray.py  start, stop: the local Ray session a batch starts when no cluster is given
cluster_check.py  ``docpilot cluster-check``: one probe actor per card across the Ray cluster
"""
