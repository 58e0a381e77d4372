"""One node with two GPUs (a B200 lot), declared to a local Ray: the batch's real pool, run folders and merge with the
bench's instant engine (:mod:`tests.support.gpu_probe`), the run's device made ``cuda`` at its edge (torch's answer).

TP=1: one engine actor per card, distinct ``CUDA_VISIBLE_DEVICES``; TP=2: one actor holding both cards, its engine
section carrying ``tensor_parallel_size: 2``. Two nodes with one GPU each are ``test_gpu_cluster.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.corpora import news_rows, write_config, write_jsonl


@pytest.fixture(scope="module")
def two_gpu_ray(request: pytest.FixtureRequest):
    import ray
    from ray import cloudpickle

    import bench.instant_engine
    import tests.support.gpu_probe

    for module in (request.module, bench.instant_engine, tests.support.gpu_probe):
        cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    yield ray
    ray.shutdown()


def run_on_gpus(tmp_path, monkeypatch, batch_id: str, tp: int) -> tuple[dict, list[dict], list[dict]]:
    """The batch over 40 documents with ``engine.tensor_parallel_size: tp``; (summary, actors' info, rows)."""
    from batch.run.driver import parse_args, run_batch
    from classify.runrecords import read_jsonl
    from tests.support.gpu_probe import ProbeEngine

    monkeypatch.setattr("classify.device.on_accelerator", lambda: True)  # the card, as torch would see it
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(40))
    config = write_config(tmp_path / "c.json", shard_docs=5)
    data = json.loads(config.read_text())
    data["engine"]["tensor_parallel_size"] = tp
    config.write_text(json.dumps(data))
    summary = run_batch(parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", batch_id,
                                    "--skip-pilot-gate", "--no-progress"]),
                        _engine_actor=two_gpu_ray_remote(ProbeEngine))
    run = tmp_path / "runs" / batch_id
    actors = json.loads((run / "progress.json").read_text())["actors"]
    rows = read_jsonl(run / "results.jsonl")
    assert summary["total"] == 40 and sorted(r["id"] for r in rows) == sorted(r["id"] for r in news_rows(40))
    return summary, actors, rows


def two_gpu_ray_remote(cls):
    import ray

    return ray.remote(max_restarts=0, max_task_retries=0)(cls)


def test_tp1_one_actor_per_card_with_its_own_cuda_visible_devices(two_gpu_ray, tmp_path, monkeypatch):
    summary, actors, _ = run_on_gpus(tmp_path, monkeypatch, "tp1", 1)
    assert summary["this_attempt"]["actors"] == 2 and summary["this_attempt"]["tensor_parallel_size"] == 1
    assert sorted(a["cuda_visible_devices"] for a in actors) == ["0", "1"]
    assert sorted(g for a in actors for g in a["gpu_ids"]) == ["0", "1"]
    assert {a["tensor_parallel_size"] for a in actors} == {1}


def test_tp2_one_actor_holds_both_cards(two_gpu_ray, tmp_path, monkeypatch):
    summary, actors, _ = run_on_gpus(tmp_path, monkeypatch, "tp2", 2)
    assert summary["this_attempt"]["actors"] == 1 and summary["this_attempt"]["tensor_parallel_size"] == 2
    assert len(actors) == 1 and sorted(actors[0]["gpu_ids"]) == ["0", "1"]
    assert sorted(actors[0]["cuda_visible_devices"].split(",")) == ["0", "1"]
    assert actors[0]["tensor_parallel_size"] == 2  # the engine gets the TP its actor holds
    manifest = json.loads((tmp_path / "runs" / "tp2" / "manifest.json").read_text())
    assert manifest["full_config"]["engine"]["tensor_parallel_size"] == 2  # recorded with the run's config
