"""One node with two GPUs (a B200 lot), declared to a local Ray: the batch's real pool, run folders and merge with the
bench's instant engine (:mod:`tests.support.gpu_probe`), the run's device made ``cuda`` at its edge (torch's answer).

TP=1: one engine actor per card, distinct ``CUDA_VISIBLE_DEVICES``; TP=2: one actor holding both cards, its engine
section carrying ``tensor_parallel_size: 2``. Two nodes with one GPU each are ``test_gpu_cluster.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.corpora import ROOT, news_rows, write_config, write_jsonl


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
    from classify.runs.records import read_jsonl
    from tests.support.gpu_probe import ProbeEngine

    monkeypatch.setattr("classify.machine.device.on_accelerator", lambda: True)  # the card, as torch would see it
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


def pilot_on_gpus(tmp_path, monkeypatch, pilot_config, place_timeout_s: float = 120.0):
    """The pilot (data/pilot) with :class:`ProbeEngine` on this Ray's two declared cards; its outcome."""
    from batch.pilot.run import run_pilot
    from classify.config.batch import BatchConfig
    from tests.support.gpu_probe import ProbeEngine

    monkeypatch.setattr("classify.machine.device.on_accelerator", lambda: True)  # the card, as torch would see it
    for var, sub in (("DOCPILOT_HOME", "home"), ("DOCPILOT_RUNS", "runs"), ("DOCPILOT_EXPORTS", "exports"),
                     ("DOCPILOT_REGISTRY", "registry")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    bcfg = BatchConfig.model_validate({"batch": {"actor_place_timeout_s": place_timeout_s}})
    return run_pilot(pilot_config, ROOT / "data" / "pilot", batch_cfg=bcfg, _engine_actor=two_gpu_ray_remote(ProbeEngine))


def test_the_pilot_start_pool_stage_checks_every_card_before_the_engines(two_gpu_ray, tmp_path, monkeypatch,
                                                                         pilot_config):
    outcome = pilot_on_gpus(tmp_path, monkeypatch, pilot_config)
    assert outcome.summary["first_error"] is None and outcome.stage == "verify", outcome.summary["first_error"]
    cluster = json.loads((outcome.run_dir / "environment.json").read_text())["cluster"]
    assert cluster["checked"] and cluster["ok"] and cluster["problems"] == []
    assert (cluster["tensor_parallel_size"], cluster["groups"], len(cluster["nodes"])) == (1, 2, 1)
    assert sorted((c["cuda_visible_devices"], c["group"]) for c in cluster["cards"]) in (
        [("0", 0), ("1", 1)], [("0", 1), ("1", 0)])  # one probe per card, each its own TP group


def test_the_pilot_fails_start_pool_when_a_card_gets_no_engine(two_gpu_ray, tmp_path, monkeypatch, pilot_config):
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    class OtherJob:  # another job holding one of the two cards
        def card(self) -> list:
            return ray.get_gpu_ids()

    other = OtherJob.remote()
    try:
        assert len(ray.get(other.card.remote(), timeout=120)) == 1
        outcome = pilot_on_gpus(tmp_path, monkeypatch, pilot_config, place_timeout_s=3.0)
    finally:
        ray.kill(other)
    assert (outcome.decision, outcome.stage, outcome.verdict) == ("fix-environment", "start-pool", "fail")
    first = outcome.summary["first_error"]
    assert first["type"] == "EnvironmentCheckError" and first["message"].startswith("cluster check failed: 1 of 2 TP "
                                                                                    "groups of 1 GPU(s) could not be")
    cluster = json.loads((outcome.run_dir / "environment.json").read_text())["cluster"]
    assert cluster["ok"] is False and len(cluster["cards"]) == 1  # the free card's probe reported, the held one none
    assert not (outcome.run_dir / "progress.json").exists() or not json.loads(
        (outcome.run_dir / "progress.json").read_text()).get("actors")  # no engine actor was started
