"""A stand-in engine actor for the GPU-placement tests: the bench's instant engine that also says where it runs.

:class:`ProbeEngine` answers as :class:`bench.instant_engine.InstantEngineActor` (no model), and its ``info``
adds what Ray gave it: ``CUDA_VISIBLE_DEVICES``, ``ray.get_gpu_ids()``, the node id and the tensor-parallel
size its engine section carries. Each shard it classifies is recorded as ``<DOCPILOT_RUNS>/../seen/<first
id>.json`` (node id, pid, ``CUDA_VISIBLE_DEVICES``), so a test can tell which actor ran which shard.

A node started with ``PROBE_LATE=1`` in its environment is "the lot added mid-run": when the test has created
``seen/wait-for-late``, the other actors hold their shards until an actor on such a node has classified one (at most
``hold_s`` after that file was made), so that the late node is certain to find shards waiting, whatever the machine's speed.
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
        wait = self.seen / "wait-for-late"
        if wait.exists() and not me["late"]:
            deadline = wait.stat().st_mtime + self.hold_s  # one hold for the whole batch, not one per shard
            while not late_done.exists() and time.time() < deadline:
                time.sleep(0.2)
        out = super().classify(shard)
        first = json.loads(out.body.splitlines()[0])["id"]
        (self.seen / f"{first}.json").write_text(json.dumps(me))
        if me["late"]:
            late_done.touch()
        return out


def run(config: str, corpus: str, batch_id: str) -> int:
    """A batch driver with :class:`ProbeEngine` on a machine whose card torch would see (the device edge faked).

    Run as ``python -m tests.support.gpu_probe CONFIG CORPUS BATCH_ID`` with ``RAY_ADDRESS`` (and the cluster's
    token) in the environment: Ray reads its authentication settings when it is first imported, so a driver of a
    token-authenticated cluster is its own process. Prints the summary as JSON on its last line.
    """
    import sys

    import classify.machine.device
    from batch.run.driver import parse_args, run_batch
    from classify.errors import DocpilotError

    classify.machine.device.on_accelerator = lambda: True  # the card, as torch would see it
    import ray
    from ray import cloudpickle

    import bench.instant_engine

    cloudpickle.register_pickle_by_value(bench.instant_engine)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        summary = run_batch(parse_args(["--config", config, "--corpus", corpus, "--batch-id", batch_id,
                                        "--skip-pilot-gate", "--no-progress"]),
                            _engine_actor=ray.remote(max_restarts=0, max_task_retries=0)(ProbeEngine))
    except DocpilotError as err:
        print(f"error [{type(err).__name__}]: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(run(*sys.argv[1:4]))
