"""The real server on 127.0.0.1: real uvicorn, real vLLM async engine, real LoRA adapters from the registry.

One server process starts for the module (``docpilot serve`` in a subprocess, about 1-2 min on
the 2-core CPU); every request is bounded by a timeout. The last test stops it with SIGTERM.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from batch.corpus.tabular import iter_csv
from classify.documents.read import document_from_text
from tests.support.answers import score_tolerance
from tests.support.servers import AUTH, REQUEST_TIMEOUT_S, TOKEN, make_tiny_lora, start_server, stop_server

pytestmark = pytest.mark.timeout(1200)  # the module's server may take up to START_TIMEOUT_S (600 s) to start


MAX_DOCUMENTS = 8
MAX_DOC_BYTES = 60_000
MAX_IN_FLIGHT = 16
ADAPTER_ARTICLES = 3  # the articles a test sends through the adapter: an unmerged LoRA costs ~3 s each on the 2-core CPU engine


@pytest.fixture(scope="module")
def published(pilot_config, tmp_path_factory):
    """Publish a piloted adapter (tiny-lora@1) and an unpiloted one (tiny-raw@1); record a base-model pilot pass."""
    from adapters.registry.registry import Registry
    from classify.config.sections import classification_sha256
    from classify.model.model import resolve_model
    from classify.runs.gate import combo_key, record_pilot

    model = resolve_model(pilot_config.model)
    reg = Registry()
    card = {"base_model": {"name": model.name, "fingerprint": model.fingerprint}, "training": {"kind": "random-init test"}}
    for name, seed in (("tiny-lora", 1), ("tiny-raw", 2)):
        src = make_tiny_lora(model.path, tmp_path_factory.mktemp(name), seed)
        reg.publish(src, name, 1, card)
    reg.set_pilot_status("tiny-lora@1", "passed", "test-pilot")
    config_sha = classification_sha256(pilot_config.model, pilot_config.classify)
    for sha in (None, reg.show("tiny-lora@1").sha256):  # the base model alone, and tiny-lora through LoRA
        record_pilot(combo_key(model.fingerprint, sha, config_sha), "test-pilot", "pass", {"what": "test"})
    return reg


@pytest.fixture(scope="module")
def server(published, tmp_path_factory):
    """``docpilot serve`` on a free loopback port; yields ``(base_url, process, log_path)``."""
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    url, proc = start_server(log_path, "--adapter", "tiny-lora@1", "--max-documents", str(MAX_DOCUMENTS),
                             "--max-doc-bytes", str(MAX_DOC_BYTES), "--graceful-timeout-s", str(REQUEST_TIMEOUT_S),
                             "--max-in-flight-documents", str(MAX_IN_FLIGHT))
    try:
        yield url, proc, log_path
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server[0], timeout=REQUEST_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def bbc_docs(bbc_dir):
    rows = list(iter_csv(bbc_dir / "test.csv", MAX_DOC_BYTES, id_column=None, id_prefix="bbc-test"))
    return [{"id": doc.id, "text": doc.text} for doc, _ in rows[:6]]


def _classify(client, documents, adapter=None, headers=AUTH):
    body = {"documents": documents} if adapter is None else {"adapter": adapter, "documents": documents}
    return client.post("/v1/classify", json=body, headers=headers)


def _error(resp, status, kind):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert (err["status"], err["kind"]) == (status, kind)
    return err["message"]


def test_health_needs_no_token(client):
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").json()["status"] == "ready"
    assert client.get("/docs").status_code == 200
    assert "/v1/classify" in client.get("/openapi.json").json()["paths"]


def test_classify_one_document_base_model(client, pilot_config, bbc_docs):
    resp = _classify(client, bbc_docs[:1])
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == pilot_config.model.base_model and body["adapter"] is None
    [result] = body["results"]
    assert set(result) == {"id", "status", "category", "score", "reason", "n_doc_tokens", "n_windows", "truncated"}
    assert result["id"] == bbc_docs[0]["id"] and result["status"] == "accepted"
    assert result["n_windows"] == 1 and 0 < result["n_doc_tokens"] <= pilot_config.classify.max_doc_tokens
    assert result["category"] in pilot_config.classify.categories and 0 <= result["score"] <= 1


@pytest.mark.parametrize("adapter", [pytest.param(None, marks=pytest.mark.slow), "tiny-lora@1"])  # base: make test-slow
def test_many_documents_equal_the_offline_engine(client, engine, published, bbc_docs, adapter, pilot_config):
    articles = bbc_docs if adapter is None else bbc_docs[:ADAPTER_ARTICLES]
    documents = articles + [{"id": "blank", "text": "   \n"}, {"id": "binary", "text": "\x01\x02\x03\x04 x"}]
    resp = _classify(client, documents, adapter)
    assert resp.status_code == 200, resp.text
    assert resp.json()["adapter"] == adapter
    served = resp.json()["results"]
    handle = published.resolve(adapter).handle() if adapter else None
    offline = engine.classify([document_from_text(d["id"], d["text"], MAX_DOC_BYTES) for d in documents], handle)
    assert [r["id"] for r in served] == [d["id"] for d in documents]
    for got, want in zip(served, offline, strict=True):
        assert (got["id"], got["status"], got["category"], got["reason"]) == (want.id, want.status, want.category, want.reason)
        if want.score is not None:
            assert got["score"] == pytest.approx(want.score, abs=score_tolerance(pilot_config.model))
    assert served[-2]["reason"] == "empty document: only whitespace"
    assert served[-1]["reason"].startswith("binary content")


def test_base_and_adapter_served_at_once(client, bbc_docs, pilot_config):
    bbc_docs = bbc_docs[:ADAPTER_ARTICLES]
    refs = (None, "tiny-lora@1")
    alone = {ref: _classify(client, bbc_docs, ref).json()["results"] for ref in refs}
    with ThreadPoolExecutor(len(refs)) as pool:
        together = dict(zip(refs, pool.map(lambda ref: _classify(client, bbc_docs, ref).json()["results"], refs), strict=True))
    for ref in refs:
        assert [r["category"] for r in together[ref]] == [r["category"] for r in alone[ref]]
        assert [r["score"] for r in together[ref]] == pytest.approx([r["score"] for r in alone[ref]],
                                                                       abs=score_tolerance(pilot_config.model))
    assert [(r["category"], r["score"]) for r in alone[None]] != [(r["category"], r["score"]) for r in alone["tiny-lora@1"]]


def test_auth_401(client, bbc_docs):
    msg = _error(_classify(client, bbc_docs[:1], headers={}), 401, "unauthorized")
    assert msg.startswith("missing bearer token")
    resp = _classify(client, bbc_docs[:1], headers={"Authorization": "Bearer " + "x" * len(TOKEN)})
    assert _error(resp, 401, "unauthorized") == "invalid bearer token"
    assert resp.headers["www-authenticate"] == "Bearer"
    _error(client.get("/v1/adapters"), 401, "unauthorized")
    _error(client.get("/metrics"), 401, "unauthorized")


def test_limits_413_and_duplicates_422(client):
    many = [{"id": f"d{i}", "text": "short text"} for i in range(MAX_DOCUMENTS + 1)]
    msg = _error(_classify(client, many), 413, "too_large")
    assert msg == (f"request holds {MAX_DOCUMENTS + 1} documents, over the limit of {MAX_DOCUMENTS} per request "
                   "(`max_documents`); send them in several requests")
    msg = _error(_classify(client, [{"id": "big", "text": "a" * (MAX_DOC_BYTES + 1)}]), 413, "too_large")
    assert msg.startswith(f"document 'big' is {MAX_DOC_BYTES + 1} bytes, over the limit of {MAX_DOC_BYTES} bytes")
    msg = _error(_classify(client, [{"id": "a", "text": "x y"}, {"id": "a", "text": "z"}]), 422, "input")
    assert msg == "duplicate document ids in one request: ['a']; give each document a unique `id`"


def test_unknown_adapter_404_and_unpiloted_409(client, bbc_docs):
    msg = _error(_classify(client, bbc_docs[:1], "nope@1"), 404, "adapter_not_found")
    assert msg.startswith("adapter 'nope' not found in registry")
    _error(_classify(client, bbc_docs[:1], "tiny-lora@7"), 404, "adapter_not_found")
    msg = _error(_classify(client, bbc_docs[:1], "tiny-raw@1"), 409, "not_piloted")
    assert msg.startswith("adapter tiny-raw@1 under this server's config (classification sha256 ")
    assert "card pilot status: not-run) has not passed a pilot (never piloted)" in msg


@pytest.mark.parametrize(
    ("content", "ctype", "status", "kind", "start"),
    [
        (b'{"documents": [{"id": "a", "text": "x"}', "application/json", 400, "bad_json", "request body is not valid JSON"),
        (b'{"documents": [{"id": "a", "text": "caf\xe9"}]}', "application/json", 400, "bad_request", "request body is not valid UTF-8"),
        (b'{"documents": [{"id": 7, "text": "x"}]}', "application/json", 422, "input", "`documents.0.id` must be a valid string"),
        (b'{"documents": [{"id": "a", "text": ["x"]}]}', "application/json", 422, "input", "`documents.0.text` must be a valid string"),
        (b'{"documents": []}', "application/json", 422, "input", "`documents` must have at least 1 item"),
        (b'{"documents": [{"id": "a", "text": ""}]}', "application/json", 422, "input", "`documents.0.text` must have at least 1 character"),
        (b'{"docs": []}', "application/json", 422, "input", "`documents` is required"),
        (b'[1, 2]', "application/json", 400, "bad_request", "request body must be a JSON object"),
        (b'{"documents": [{"id": "a", "text": "x"}]}', "text/plain", 400, "bad_request", "request body must be a JSON object"),
    ],
)
def test_bad_bodies_get_clear_4xx_and_the_server_keeps_serving(client, bbc_docs, content, ctype, status, kind, start):
    resp = client.post("/v1/classify", content=content, headers={**AUTH, "Content-Type": ctype})
    assert _error(resp, status, kind).startswith(start)
    assert _classify(client, bbc_docs[:1]).status_code == 200


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def test_metrics_count_what_was_sent(client, bbc_docs):
    before = client.get("/metrics", headers=AUTH).text
    assert _classify(client, bbc_docs[:3] + [{"id": "blank", "text": " "}], "tiny-lora@1").status_code == 200
    _classify(client, bbc_docs[:1], headers={})
    after = client.get("/metrics", headers=AUTH).text
    docs = {s: _metric(after, "docpilot_documents_total", adapter="tiny-lora@1", status=s)
            - _metric(before, "docpilot_documents_total", adapter="tiny-lora@1", status=s) for s in ("accepted", "rejected")}
    assert docs == {"accepted": 3, "rejected": 1}
    route = {"route": "/v1/classify", "method": "POST"}
    assert _metric(after, "docpilot_requests_total", **route, status="200") - _metric(before, "docpilot_requests_total", **route, status="200") == 1
    assert _metric(after, "docpilot_errors_total", kind="unauthorized") - _metric(before, "docpilot_errors_total", kind="unauthorized") == 1
    count = "docpilot_request_latency_seconds_count"
    assert _metric(after, count, route="/v1/classify") - _metric(before, count, route="/v1/classify") == 2
    assert _metric(after, "docpilot_engine_ready") == 1


def test_adapters_listing(client, published):
    body = client.get("/v1/adapters", headers=AUTH).json()
    rows = {a["ref"]: a for a in body["adapters"]}
    assert rows["tiny-lora@1"]["pilot_status"] == "passed" and rows["tiny-lora@1"]["servable"]
    assert rows["tiny-lora@1"]["loaded"] and rows["tiny-lora@1"]["base_model_matches"]
    assert rows["tiny-raw@1"]["pilot_status"] == "not-run" and not rows["tiny-raw@1"]["servable"]
    assert body["unreadable"] == []
    from adapters.registry.registry import Registry

    broken = Registry().root / "tiny-broken" / "1"
    broken.mkdir(parents=True)
    try:  # one unreadable card is named; the other versions are listed all the same
        (broken / "card.json").write_text("{ not json")
        body = client.get("/v1/adapters", headers=AUTH).json()
        assert {a["ref"] for a in body["adapters"]} >= {"tiny-lora@1", "tiny-raw@1"}
        assert len(body["unreadable"]) == 1 and body["unreadable"][0].startswith("adapter tiny-broken@1: card.json is unreadable")
    finally:
        shutil.rmtree(broken.parent)


@pytest.fixture(scope="module")
def eight_docs(bbc_dir):
    rows = list(iter_csv(bbc_dir / "test.csv", MAX_DOC_BYTES, id_column=None, id_prefix="bbc-test"))
    return [{"id": doc.id, "text": doc.text} for doc, _ in rows[10:10 + MAX_DOCUMENTS]]


def test_over_capacity_is_429_at_once_with_retry_after_and_only_admitted_work_runs(client, eight_docs):
    before = client.get("/metrics", headers=AUTH).text

    def post(_):
        started = time.perf_counter()
        resp = _classify(client, eight_docs)
        return resp, time.perf_counter() - started

    with ThreadPoolExecutor(5) as pool:  # 5 x 8 = 40 documents offered at once, 16 admitted
        answers = list(pool.map(post, range(5)))
    statuses = sorted(r.status_code for r, _ in answers)
    assert statuses.count(429) >= 2 and set(statuses) <= {200, 429}, statuses
    for resp, took in answers:
        if resp.status_code == 429:
            assert took < 2.0, took  # refused at once, not queued behind the engine
            assert resp.json()["error"]["kind"] == "overloaded" and 1 <= int(resp.headers["retry-after"]) <= 60
        else:
            assert [r["id"] for r in resp.json()["results"]] == [d["id"] for d in eight_docs]
    after = client.get("/metrics", headers=AUTH).text
    classified = (_metric(after, "docpilot_documents_total", adapter="base", status="accepted")
                  - _metric(before, "docpilot_documents_total", adapter="base", status="accepted"))
    assert classified == 8 * statuses.count(200)  # nothing refused was classified
    assert _metric(after, "docpilot_documents_in_flight") == 0


def _send_then_hang_up(url: str, body: dict, wait_for_in_flight: int) -> None:
    port = int(url.rsplit(":", 1)[1])
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock, httpx.Client(base_url=url, timeout=30) as c:
        sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                     + TOKEN.encode() + b"\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
        deadline = time.time() + 30
        while _metric(c.get("/metrics", headers=AUTH).text, "docpilot_documents_in_flight") < wait_for_in_flight:
            assert time.time() < deadline, "the request was never admitted"
            time.sleep(0.01)
    # the socket is closed here: the client has gone


def test_a_client_that_hangs_up_has_its_documents_aborted_in_the_engine(server, client, eight_docs, pilot_config):
    url = server[0]
    alone = _classify(client, eight_docs[:4]).json()["results"]  # the base model alone, for the check below
    before = client.get("/metrics", headers=AUTH).text
    for adapter in ("tiny-lora@1", None):
        body = {"documents": eight_docs} if adapter is None else {"adapter": adapter, "documents": eight_docs}
        _send_then_hang_up(url, body, len(eight_docs))
        deadline = time.time() + 20
        while _metric(client.get("/metrics", headers=AUTH).text, "docpilot_documents_in_flight") != 0:
            assert time.time() < deadline, "hung-up documents still in flight"
            time.sleep(0.05)
    after = client.get("/metrics", headers=AUTH).text
    assert _metric(after, "docpilot_documents_aborted_total") - _metric(before, "docpilot_documents_aborted_total") == 16
    route = {"route": "/v1/classify", "method": "POST"}
    assert (_metric(after, "docpilot_requests_total", **route, status="499")
            - _metric(before, "docpilot_requests_total", **route, status="499")) == 2
    for label in ("base", "tiny-lora@1"):  # nothing of the abandoned work was counted as classified
        assert (_metric(after, "docpilot_documents_total", adapter=label, status="accepted")
                == _metric(before, "docpilot_documents_total", adapter=label, status="accepted"))
    # the base/adapter step separation holds across the aborts: base answers equal the base model alone
    _send_then_hang_up(url, {"adapter": "tiny-lora@1", "documents": eight_docs}, len(eight_docs))
    again = _classify(client, eight_docs[:4]).json()["results"]
    assert [r["category"] for r in again] == [r["category"] for r in alone]
    assert [r["score"] for r in again] == pytest.approx([r["score"] for r in alone], abs=score_tolerance(pilot_config.model))


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP response as the server sent it: its header block, then ``Content-Length`` bytes of body (the body
    may arrive in a later TCP segment than the headers), or, without ``Content-Length`` (uvicorn's own 400 is
    ``Connection: close`` and writes its body after its headers), what came before the server closed the
    connection."""
    answer = b""
    while True:
        chunk = sock.recv(65536)
        answer += chunk
        head, sep, body = answer.partition(b"\r\n\r\n")
        if not chunk:
            return answer
        if sep:
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            if length is not None and len(body) >= int(length.group(1)):
                return answer


@pytest.mark.parametrize("auth", [b"", b"Authorization: Bearer wrong-" + b"w" * 30 + b"\r\n",
                                  b"Authorization: Bearer " + b"k" * 100_000 + b"\r\n"])
def test_no_token_no_body_read_and_huge_headers_cut_off(server, auth):
    port = int(server[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 50000000\r\n" + auth + b"\r\n")
        started = time.perf_counter()
        answer = _read_response(sock)
        assert time.perf_counter() - started < 5
    if len(auth) > 1000:  # refused from the headers either way, the 50 MB body never awaited:
        if answer.startswith(b"HTTP/1.1 400"):  # h11's header limit, when the block came in more than one read
            assert b"Invalid HTTP request received" in answer, answer[:200]
        else:  # the whole block in one read: the Authorization cap answers
            assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
            assert f"Authorization header is {len(auth) - 17} bytes, over the limit of 519 bytes".encode() in answer
    else:
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]  # from the headers: the 50 MB body is never awaited


def test_sigterm_finishes_in_flight_request_then_exits(server, client, bbc_docs):
    url, proc, log_path = server
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(resp=_classify(client, bbc_docs)))
    thread.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    thread.join(REQUEST_TIMEOUT_S)
    assert proc.wait(REQUEST_TIMEOUT_S) == 0, log_path.read_text()[-3000:]
    assert answer["resp"].status_code == 200
    assert "server stopped" in log_path.read_text()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=5)
