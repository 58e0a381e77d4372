"""The server's adapter gate is the pilot gate: (base model, adapter sha256, classification config) (issue 13).

A pilot recorded under one ``classify`` config does not open the server for that adapter under
another (other categories, another prompt); under the same config it does. The adapter card's
``pilot`` block is information only. Fake engine, in-process (no model).
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from classify.config.sections import ClassifyConfig, PilotConfig, classification_sha256
from serve.app import create_app
from serve.settings import load_settings
from tests.support.serve_app import AUTH, MODEL, TOKEN, FakeEngine, record_gate
from tests.support.serve_app import make_client as make_client  # noqa: F401  (fixture)
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture: ok@1 published)

PILOTED = PilotConfig()
OTHER_CATEGORIES = PilotConfig(classify=ClassifyConfig(categories=("business", "politics", "science", "sport")))
OTHER_PROMPT = PilotConfig(classify=ClassifyConfig(instruction="Label the text with one topic."))
BODY = {"adapter": "ok@1", "documents": [{"id": "a", "text": "a new chip"}]}


def pilot(adapter, cfg: PilotConfig, verdict: str = "pass", mode: str = "lora", run_id: str = "run-gate") -> None:
    """Record a pilot outcome exactly as ``docpilot pilot`` keys it (batch/pilot/run.py)."""
    record_gate(adapter, verdict, run_id, cfg, mode=mode)


@pytest.fixture
def serve(make_client):  # noqa: F811
    """``serve(cfg)`` -> a started client of a server whose config is ``cfg`` (fake engine)."""
    return lambda cfg: make_client(config=cfg)


def _servable(client: TestClient) -> bool:
    return client.get("/v1/adapters", headers=AUTH).json()["adapters"][0]["servable"]


@pytest.mark.parametrize("other", [OTHER_CATEGORIES, OTHER_PROMPT], ids=["categories", "prompt"])
def test_pilot_under_one_config_does_not_open_the_server_under_another(registry, serve, other):  # noqa: F811
    adapter = registry.show("ok@1")
    assert adapter.card["pilot"]["status"] == "passed"  # the card says passed (the fixture's set_pilot_status) ...
    pilot(adapter, PILOTED)  # ... and the gate has a pass under PILOTED only
    refused = serve(other).post("/v1/classify", json=BODY, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"]["kind"] == "not_piloted"
    message = refused.json()["error"]["message"]
    assert message.startswith("adapter ok@1 under this server's config (classification sha256 "
                              f"{classification_sha256(other.model, other.classify)[:12]}; card pilot status: passed")
    assert "has not passed a pilot (never piloted)" in message
    assert not _servable(serve(other))
    same = serve(PILOTED)
    ok = same.post("/v1/classify", json=BODY, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["adapter"] == "ok@1"
    assert _servable(same)


def test_gate_record_decides_not_the_card(registry, serve):  # noqa: F811
    adapter = registry.show("ok@1")
    cfg = PilotConfig(classify=ClassifyConfig(max_doc_tokens=123))
    registry.set_pilot_status("ok@1", "failed", "run-card")  # the card's block is information only
    pilot(adapter, cfg, "pass", mode="merged")  # the default model.adapter_mode piloted merged: opens LoRA serving
    assert serve(cfg).post("/v1/classify", json=BODY, headers=AUTH).status_code == 200
    pilot(adapter, cfg, "fail", mode="lora", run_id="run-lora-failed")  # a failed LoRA pilot is not opened by the merged one
    refused = serve(cfg).post("/v1/classify", json=BODY, headers=AUTH)
    assert refused.status_code == 409
    assert "latest pilot run-lora-failed verdict fail" in refused.json()["error"]["message"]


def test_adapter_named_at_start_up_is_gated_too(registry):  # noqa: F811
    cfg = PilotConfig(classify=ClassifyConfig(max_doc_tokens=77))  # never piloted under this config
    app = create_app(load_settings(api_token=TOKEN, adapters=("ok@1",)), config=cfg, model=MODEL, registry=registry,
                     engine_factory=FakeEngine)
    with TestClient(app) as client:
        deadline = time.time() + 10
        while client.get("/readyz").json()["status"] == "loading" and time.time() < deadline:
            time.sleep(0.02)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "PilotGateError: adapter ok@1 under this server's config" in ready.json()["error"]
