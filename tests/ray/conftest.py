"""The one local Ray of the ``ray`` tier (every test here gets the ``ray`` mark from its folder)."""

from __future__ import annotations

import os

import pytest


def declared_gpus() -> dict:
    """``num_gpus`` for the tier's local Ray: what the batch's own local start declares on this venv.

    A CPU venv declares none (as :func:`batch.run.attempt._init_ray` does), so the CPU rules hold on a
    GPU pod too. ``DOCPILOT_TEST_RAY_GPUS=N`` declares N GPUs instead, as Ray's NVML autodetection does on
    a pod with N cards: the tier then shows that the pool keeps the CPU rules on such a Ray.
    """
    if os.environ.get("DOCPILOT_TEST_RAY_GPUS"):
        return {"num_gpus": int(os.environ["DOCPILOT_TEST_RAY_GPUS"])}
    from classify.engine.args import detect_device

    return {"num_gpus": 0} if detect_device() == "cpu" else {}


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest):
    """A local Ray for one test module: 2 CPUs, GPUs as :func:`declared_gpus` says, no dashboard, a 100 MiB object store, workers' logs not echoed.

    The test module itself, :mod:`bench.instant_engine` and :mod:`tests.support.stand_in_actors` are pickled
    by value, so Ray's workers can run the stand-in actors defined there without importing ``tests``. A
    pilot or batch run inside the test joins this Ray (as it joins ``RAY_ADDRESS``). Yields the ``ray``
    module; shuts Ray down after the module's last test.
    """
    import ray
    from ray import cloudpickle

    import bench.instant_engine
    import tests.support.stand_in_actors

    for module in (request.module, bench.instant_engine, tests.support.stand_in_actors):
        cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False, **declared_gpus())
    yield ray
    ray.shutdown()
