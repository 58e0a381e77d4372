"""A CPU venv on a GPU pod: the local Ray declares a GPU (as its NVML autodetection does there), the run stays CPU.

This module starts its own Ray with ``num_gpus=1`` (the edge faked: Ray's count, not docpilot's code), then
runs the real placement and the real batch driver with the bench's instant engine. Before the one device
decision, the pool took Ray's GPU branch here: one actor, ``num_gpus=1``, ``batch.cpu_actors`` and the core
split ignored (``docs/setup.md``, "Where a run computes is one decision").
"""

from __future__ import annotations

import logging
import os

import pytest

from tests.support.corpora import news_rows, write_config, write_jsonl


def _cpu_venv() -> bool:
    from classify.machine.device import detect_device

    return detect_device() == "cpu"


pytestmark = pytest.mark.skipif(not _cpu_venv(), reason="the CPU profile's rules: this venv computes on a card")


@pytest.fixture(scope="module")
def gpu_ray(request: pytest.FixtureRequest):
    """A local Ray that declares one GPU on this CPU machine (2 CPUs, no dashboard)."""
    import ray
    from ray import cloudpickle

    import bench.instant_engine

    for module in (request.module, bench.instant_engine):
        cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    assert ray.cluster_resources().get("GPU") == 1
    yield ray
    ray.shutdown()


class Seen:
    def env(self) -> dict:
        import ray

        return {"bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "gpu_ids": ray.get_gpu_ids()}


def test_cpu_profile_keeps_the_cpu_rules_on_a_ray_that_declares_a_gpu(gpu_ray, monkeypatch, caplog):
    from batch.pool.placement import actor_options, cpu_core_groups
    from classify.errors import ConfigError
    from classify.machine.device import detect_device

    assert detect_device() == "cpu"  # this venv: CPU torch, vllm-cpu
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with caplog.at_level(logging.WARNING, logger="batch.pool.placement"):
        n, options = actor_options(2, 0.5, "split")
    assert n == 2 and all("num_gpus" not in o for o in options)
    assert "declares 1 GPU(s), but this venv computes on the CPU" in caplog.text
    seen = [gpu_ray.get(gpu_ray.remote(Seen).options(**options[slot]).remote().env.remote()) for slot in range(n)]
    assert [s["bind"] for s in seen] == cpu_core_groups(2, sorted(os.sched_getaffinity(0)))
    assert all(s["gpu_ids"] == [] for s in seen)
    with pytest.raises(ConfigError, match=r"`batch.cpu_actors` x `batch.actor_num_cpus` = 64 x 1.0 CPUs"):
        actor_options(64, 1.0, "split")  # the CPU-fit check holds too (the GPU branch skipped it)
    # the same Ray asked for a CUDA run: one actor per GPU, as before
    n_gpu, gpu_options = actor_options(2, 0.5, "split", device="cuda")
    assert n_gpu == 1 and gpu_options[0]["num_gpus"] == 1


def test_batch_on_a_gpu_declaring_ray_runs_two_cpu_actors_every_id_once(gpu_ray, tmp_path, monkeypatch):
    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from classify.runs.records import read_jsonl

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(40))
    config = write_config(tmp_path / "c.json", cpu_actors=2, actor_num_cpus=0.5, shard_docs=5)
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", "g", "--skip-pilot-gate",
                       "--no-progress"])
    summary = run_batch(args, _engine_actor=remote_class())
    rows = read_jsonl(tmp_path / "runs" / "g" / "results.jsonl")
    assert summary["total"] == 40 and len({r["id"] for r in rows}) == 40
    pool = summary["this_attempt"]
    assert (pool["actors"], pool["actors_started"], pool["errors"]) == (2, 2, [])
