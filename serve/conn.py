"""Connection limits and receive deadlines: slow and idle clients cannot hold the server (slowloris).

uvicorn (h11; 0.54 as ``requirements/cpu.lock`` pins it, 0.55 in ``requirements/cuda.lock``) bounds the size of
request headers (``h11_max_incomplete_event_size``) and closes a keep-alive connection idle after a response
(``timeout_keep_alive``), but it has no deadline for receiving a request: a connection that sends nothing after
connecting, or a byte of its headers or body every few seconds, is kept as long as the client likes, and the
first byte of a request cancels the keep-alive timer.
A thousand of them exhausted the process's file descriptors (``ulimit -n`` 1,024) and every new client,
``/healthz`` included, was refused. :class:`GuardedH11Protocol` adds, on uvicorn's own h11 protocol class:

- a **header deadline**: the request line and headers must be complete ``header_timeout_s`` after the
  connection opened or the previous response ended (else the connection is closed, ``408`` when nothing
  of a request was answered yet);
- a **body deadline**: the body must be complete ``body_timeout_s`` after its headers (else the connection is
  closed: the app sees a hang-up, as for a client that left, and the request counts 499);
- a **connection cap**: at most ``max_connections`` open connections. A new connection over it closes the
  oldest one still waiting for its request headers (a slow or idle client; one that never sent the token
  first) for over a second, else the oldest one holding a request without the token (a body sent to an open
  route), else one that has just connected (its headers on their way: :data:`HEADER_GRACE_S`); when
  every open connection has an authenticated request in progress, the new one is answered ``503`` and closed.
  uvicorn's ``limit_concurrency`` is not used for this: it answers 503 to new *requests* but keeps every idle
  connection open, so idle ones would shut out real clients;
- a **per-client cap**: at most ``max_connections_per_client`` open connections from one client address. A new
  one over it closes that address's oldest evictable connection (as above), else it is answered ``429`` and
  closed: one address cannot fill the server, so ``/healthz`` and other clients keep being served.

A request refused for its token is answered ``401`` with ``Connection: close`` (:class:`serve.guard.AuthGuard`), so
the connection ends with the answer instead of being held for a body that would be discarded.

:func:`check_fd_budget` checks at start-up that the cap fits the process's file-descriptor limit, raising the
soft limit to the hard one when needed (``resource.setrlimit``).
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from classify.errors import ConfigError
from serve.guard import check_authorization

log = logging.getLogger("docpilot.serve")

FD_RESERVE = 256
"""File descriptors kept free beside ``max_connections`` (engine, tokenizer, logs, registry files, sockets of the
engine core)."""

HEADER_GRACE_S = 1.0
"""A connection waiting for its request headers for less than this is evicted only after every connection holding a
request without the token: a real client's headers arrive within milliseconds of its connect, so a health probe
that has just connected is not closed for a crowd of held requests on a route that needs no token."""

_RESPONSE_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                 b"content-length: %d\r\n\r\n%s")
_RESPONSE_429 = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                 b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s")
_RESPONSE_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                 b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s")


def _raw(template: bytes, message: str) -> bytes:
    body = message.encode()
    return template % (len(body), body)


class _Counts:
    """Connections closed by each limit (logged at the first and every 100th; read by tests)."""

    def __init__(self) -> None:
        self.header_timeouts = self.body_timeouts = self.evicted = self.refused = self.refused_per_client = 0

    def bump(self, what: str, message: str) -> None:
        n = getattr(self, what) + 1
        setattr(self, what, n)
        if n == 1 or n % 100 == 0:
            log.warning("%s (%d so far)", message, n)


@dataclass(frozen=True)
class ConnLimits:
    """The numbers a :class:`GuardedH11Protocol` enforces (:func:`guarded_protocol` makes them from the settings).

    Attributes:
        max_connections: most open connections (``--max-connections``).
        header_timeout_s: seconds from a connection's start (or its previous response's end) to its request headers' end.
        body_timeout_s: seconds from a request's headers to its body's end.
        per_client_cap: most open connections from one client address (at most ``max_connections``).
        expected: the bearer token's bytes (``None``: no auth, every request counts as authenticated).
    """

    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    per_client_cap: int
    expected: bytes | None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a body deadline, a connection cap and a per-client cap.

    Used through a subclass of one server's own (:func:`guarded_protocol`), which sets the class attributes.

    Attributes:
        limits: what is enforced.
        counts: the connections each limit closed (one count per server, read by tests).
        per_client: the open connections per client address.
    """

    limits: ClassVar[ConnLimits]
    counts: ClassVar[_Counts]
    per_client: ClassVar[dict[str, int]]

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self._deadline: Any = None
        self._deadline_for: Any = None
        self._waiting_since = time.monotonic()
        self._authenticated = self.limits.expected is None
        self._cycle_seen: Any = None
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.per_client[self._client] = self.per_client.get(self._client, 0) + 1
        super().connection_made(transport)
        cap, most = self.limits.per_client_cap, self.limits.max_connections
        if self.per_client[self._client] > cap and not self._make_room(same_client=True):
            self.counts.bump("refused_per_client", f"connection from {self._client} refused: {cap} connections "
                                                   "open from that address (--max-connections-per-client), each with an "
                                                   "authenticated request in progress")
            transport.write(_raw(_RESPONSE_429, f"too many connections from your address ({cap}); retry\n"))
            transport.close()
            return
        if len(self.connections) > most and not self._make_room():
            self.counts.bump("refused", f"connection refused: {most} connections open (--max-connections), "
                                        "each with an authenticated request in progress")
            transport.write(_raw(_RESPONSE_503, f"server at its connection limit ({most}); retry\n"))
            transport.close()
            return
        self._arm(h11.IDLE)

    def _make_room(self, same_client: bool = False) -> bool:
        """Close the oldest evictable connection (of this client's address with ``same_client``): one waiting for
        its request headers over :data:`HEADER_GRACE_S` (one never authenticated first), else one holding a request
        without the token, else one that connected within the grace (a probe whose headers are on their way)."""
        others = [c for c in self.connections
                  if c is not self and isinstance(c, type(self)) and not c.transport.is_closing()
                  and (not same_client or c._client == self._client)]
        now = time.monotonic()
        waiting = [c for c in others if c._waiting()]
        slow = [c for c in waiting if now - c._waiting_since >= HEADER_GRACE_S]
        held = [c for c in others if not c._waiting() and not c._authenticated]
        fresh = [c for c in waiting if now - c._waiting_since < HEADER_GRACE_S]
        for group, what in ((slow, "waiting {:.1f} s for its request headers"),
                            (held, "holding a request without the token for {:.1f} s"),
                            (fresh, "waiting {:.1f} s for its request headers")):
            if group:
                oldest = min(group, key=lambda c: (c._authenticated, c._waiting_since))
                limit = (f"{self.limits.per_client_cap} connections open from {self._client} "
                         "(--max-connections-per-client)"
                         if same_client else f"{self.limits.max_connections} connections open (--max-connections)")
                self.counts.bump("evicted", f"closed a connection {what.format(time.monotonic() - oldest._waiting_since)}: "
                                            f"{limit}")
                oldest._close()
                return True
        return False

    def _waiting(self) -> bool:
        """No request in progress: its headers not complete yet (or an idle keep-alive connection)."""
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _arm(self, state: Any) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        if state is h11.IDLE:
            self._waiting_since = time.monotonic()
            self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._timed_out, h11.IDLE)
        elif state is h11.SEND_BODY:
            self._deadline = self.loop.call_later(self.limits.body_timeout_s, self._timed_out, h11.SEND_BODY)
        self._deadline_for = state

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_for = None

    def _timed_out(self, state: Any) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is not state:
            return
        if state is h11.IDLE:
            header_timeout_s = self.limits.header_timeout_s
            self.counts.bump("header_timeouts", f"closed a connection that did not send its request headers within "
                                                f"{header_timeout_s:g} s (--header-timeout-s)")
            if self.conn.our_state is h11.IDLE:
                self.transport.write(_raw(_RESPONSE_408, f"request headers not received within {header_timeout_s:g} s\n"))
        else:
            self.counts.bump("body_timeouts", f"closed a connection that did not send its request body within "
                                              f"{self.limits.body_timeout_s:g} s (--body-timeout-s)")
        self._close()

    def _close(self) -> None:
        self._disarm()
        self.transport.close()  # connection_lost follows: an app waiting on the body sees http.disconnect

    def _follow(self) -> None:
        state = self.conn.their_state
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not self._cycle_seen and state is not h11.IDLE:  # a new request's headers
            self._cycle_seen = cycle
            expected = self.limits.expected
            self._authenticated = expected is None or check_authorization(
                next((v for k, v in self.scope.get("headers", ()) if k == b"authorization"), None), expected) is None
        if state is not self._deadline_for and state in (h11.IDLE, h11.SEND_BODY):
            self._arm(state)
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        left = self.per_client.get(self._client, 1) - 1
        if left > 0:
            self.per_client[self._client] = left
        else:
            self.per_client.pop(self._client, None)
        super().connection_lost(exc)


def guarded_protocol(max_connections: int, header_timeout_s: float, body_timeout_s: float,
                     max_connections_per_client: int | None = None,
                     token: str | None = None) -> type[GuardedH11Protocol]:
    """One server's :class:`GuardedH11Protocol`: its limits, and counts of its own.

    Pass the result as ``uvicorn.Config(http=...)`` (:func:`serve.cli.uvicorn_config`).

    Args:
        max_connections: most open connections; over it the oldest evictable connection is closed (one waiting for
            its request headers, else one holding a request without the token); 503 to the new one when none is.
        header_timeout_s: seconds from a connection's start (or its previous response's end) to its request
            headers' end.
        body_timeout_s: seconds from a request's headers to its body's end.
        max_connections_per_client: most open connections from one client address (``None``, or over
            ``max_connections``: ``max_connections``);
            over it that address's oldest evictable connection is closed, else 429 to the new one.
        token: the bearer token (``None``: no auth, every request counts as authenticated); a request that carries it
            is not evicted while in progress.

    Returns:
        A subclass of :class:`GuardedH11Protocol`; its ``counts`` attribute holds the connections each limit
        closed, ``per_client`` the open connections per client address.
    """
    limits = ConnLimits(max_connections, header_timeout_s, body_timeout_s,
                        min(max_connections_per_client or max_connections, max_connections),
                        token.encode("utf-8") if token is not None else None)
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "counts": _Counts(), "per_client": {}})


def check_fd_budget(max_connections: int) -> int:
    """Make sure ``max_connections`` open connections fit the process's file-descriptor limit.

    Raises the soft ``RLIMIT_NOFILE`` up to the hard limit when the cap needs it (as servers such as nginx do
    with ``worker_rlimit_nofile``).

    Args:
        max_connections: the connection cap (``--max-connections``).

    Returns:
        The soft file-descriptor limit in force afterwards.

    Raises:
        ConfigError: the cap plus :data:`FD_RESERVE` descriptors is over the hard limit; the message names both
            numbers and what to do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(f"max_connections must leave {FD_RESERVE} file descriptors free under this process's "
                              f"limit of {hard} (ulimit -Hn), got {max_connections}; lower --max-connections to at most "
                              f"{max(hard - FD_RESERVE, 0)} or raise the limit (docker run --ulimit nofile=...)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        log.info("file-descriptor limit raised from %d to %d for --max-connections %d", soft, need, max_connections)
        soft = need
    return soft
