"""Slow and idle clients (slowloris) against the real uvicorn server of ``docpilot serve`` on 127.0.0.1 (fake engine).

Each shape of a slow client (nothing after connecting, headers a byte at a time, a body a byte at a time, slow
headers after an answered keep-alive request) is closed by the server within its deadline; a crowd of idle
connections over ``max_connections`` leaves ``/healthz`` and real requests answering. The deadlines are set
short here (1 s headers, 1.5 s body); without them (uvicorn alone) every connection here stays open and the
tests fail on their socket timeouts.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from classify.errors import ConfigError
from serve import conn as _conn
from serve.settings import load_settings
from tests.support.serve_app import TOKEN, FakeEngine, served_within, serving
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture: ok@1 published and piloted)

LIMITS = {"header_timeout_s": 1.0, "body_timeout_s": 1.5, "keep_alive_timeout_s": 5.0, "max_connections": 32}
MARGIN_S = 1.5
"""Seconds past a deadline the server may take to close (timer resolution, a busy 2-core machine)."""


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _drip(sock: socket.socket, data: bytes, every_s: float, until_s: float) -> tuple[bytes, float]:
    """Send ``data`` one byte every ``every_s`` seconds (for at most ``until_s``), reading what comes back; return
    (everything read, seconds until the server closed). Raises ``AssertionError`` if it never closed."""
    sock.settimeout(every_s)
    t0 = time.monotonic()
    got = b""
    i = 0
    while time.monotonic() - t0 < until_s:
        if i < len(data):
            try:
                sock.sendall(data[i:i + 1])
            except OSError:  # reset by the server: it closed
                return got, time.monotonic() - t0
            i += 1
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return got, time.monotonic() - t0
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk
    raise AssertionError(f"connection still open after {until_s} s (read {got[:200]!r})")


HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: slow-client-with-a-long-name\r\nAccept: */*\r\n\r\n"
BODY_HEAD = (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
             b"\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n")


@pytest.mark.parametrize("shape", ["silent", "slow headers", "slow body", "keep-alive then slow headers"])
def test_each_slow_client_shape_is_closed_at_its_deadline(registry, shape):  # noqa: F811
    with serving(registry, FakeEngine(), **LIMITS) as (url, _app, _server):
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
            if shape == "silent":
                got, took = _drip(sock, b"", 0.2, 8)
                deadline = LIMITS["header_timeout_s"]
                assert got.startswith(b"HTTP/1.1 408") and b"request headers not received within 1 s" in got
            elif shape == "slow headers":
                got, took = _drip(sock, HEAD, 0.2, 8)
                deadline = LIMITS["header_timeout_s"]
                assert got.startswith(b"HTTP/1.1 408")
            elif shape == "slow body":
                sock.sendall(BODY_HEAD)
                got, took = _drip(sock, b'{"documents": [{"id": "a", "text": "' + b"x" * 300, 0.2, 8)
                deadline = LIMITS["body_timeout_s"]
                assert b"200 OK" not in got
            else:
                sock.sendall(HEAD)
                first = sock.recv(65536)
                assert first.startswith(b"HTTP/1.1 200"), first
                got, took = _drip(sock, HEAD, 0.2, 8)  # each byte used to cancel uvicorn's keep-alive timer
                deadline = LIMITS["header_timeout_s"]
        assert deadline - 0.3 <= took <= deadline + MARGIN_S, f"{shape}: closed after {took:.2f} s"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200


def test_a_client_within_the_deadlines_is_answered(registry):  # noqa: F811
    body = b'{"documents": [{"id": "a", "text": "Shares rose after the results."}]}'
    head = BODY_HEAD.replace(b"Content-Length: 400", b"Content-Length: %d" % len(body))
    with serving(registry, FakeEngine(), **LIMITS) as (url, _app, _server):
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
            for part in (head[:20], head[20:], body[:10], body[10:]):  # in pieces, each well inside its deadline
                sock.sendall(part)
                time.sleep(0.2)
            answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_crowd_of_idle_connections_does_not_lock_out_real_clients(registry):  # noqa: F811
    """Over ``max_connections`` idle connections (a long header deadline, so the cap alone acts): the oldest idle
    ones are closed for the newcomers, ``/healthz`` and a classify request answer at once."""
    limits = {**LIMITS, "header_timeout_s": 60.0, "max_connections": 32}
    with serving(registry, FakeEngine(), **limits) as (url, app, server):
        idle = []
        try:
            for _ in range(100):
                idle.append(socket.create_connection(("127.0.0.1", _port(url)), timeout=5))
            time.sleep(0.3)
            served_within(url, 2.0)
            open_now = len(server.server_state.connections)
            assert open_now <= limits["max_connections"], open_now
            counts = server.config.http_protocol_class.counts
            assert counts.evicted >= 100 - limits["max_connections"], vars(counts)
            assert counts.refused == 0
        finally:
            for s in idle:
                s.close()


@pytest.mark.parametrize(("field", "value"), [("header_timeout_s", 0), ("body_timeout_s", -1),
                                              ("keep_alive_timeout_s", 0), ("max_connections", 8),
                                              ("max_connections", 10**6)])
def test_limits_out_of_bounds_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        load_settings(api_token=TOKEN, **{field: value})


def test_a_cap_over_the_file_descriptor_limit_is_refused_before_start(monkeypatch):
    monkeypatch.setattr(_conn.resource, "getrlimit", lambda _which: (1024, 1024))
    with pytest.raises(ConfigError, match=r"max_connections must leave 256 file descriptors free under this "
                                          r"process's limit of 1024 \(ulimit -Hn\), got 4096; lower --max-connections "
                                          r"to at most 768"):
        _conn.check_fd_budget(4096)
    assert _conn.check_fd_budget(512) == 1024
