"""The one local Ray of the ``ray`` tier (every test here gets the ``ray`` mark from its folder)."""

from __future__ import annotations

import os
import time

import pytest

_FOLLOWING: dict[str, object] = {}
"""``item``: the test that runs after the one being torn down (pytest's ``nextitem``); ``kept``: :func:`local_ray`
left Ray running for it."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    _FOLLOWING["item"] = nextitem
    return (yield)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Ray kept for this test that does not take it after all (its setup failed before ``local_ray``) is shut down."""
    if _FOLLOWING.get("kept") and "local_ray" not in item.fixturenames:
        import ray

        _FOLLOWING.pop("kept")
        ray.shutdown()


def declared_gpus() -> dict:
    """``num_gpus`` for the tier's local Ray: what the batch's own local start declares on this venv.

    A CPU venv declares none (as :func:`batch.run.attempt._init_ray` does), so the CPU rules hold on a
    GPU pod too. ``DOCPILOT_TEST_RAY_GPUS=N`` declares N GPUs instead, as Ray's NVML autodetection does on
    a pod with N cards: the tier then shows that the pool keeps the CPU rules on such a Ray.
    """
    if os.environ.get("DOCPILOT_TEST_RAY_GPUS"):
        return {"num_gpus": int(os.environ["DOCPILOT_TEST_RAY_GPUS"])}
    from classify.machine.device import detect_device

    return {"num_gpus": 0} if detect_device() == "cpu" else {}


def _idle(ray, wait_s: float = 3.0) -> bool:
    """True when no actor or placement group holds a CPU or GPU of ``ray`` (Ray reports freed resources within ~1 s)."""
    deadline = time.monotonic() + wait_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(k, 0.0) >= total[k] for k in ("CPU", "GPU") if k in total):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest):
    """A local Ray for the test modules that take it: 2 CPUs, GPUs as :func:`declared_gpus` says, no dashboard, a 100 MiB object store, workers' logs not echoed.

    The test module itself, :mod:`bench.instant_engine` and :mod:`tests.support.stand_in_actors` are pickled
    by value, so Ray's workers can run the stand-in actors defined there without importing ``tests``. A
    pilot or batch run inside the test joins this Ray (as it joins ``RAY_ADDRESS``). Yields the ``ray``
    module. After the module's last test Ray is shut down, unless the next test (pytest's ``nextitem``)
    takes ``local_ray`` too and no actor or placement group still holds a CPU or GPU: then that module
    takes over the same Ray, saving a start (~6 s on 2 cores). A module none of whose tests takes
    ``local_ray`` (one that starts its own Ray, or counts Ray's processes) never sees it running; within a
    module, the tests after the first that takes it run beside it, as before.
    """
    import ray
    from ray import cloudpickle

    import bench.instant_engine
    import tests.support.stand_in_actors

    for module in (request.module, bench.instant_engine, tests.support.stand_in_actors):
        cloudpickle.register_pickle_by_value(module)
    if not (_FOLLOWING.pop("kept", False) and ray.is_initialized()):
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False,
                 **declared_gpus())
    yield ray
    following = _FOLLOWING.get("item")
    if following is not None and "local_ray" in following.fixturenames and _idle(ray):
        _FOLLOWING["kept"] = True
        return
    ray.shutdown()
