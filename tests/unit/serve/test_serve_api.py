"""Fast bookkeeping tests of the HTTP layer: settings, the error shape, limits (fake engine, in-process).

The same paths run against the real engine over real HTTP in ``test_serve_http.py``; these add
the cases that need no model (settings refusals, the streamed body limit, a failed engine load).
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from classify.config.sections import PilotConfig
from classify.errors import ConfigError, EngineError
from serve.app import create_app
from serve.settings import load_settings
from tests.support.serve_app import AUTH, MODEL, TOKEN, FakeEngine, record_gate
from tests.support.serve_app import make_client as make_client  # noqa: F401  (fixture)
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture)


def _failing_engine():
    raise EngineError("vLLM could not load '/nonexistent': OSError: no weights")


@pytest.mark.parametrize(
    ("overrides", "env_token", "message"),
    [
        ({}, None, "DOCPILOT_API_TOKEN must be set to the bearer token clients send"),
        ({}, "changeme", "DOCPILOT_API_TOKEN is a placeholder, not a secret; it must be 16-512 visible ASCII"),
        ({}, "short-token", "DOCPILOT_API_TOKEN is 11 characters, under the minimum of 16"),
        ({"max_documents": 64, "max_in_flight_documents": 10}, TOKEN,
         r"`max_in_flight_documents` \(10\) must be at least `max_documents` \(64\)"),
        ({"port": 70000}, TOKEN, r"serve settings: `port` must be less than or equal to 65535, got 70000"),
        ({"max_documents": 0}, TOKEN, r"`max_documents` must be greater than or equal to 1, got 0"),
    ],
)
def test_settings_refusals(monkeypatch, overrides, env_token, message):
    monkeypatch.delenv("DOCPILOT_API_TOKEN", raising=False)
    if env_token:
        monkeypatch.setenv("DOCPILOT_API_TOKEN", env_token)
    with pytest.raises(ConfigError, match=message):
        load_settings(**overrides)


UNUSABLE_TOKENS = [  # (token as the environment holds it, what the refusal must say)
    (" " * 20, "is only whitespace (20 characters)"),
    ("\t \t \t \t \t \t \t \t \t", "is only whitespace"),
    ("changeme", "is a placeholder"),
    ("CHANGE-ME-CHANGE-ME-CHANGE-ME", "is a placeholder"),
    ("<your-api-token-here>", "is a placeholder"),
    ("${DOCPILOT_API_TOKEN}", "is a placeholder"),
    ("secret_secret_secret", "is a placeholder"),
    ("x" * 32, "has only 1 distinct characters"),
    ("xxx-xxx-xxx-xxx-xxx", "is a placeholder"),
    ("password1234567890", "is a placeholder"),
    ("a" * 40, "has only 1 distinct characters"),
    ("ab" * 20, "has only 2 distinct characters"),
    ("12341234123412341234", "has only 4 distinct characters"),
    ("Kq8x3vR2mN9pL0s", "is 15 characters, under the minimum of 16"),
    ("Kq8x3vR2mN9pL0sT" * 40, "is 640 characters, over the maximum of 512"),
    ("Kq8x3vR2 mN9pL0sT4wY", "has whitespace (U+0020) at position 8"),
    ("Kq8x3vR2mN9pL0sT4wY\n", "has whitespace (U+000A) at position 19"),
    ("Kq8x3vR2mN9\x01pL0sT4wY", "has a control character (U+0001) at position 11"),
    ("Kq8x3vR2mN9pL0sT4wY\u00e9", "has the non-ASCII character U+00E9 at position 19"),
    ("Kq8x3vR2mN9pL0sT4wY\udcff", "has a byte that is not UTF-8 (0xff) at position 19"),  # os.environ's surrogateescape
]


@pytest.mark.parametrize(("token", "says"), UNUSABLE_TOKENS)
def test_unusable_tokens_are_refused_with_the_rule_never_the_token(monkeypatch, token, says):
    monkeypatch.setenv("DOCPILOT_API_TOKEN", token)
    with pytest.raises(ConfigError) as err:
        load_settings()
    message = str(err.value)
    assert message.startswith(f"DOCPILOT_API_TOKEN {says}")
    assert "16-512 visible ASCII characters, at least 6 of them distinct, and not a placeholder" in message
    assert "secrets.token_urlsafe(32)" in message  # what to do next
    if len(token.strip()) >= 8:
        assert token.strip() not in message  # the token itself is never repeated


@pytest.mark.parametrize("token", ["Kq8x3vR2mN9pL0sT", "test-token-" + "k" * 24, "bench-" + "b" * 32,
                                   "0123456789abcdef0123456789abcdef", "a.b_c-d~e+f/g=h!i#j$k%"])
def test_usable_tokens_start(monkeypatch, token):
    monkeypatch.setenv("DOCPILOT_API_TOKEN", token)
    assert load_settings().api_token.get_secret_value() == token


def test_a_token_with_a_non_utf8_byte_is_refused_before_the_server_starts(tmp_path):
    """The environment holds raw bytes: ``docpilot serve`` must refuse at once, not start and answer 500."""
    import os
    import subprocess
    import sys

    env = {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in os.environ.items()}
    for raw in (b"Kq8x3vR2mN9pL0sT4wY\xff", b"\xc3\x28Kq8x3vR2mN9pL0sT4wY", b"Kq8x3vR2mN9pL0sT4wY\xe9t\xe9"):
        env[b"DOCPILOT_API_TOKEN"] = raw
        done = subprocess.run([sys.executable, "-m", "docpilot", "serve", "--port", "0"], env=env, cwd=tmp_path,
                              capture_output=True, timeout=120)
        assert done.returncode == ConfigError.exit_code, done.stderr.decode(errors="replace")[-2000:]
        assert b"DOCPILOT_API_TOKEN has a byte that is not UTF-8" in done.stderr
        assert raw not in done.stderr and raw not in done.stdout


def test_insecure_no_auth_needs_no_token(monkeypatch, registry):
    monkeypatch.delenv("DOCPILOT_API_TOKEN", raising=False)
    settings = load_settings(insecure_no_auth=True)
    app = create_app(settings, config=PilotConfig(), model=MODEL, registry=registry, engine_factory=FakeEngine)
    with TestClient(app) as client:
        time.sleep(0.2)
        assert client.get("/v1/adapters").status_code == 200


def test_cli_refuses_to_start_without_token(monkeypatch, capsys):
    from docpilot.cli import main

    monkeypatch.delenv("DOCPILOT_API_TOKEN", raising=False)
    assert main(["serve", "--port", "0"]) == ConfigError.exit_code
    assert "DOCPILOT_API_TOKEN must be set" in capsys.readouterr().err


def test_streamed_body_over_limit_is_413(registry, make_client):
    client = make_client(max_request_bytes=2048)

    def chunks():
        for _ in range(10):
            yield b" " * 512

    resp = client.post("/v1/classify", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 413
    message = resp.json()["error"]["message"]
    assert message.startswith("request body is at least ") and " bytes, over the limit of 2048 bytes" in message
    resp = client.post("/v1/classify", content=b" " * 4096, headers={**AUTH, "Content-Type": "application/json"})
    assert resp.json()["error"] == {
        "status": 413, "kind": "too_large",
        "message": "request body is 4096 bytes, over the limit of 2048 bytes (`max_request_bytes`); "
                   "send fewer or smaller documents per request",
    }


def test_failed_engine_load_is_reported_by_health_and_classify(registry, make_client):
    client = make_client(factory=_failing_engine)
    assert client.get("/healthz").status_code == 503
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "failed"
    resp = client.post("/v1/classify", json={"adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]}, headers=AUTH)
    assert resp.status_code == 503
    assert resp.json()["error"]["message"] == (
        "the engine failed to load: EngineError: vLLM could not load '/nonexistent': OSError: no weights"
    )


def test_base_model_pilot_gate_and_override(registry, make_client):
    body = {"documents": [{"id": "a", "text": "x"}]}
    resp = make_client().post("/v1/classify", json=body, headers=AUTH)
    assert resp.status_code == 409
    assert resp.json()["error"]["message"].startswith("base model fake-base (no adapter) has not passed a pilot (never piloted)")
    resp = make_client(skip_pilot_gate=True).post("/v1/classify", json=body, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["results"][0]["category"] == "tech"


def test_adapter_with_changed_file_is_refused_409(registry, make_client):
    adapter = registry.show("ok@1")
    (adapter.path / "adapter_model.safetensors").write_bytes(b"tampered")
    resp = make_client().post("/v1/classify", json={"adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]},
                                  headers=AUTH)
    assert resp.status_code == 409
    assert resp.json()["error"]["kind"] == "adapter_integrity"
    assert "adapter_model.safetensors: sha256" in resp.json()["error"]["message"]


def test_unpiloted_adapter_served_with_override(registry, make_client):
    registry.set_pilot_status("ok@1", "failed", "run-2")
    record_gate(registry.show("ok@1"), "fail", "run-2")
    body = {"adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]}
    resp = make_client().post("/v1/classify", json=body, headers=AUTH)
    assert resp.status_code == 409 and "card pilot status: failed, run run-2" in resp.json()["error"]["message"]
    assert "(latest pilot run-2 verdict fail)" in resp.json()["error"]["message"]
    resp = make_client(skip_pilot_gate=True).post("/v1/classify", json=body, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["adapter"] == "ok@1"


def _wait_for(predicate, timeout_s=5.0):
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_dead_engine_is_reported_everywhere_then_exit_is_requested(registry, make_client):
    client = make_client(engine_failure_exit_delay_s=0.2)
    state = client.app.state.server
    exits = []
    state.on_fatal = lambda: exits.append(time.time())
    assert client.get("/readyz").status_code == 200
    assert client.get("/v1/adapters", headers=AUTH).json()["adapters"][0]["servable"] is True
    state.engine.llm.errored = True  # what vLLM's monitor thread does when the core process dies
    _wait_for(lambda: client.get("/readyz").status_code == 503)  # the watchdog looks every second
    ready = client.get("/readyz").json()
    assert ready["status"] == "failed" and ready["error"].startswith("the vLLM engine core process died")
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["error"] == ready["error"]
    assert client.get("/v1/adapters", headers=AUTH).json()["adapters"][0]["servable"] is False
    assert "docpilot_engine_ready 0.0" in client.get("/metrics", headers=AUTH).text
    resp = client.post("/v1/classify", json={"adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]}, headers=AUTH)
    assert resp.status_code == 503
    assert resp.json()["error"]["message"] == f"the engine died: {ready['error']}"
    _wait_for(lambda: len(exits) == 1)


class EngineDeadError(Exception):
    """Stands for ``vllm.v1.engine.exceptions.EngineDeadError`` (matched by name)."""


class DyingEngine(FakeEngine):
    async def classify(self, docs, adapter=None):
        if docs[0].id == "warm-up":
            return await super().classify(docs, adapter)
        try:
            raise EngineDeadError("EngineCore encountered an issue")
        except EngineDeadError as err:
            raise EngineError(f"vLLM generate failed: EngineDeadError: {err}") from err


def test_engine_dead_error_in_a_request_flips_the_state_at_once(registry, make_client):
    client = make_client(DyingEngine)
    resp = client.post("/v1/classify", json={"adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]}, headers=AUTH)
    assert resp.status_code == 503 and resp.json()["error"]["kind"] == "engine"
    ready = client.get("/readyz")  # no watchdog wait: the failed request already flipped the state
    assert ready.status_code == 503 and "EngineDeadError" in ready.json()["error"]
    assert client.get("/healthz").status_code == 503


def test_openapi_documents_401_503_and_the_adapter_pattern(registry, make_client):
    from adapters.registry.registry import parse_ref
    from serve.schemas import ADAPTER_REF_PATTERN

    client = make_client(max_documents=5)
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path, method in (("/v1/classify", "post"), ("/v1/adapters", "get"), ("/metrics", "get")):
        assert "401" in paths[path][method]["responses"], path
    for path in ("/healthz", "/readyz"):
        assert "401" not in paths[path]["get"]["responses"]
        assert paths[path]["get"]["responses"]["503"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/NotReadyOut"}
    request = spec["components"]["schemas"]["ClassifyRequest"]["properties"]
    assert request["adapter"]["anyOf"][0]["pattern"] == ADAPTER_REF_PATTERN
    assert request["documents"]["maxItems"] == 5
    import re

    for ref in ("bbc-news", "bbc-news@3", "bbc-news@latest", "a.b_c-1@007"):
        assert re.fullmatch(ADAPTER_REF_PATTERN, ref) and parse_ref(ref)
    for ref in ("Bbc", "bbc news", "bbc@0", "bbc@x", "@1", "bbc@1@2", "-bbc"):
        assert not re.fullmatch(ADAPTER_REF_PATTERN, ref)
        with pytest.raises(Exception, match="adapter"):
            parse_ref(ref)
    resp = client.post("/v1/classify", json={"adapter": "Bad Name", "documents": [{"id": "a", "text": "x"}]}, headers=AUTH)
    assert resp.status_code == 422
    assert resp.json()["error"]["message"] == f"`adapter` must match pattern '{ADAPTER_REF_PATTERN}', got 'Bad Name'"
