"""An overloaded or hostile client against the real uvicorn server (in-process, on 127.0.0.1), fake engine.

The server here is the real app under the real ``uvicorn.Config`` of ``docpilot serve``
(:func:`serve.cli.uvicorn_config`: h11 with the header limit), on a free loopback port; only the
engine is a stand-in that holds each request for a while, so admission, hang-ups and the event
loop's health can be timed without a model. The same paths run against the real vLLM engine in
``tests/engine/test_serve_http.py`` (over capacity, hang-up aborts, auth before the body).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from tests.support.serve_app import AUTH, TOKEN, FakeEngine
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture: ok@1 published and piloted)
from tests.support.serve_app import serving as _serving

HEALTHZ_FAST_S = 1.0
"""Slowest acceptable ``/healthz`` while a hostile request is being handled (main: 5 s to 11.5 s)."""


class SlowEngine(FakeEngine):
    """Holds every request ``hold_s`` seconds; counts finished and cancelled (hung-up) documents."""

    def __init__(self, hold_s: float = 2.0):
        super().__init__()
        self.hold_s = hold_s
        self.finished = 0
        self.cancelled = 0

    async def classify(self, docs, adapter=None):
        if docs[0].id != "warm-up":
            try:
                await asyncio.sleep(self.hold_s)
            except asyncio.CancelledError:
                self.cancelled += len(docs)
                raise
            self.finished += len(docs)
        return await super().classify(docs, adapter)


@contextmanager
def serving(registry, engine=None, **settings):  # noqa: F811
    """Run the app under ``docpilot serve``'s uvicorn config in a thread; yield ``(url, app)``."""
    with _serving(registry, engine or SlowEngine(), **settings) as (url, app, _server):
        yield url, app


def _raw(port: int, head: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``head`` (request line and headers, no body) and read until the server answers or closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


class HealthProbe:
    """Polls ``/healthz`` from a thread while something else happens; keeps the slowest answer time."""

    def __init__(self, url: str):
        self.url, self.worst, self.answers = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get(f"{self.url}/healthz").status_code == 200
                self.worst = max(self.worst, time.perf_counter() - started)
                self.answers += 1
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


HEADS_WITHOUT_A_GOOD_TOKEN = [
    (b"", "missing bearer token"),
    (b"Authorization: Bearer wrong-token-0123456789\r\n", "invalid bearer token"),
    (b"Authorization: Basic dXNlcjpwYXNz\r\n", "missing bearer token"),
    (b"Authorization: Bearer " + b"k" * 4000 + b"\r\n", "Authorization header is 4007 bytes, over the limit of 519 bytes"),
    (b"Authorization: Bearer \xff\xfe" + TOKEN.encode()[2:] + b"\r\n", "invalid bearer token"),
]


@pytest.mark.parametrize(("auth", "says"), HEADS_WITHOUT_A_GOOD_TOKEN)
@pytest.mark.parametrize("path", [b"/v1/classify", b"/v1/adapters", b"/metrics"])
def test_the_token_is_checked_from_the_headers_before_any_body_byte(registry, auth, says, path):  # noqa: F811
    # the client announces a 10 MB body and sends none of it: the answer must come at once, from the headers
    with serving(registry) as (url, app):
        port = int(url.rsplit(":", 1)[1])
        head = (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10000000\r\n" + auth + b"\r\n")
        started = time.perf_counter()
        answer = _raw(port, head, timeout_s=5)
        assert time.perf_counter() - started < 2.0
        assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
        assert b"www-authenticate: Bearer" in answer.lower().replace(b"www-authenticate: bearer", b"www-authenticate: Bearer")
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert (error["status"], error["kind"]) == (401, "unauthorized") and error["message"].startswith(says)
        assert TOKEN not in answer.decode("latin-1")
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
        assert 'docpilot_errors_total{kind="unauthorized"} 1.0' in metrics
        assert TOKEN not in metrics


@pytest.mark.parametrize("what", ["one huge Authorization header", "many headers", "a huge request line"])
def test_oversized_headers_are_cut_off_while_they_stream_and_healthz_stays_fast(registry, what):  # noqa: F811
    chunk = 64 * 1024
    total = 64 * 2**20  # 64 MiB offered; the server must give up after max_header_bytes (16 KiB)
    with serving(registry) as (url, _), HealthProbe(url) as probe:
        port = int(url.rsplit(":", 1)[1])
        start = {
            "one huge Authorization header": b"GET /v1/adapters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ",
            "many headers": b"GET /v1/adapters HTTP/1.1\r\nHost: x\r\n",
            "a huge request line": b"GET /v1/adapters?q=",
        }[what]
        filler = b"X-Pad: " + b"p" * 90 + b"\r\n" if what == "many headers" else b"a"
        sent, answer = 0, b""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(start)
            block = filler * (chunk // len(filler))
            try:
                while sent < total:
                    sock.sendall(block)
                    sent += len(block)
            except OSError:  # the server closed the connection: it stopped reading
                pass
            try:
                sock.settimeout(5)
                answer = sock.recv(65536)
            except OSError:
                pass
        assert sent < 16 * 2**20, f"the server kept reading: {sent} bytes of headers sent"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
        time.sleep(0.2)
    assert probe.answers > 0 and probe.worst < HEALTHZ_FAST_S, probe.worst


def _huge_bodies() -> dict[str, tuple[bytes, int, str, str]]:
    one_char = b'{"documents": [' + b",".join([b'{"id":"%d","text":"x"}' % i for i in range(600_000)]) + b"]}"
    return {  # name: (body, status, kind, message start)
        "600k one-character documents": (one_char, 413, "too_large", "request holds 600000 documents, over the limit of 64"),
        "8 MiB of [": (b"[" * (8 * 2**20), 400, "bad_json", "request body is not valid JSON for this server: "
                       "arrays/objects nested too deeply"),
        "a 15 MiB text": (b'{"documents": [{"id": "a", "text": "' + b"y" * (15 * 2**20) + b'"}]}', 413, "too_large",
                          "document 'a' is 15728640 bytes, over the limit"),
    }


@pytest.mark.parametrize("name", list(_huge_bodies()))
def test_a_big_body_is_parsed_off_the_event_loop(registry, name):  # noqa: F811
    body, status, kind, start = _huge_bodies()[name]
    assert len(body) < 16 * 2**20  # under max_request_bytes: it has to be read and parsed
    with serving(registry) as (url, _), HealthProbe(url) as probe:
        time.sleep(0.1)
        resp = httpx.post(f"{url}/v1/classify", content=body, timeout=60,
                          headers={**AUTH, "Content-Type": "application/json"})
        time.sleep(0.1)
    error = resp.json()["error"]
    assert (resp.status_code, error["kind"]) == (status, kind) and error["message"].startswith(start), resp.text[:300]
    assert probe.answers > 0 and probe.worst < HEALTHZ_FAST_S, f"/healthz took {probe.worst:.2f} s"


NESTED_OR_REPEATED = [
    (b'{"documents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "bad_json", "request body is not valid JSON for "
     "this server: arrays/objects nested too deeply"),
    (b'{"documents": [{"id": "a", "text": ' + b'{"t": ' * 50_000 + b"1" + b"}" * 50_000 + b"}]}", 400, "bad_json",
     "request body is not valid JSON for this server: arrays/objects nested too deeply"),
    (b'{"documents": [{"id": "a", "text": "x"}], "documents": [{"id": "b", "text": "y"}]}', 422, "input",
     "request body repeats the key 'documents' inside one JSON object"),
    (b'{"documents": [{"id": "a", "id": "b", "text": "x"}]}', 422, "input", "request body repeats the key 'id'"),
    (b'{"adapter": null, "adapter": "ok@1", "documents": [{"id": "a", "text": "x"}]}', 422, "input",
     "request body repeats the key 'adapter'"),
    (b'{"documents": [{"id": "a", "text": "x", "text": "y"}]}', 422, "input", "request body repeats the key 'text'"),
    (b'{"documents": [{"id": "a", "text": "x"}], "extra": {"k": 1, "k": 2}}', 422, "input",
     "request body repeats the key 'k'"),
    (b'{"documents": [{"id": ' + b"9" * 5000 + b', "text": "x"}]}', 400, "bad_json",
     "request body is not valid JSON for this server"),
    (b"", 422, "input", "request body is empty"),
]


@pytest.mark.parametrize(("body", "status", "kind", "start"), NESTED_OR_REPEATED)
def test_deep_nesting_and_repeated_keys_have_documented_answers(registry, body, status, kind, start):  # noqa: F811
    from tests.support.serve_app import make_client  # noqa: F401

    with serving(registry, SlowEngine(hold_s=0.0)) as (url, _):  # no hold: the answers, not the wait, are tested
        resp = httpx.post(f"{url}/v1/classify", content=body, headers={**AUTH, "Content-Type": "application/json"},
                          timeout=60)
        error = resp.json()["error"]
        assert (resp.status_code, error["status"], error["kind"]) == (status, status, kind), resp.text[:300]
        assert error["message"].startswith(start)
        ok = httpx.post(f"{url}/v1/classify", json={"documents": [{"id": "a", "text": "x"}]}, headers=AUTH, timeout=30)
        assert ok.status_code == 200  # the server keeps serving


def test_over_capacity_is_answered_429_at_once_with_retry_after(registry):  # noqa: F811
    engine = SlowEngine(hold_s=2.0)
    with serving(registry, engine, max_documents=4, max_in_flight_documents=8) as (url, app):
        body = {"documents": [{"id": f"d{i}", "text": "x"} for i in range(4)]}

        def post(_):
            started = time.perf_counter()
            resp = httpx.post(f"{url}/v1/classify", json=body, headers=AUTH, timeout=30)
            return resp, time.perf_counter() - started

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(post, range(6)))
        ok = [(r, t) for r, t in answers if r.status_code == 200]
        busy = [(r, t) for r, t in answers if r.status_code == 429]
        assert len(ok) == 2 and len(busy) == 4, [r.status_code for r, _ in answers]
        for resp, took in busy:
            assert took < 1.0  # refused at once, not queued behind the engine
            error = resp.json()["error"]
            assert error["kind"] == "overloaded" and "(`max_in_flight_documents`)" in error["message"]
            assert 1 <= int(resp.headers["retry-after"]) <= 60
        assert engine.finished == 8  # only what was admitted reached the engine
        state = app.state.server
        assert state.admission.in_flight == 0
        resp, _ = post(0)  # after the load, admitted again; Retry-After now follows the measured rate
        assert resp.status_code == 200
        assert state.admission.docs_per_s() > 0
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
        assert 'docpilot_errors_total{kind="overloaded"} 4.0' in metrics
        assert "docpilot_documents_in_flight 0.0" in metrics


def test_a_client_that_hangs_up_has_its_documents_cancelled_and_released(registry):  # noqa: F811
    engine = SlowEngine(hold_s=30.0)
    with serving(registry, engine, max_documents=8, max_in_flight_documents=8) as (url, app):
        port = int(url.rsplit(":", 1)[1])
        for n in (8, 3, 1):
            body = json.dumps({"documents": [{"id": f"d{i}", "text": "x"} for i in range(n)]}).encode()
            before = engine.cancelled
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                deadline = time.time() + 5
                while app.state.server.admission.in_flight != n:
                    assert time.time() < deadline
                    time.sleep(0.02)
            deadline = time.time() + 5  # closed: the engine work is cancelled and its place freed at once
            while engine.cancelled != before + n or app.state.server.admission.in_flight:
                assert time.time() < deadline, (engine.cancelled, app.state.server.admission.in_flight)
                time.sleep(0.02)
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
        assert "docpilot_documents_aborted_total 12.0" in metrics
        assert 'docpilot_requests_total{method="POST",route="/v1/classify",status="499"} 3.0' in metrics
        assert engine.finished == 0
