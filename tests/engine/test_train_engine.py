"""LoRA training: config, data checks, smoke run through the real engine, kill-and-resume in a new process.

Split by tier: this file holds the engine tests; the others of the same subject are in ``tests/unit/adapters/train/test_train.py``, ``tests/slow/test_train_slow.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.registry.registry import Registry
from adapters.train.train import train
from tests.support.training import quick_config
from tests.support.training import train_config as train_config  # noqa: F401  (fixture)


@pytest.mark.slow  # about 2 min on 2 cores (make test-slow); CI's make test-images trains, publishes and serves too
def test_smoke_training_checkpoints_publishes_and_serves_through_vllm(train_config, pilot_config, engine, bbc_dir):
    cfg = quick_config(train_config).model_copy(update={"checks": train_config.checks})
    outcome = train(cfg, smoke=True, classifier=engine)
    s = outcome.summary
    assert s["steps"] == cfg.smoke.max_steps and s["data"]["train_rows"] == cfg.smoke.train_rows
    assert s["checks"]["loss_fell"]["passed"] and s["failed_checks"] == []
    assert s["checks"]["checkpoints"]["checkpoints"] == ["step-000004", "step-000006"]  # keep_checkpoints = 2
    eng = s["checks"]["engine"]
    assert eng["accepted"] == eng["allowed"] == eng["rows"] == cfg.smoke.validation_rows
    assert sum(v["rows"] for v in eng["per_category"].values()) == eng["rows"]
    assert eng["calibration"]["fitted_on"] == f"validation split, n={cfg.smoke.validation_rows}"
    assert outcome.adapter is not None and outcome.adapter.ref == "bbc-news-smoke@1"
    resolved = Registry().resolve("bbc-news-smoke@latest", base_fingerprint=engine.model.fingerprint)
    card = resolved.card
    assert card["training"]["run_id"] == outcome.run_id and card["loss_curve"] == "loss_curve.png"
    assert card["calibration"] == eng["calibration"] and resolved.handle().temperature == eng["calibration"]["temperature"]
    assert (resolved.path / "reliability_validation_after.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (resolved.path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(card["files"])
    from batch.corpus.tabular import iter_csv

    docs = [d for d, _ in iter_csv(bbc_dir / "test.csv", 200_000, id_column=None, id_prefix="bbc-test")][:6]
    results = engine.classify(docs, adapter=resolved.handle())
    assert [r.id for r in results] == [d.id for d in docs]
    assert all(r.status == "accepted" and r.category in cfg.classify.categories for r in results)
    # make pilot ADAPTER=...: base + adapter through vLLM's LoRA support; the card records the outcome
    from batch.pilot.run import run_pilot

    pilot_set = Path(__file__).resolve().parents[2] / "data" / "pilot"
    lora_cfg = pilot_config.model_copy(update={"model": pilot_config.model.model_copy(update={"adapter_mode": "lora"})})
    trial = run_pilot(lora_cfg, pilot_set, adapter_ref="bbc-news-smoke@1")  # the batch pipeline: a LoRA engine actor
    params = json.loads((trial.run_dir / "params.json").read_text())
    assert params["adapter"]["sha256"] == resolved.sha256 and trial.summary["total"] == 12
    assert params["adapter"]["prompt_mismatch"] == [  # the smoke run trains on 48-token documents
        f"max_doc_tokens: trained {cfg.smoke.max_doc_tokens}, piloted {pilot_config.classify.max_doc_tokens}"]
    pilot = Registry().show("bbc-news-smoke@1").card["pilot"]
    assert pilot == {**pilot, "status": "passed" if trial.verdict == "pass" else "failed", "run_id": trial.run_id}
