"""The one local Ray of the ``ray`` tier (every test here gets the ``ray`` mark from its folder)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest):
    """A local Ray for one test module: 2 CPUs, no dashboard, a 100 MiB object store, workers' logs not echoed.

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
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    yield ray
    ray.shutdown()
