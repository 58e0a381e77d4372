"""A stand-in engine actor for the GPU-placement tests: the bench's instant engine that also says where it runs.

:class:`ProbeEngine` answers as :class:`bench.instant_engine.InstantEngineActor` (no model), and its ``info``
adds what Ray gave it: ``CUDA_VISIBLE_DEVICES``, ``ray.get_gpu_ids()``, the node id and the tensor-parallel
size its engine section carries. Each shard it classifies is recorded as ``<DOCPILOT_RUNS>/../seen/<first
id>.json`` (node id, pid, ``CUDA_VISIBLE_DEVICES``), so a test can tell which actor ran which shard.

A node started with ``PROBE_LATE=1`` in its environment is "the lot added mid-run": when the test has created
``seen/wait-for-late``, the other actors hold each shard until an actor on such a node has classified one (at most
``hold_s``), so that the late node is certain to find shards waiting, whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench.instant_engine import InstantEngineActor


class ProbeEngine(InstantEngineActor):
    hold_s = 90.0

    def __init__(self, model_cfg, engine_cfg, classify_cfg, adapter, model_fingerprint, temperature=None):
        super().__init__(model_cfg, engine_cfg, classify_cfg, adapter, model_fingerprint, temperature)
        self.tp = engine_cfg.tensor_parallel_size
        self.seen = Path(os.environ["DOCPILOT_RUNS"]).parent / "seen"
        self.seen.mkdir(parents=True, exist_ok=True)

    def where(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "late": os.environ.get("PROBE_LATE") == "1"}

    def info(self) -> dict[str, Any]:
        return {**super().info(), **self.where(), "tensor_parallel_size": self.tp}

    def classify(self, shard):
        me = self.where()
        late_done = self.seen / "late-node-classified"
        if (self.seen / "wait-for-late").exists() and not me["late"]:
            deadline = time.monotonic() + self.hold_s
            while not late_done.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        out = super().classify(shard)
        first = json.loads(out.body.splitlines()[0])["id"]
        (self.seen / f"{first}.json").write_text(json.dumps(me))
        if me["late"]:
            late_done.touch()
        return out
