"""The serving app over a fake engine, in-process: the fake engine, a registry with ``ok@1`` and a client factory.

Shared by the unit tests of ``serve/`` (settings, limits, the pilot gate, hostile requests) and the
tests of odd inputs and transfers that go through the real app. ``registry`` and ``make_client`` are
fixtures: a test module imports them by name (``from tests.support.serve_app import make_client, registry``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save_file

from classify.config.sections import PilotConfig
from classify.model.model import ModelRef
from classify.records import Result
from serve.app import create_app
from serve.settings import load_settings

TOKEN = "tok-" + "0123456789abcdef" * 2
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = ModelRef("fake-base", "/nonexistent", "sha256:" + "0" * 64, "test")


class FakeLLM:
    """vLLM's ``AsyncLLM`` as the server sees it: ``add_lora`` and ``errored`` (set when the core dies)."""

    errored = False

    async def add_lora(self, request):
        return True


class FakeEngine:
    """Accepts every readable document as 'tech' (bookkeeping only; never the only test of a path)."""

    def __init__(self):
        self.llm = FakeLLM()

    async def classify(self, docs, adapter=None):
        return [Result.rejected(d, d.reject_reason) if d.reject_reason
                else Result(id=d.id, status="accepted", category="tech", score=0.5) for d in docs]

    def shutdown(self):
        pass


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry with ``ok@1`` published and piloted; pilot records (``<DOCPILOT_HOME>/pilots``) are this test's
    own, so a pass another test recorded for the fake base model cannot open a gate here."""
    from adapters.registry.registry import Registry

    monkeypatch.setenv("DOCPILOT_HOME", str(tmp_path / "state"))

    reg = Registry(tmp_path / "registry")
    src = tmp_path / "src"
    src.mkdir()
    (src / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                         "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"  # a tiny LoRA the engine-compat check accepts
    save_file({f"{prefix}.lora_A.weight": np.zeros((8, 4), np.float16),
               f"{prefix}.lora_B.weight": np.zeros((4, 8), np.float16)}, str(src / "adapter_model.safetensors"))
    reg.publish(src, "ok", 1, {"base_model": {"name": MODEL.name, "fingerprint": MODEL.fingerprint}})
    reg.set_pilot_status("ok@1", "passed", "run-1")
    record_gate(reg.show("ok@1"), "pass", "run-1")
    return reg


def record_gate(adapter, verdict: str, run_id: str, cfg: PilotConfig | None = None,
                fingerprint: str = MODEL.fingerprint, mode: str = "lora") -> None:
    """Record a pilot of ``adapter`` under ``cfg`` (default ``PilotConfig()``) in the pilot gate, keyed as
    ``docpilot pilot`` keys it (``mode``: the adapter mode piloted, LoRA by default)."""
    from classify.config.sections import classification_sha256
    from classify.runs.gate import combo_key, record_pilot

    cfg = cfg or PilotConfig()
    key = combo_key(fingerprint, adapter.sha256, classification_sha256(cfg.model, cfg.classify), mode)
    record_pilot(key, run_id, verdict, {"what": "test"})


@pytest.fixture
def make_client(registry):
    """``make_client(factory=FakeEngine, config=PilotConfig(), **settings)`` -> a started TestClient (closed at teardown)."""
    clients = []

    def make(factory=FakeEngine, config: PilotConfig | None = None, **settings):
        app = create_app(load_settings(api_token=TOKEN, **settings), config=config or PilotConfig(), model=MODEL,
                         registry=registry, engine_factory=factory)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        deadline = time.time() + 10
        while client.get("/readyz").json()["status"] == "loading" and time.time() < deadline:
            time.sleep(0.02)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def served_within(url: str, seconds: float) -> None:
    """A health probe and one authenticated classify call both answer 200 within ``seconds`` (the real server at
    ``url``, while a test holds other connections open)."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5) as client:
        assert client.get(f"{url}/healthz").status_code == 200
        r = client.post(f"{url}/v1/classify", headers=AUTH, json={"documents": [{"id": "a", "text": "hello"}]})
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < seconds


def free_port() -> int:
    """A free TCP port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(registry, engine, **settings):
    """Run the app under ``docpilot serve``'s uvicorn config (:func:`serve.cli.uvicorn_config`) in a thread on a free
    port of 127.0.0.1; yield ``(url, app, server)`` once ``/readyz`` answers 200, stop it on exit."""
    import httpx
    import uvicorn

    from serve.cli import uvicorn_config

    opts = {"api_token": TOKEN, "port": free_port(), "skip_pilot_gate": True, **settings}
    cfg = load_settings(**opts)
    app = create_app(cfg, config=PilotConfig(), model=MODEL, registry=registry, engine_factory=lambda: engine)
    server = uvicorn.Server(uvicorn_config(app, cfg))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{cfg.port}"
    deadline = time.time() + 20
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "in-process server not ready"
        time.sleep(0.05)
    try:
        yield url, app, server
    finally:
        server.should_exit = True
        thread.join(30)
