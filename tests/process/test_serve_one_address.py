"""One address cannot fill the server (issue 55, item 5): the real uvicorn server of ``docpilot serve`` on 127.0.0.1.

The crowd connects from 127.0.0.2 (every 127/8 address is the loopback on Linux), the probes and the real client
from 127.0.0.1. A client refused for its token is answered 401 and closed at once (it used to hold its slot for the
body it announced); connections holding a request without the token are evicted for newcomers; one address keeps
at most ``max_connections_per_client`` connections. Bounded: at most 120 connections, a few seconds each test.
"""

from __future__ import annotations

import socket
import time

from tests.support.serve_app import FakeEngine, served_within, serving
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture: ok@1 published and piloted)

CROWD = "127.0.0.2"
NO_TOKEN = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
OPEN_ROUTE_BODY = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
"""A request without the token to a route that needs none, its body never sent: the slot is held (no deadline soon)."""
LONG = {"header_timeout_s": 60.0, "body_timeout_s": 60.0, "keep_alive_timeout_s": 5.0}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _crowd(url: str, n: int, head: bytes) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", _port(url)), timeout=5, source_address=(CROWD, 0))
        if head:
            s.sendall(head)
        out.append(s)
    return out


def test_a_request_refused_for_its_token_is_closed_with_its_401(registry):  # noqa: F811
    limits = {**LONG, "max_connections": 32, "max_connections_per_client": 32}
    with serving(registry, FakeEngine(), **limits) as (url, _app, server):
        socks = _crowd(url, 100, NO_TOKEN)
        try:
            time.sleep(0.3)
            served_within(url, 3.0)  # the crowd's slots were given back with their 401s
            for s in socks[-5:]:
                got, t0 = b"", time.monotonic()
                s.settimeout(1.0)
                while True:
                    try:
                        chunk = s.recv(65536)
                    except TimeoutError:
                        raise AssertionError(f"still open {time.monotonic() - t0:.1f} s after its 401: {got[:80]!r}") from None
                    if not chunk:
                        break  # closed by the server right after its answer
                    got += chunk
                assert got.startswith(b"HTTP/1.1 401") and b"connection: close" in got.lower(), got[:200]
            counts = server.config.http_protocol_class.counts
            assert counts.refused == counts.refused_per_client == 0, vars(counts)
        finally:
            for s in socks:
                s.close()


def test_one_address_holding_requests_without_the_token_cannot_lock_out_others(registry):  # noqa: F811
    """Requests without the token to an open route, their bodies never sent: held slots, evictable first."""
    for per_client in (8, 32):  # the per-address cap, and the global cap alone (the crowd evicted as held slots)
        limits = {**LONG, "max_connections": 32, "max_connections_per_client": per_client}
        with serving(registry, FakeEngine(), **limits) as (url, _app, server):
            socks = _crowd(url, 60, OPEN_ROUTE_BODY)
            try:
                time.sleep(0.3)
                served_within(url, 3.0)
                protocol = server.config.http_protocol_class
                assert protocol.per_client.get(CROWD, 0) <= per_client, (per_client, protocol.per_client)
                assert protocol.counts.evicted >= 60 - per_client and protocol.counts.refused == 0, vars(protocol.counts)
            finally:
                for s in socks:
                    s.close()
