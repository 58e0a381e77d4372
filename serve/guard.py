"""Pure ASGI middleware that checks the bearer token before anything reads the request body.

FastAPI resolves a route's dependencies only after it has read (and parsed) the body, so a
``Depends`` token check lets a client without a token upload and have parsed up to
``max_request_bytes``. :class:`AuthGuard` sits in front of the app and answers 401 for the
protected paths from the headers alone, before the first body byte is received; the
``Authorization`` header itself is capped (:data:`MAX_AUTHORIZATION_BYTES`) on top of uvicorn's
limit on all headers (``max_header_bytes``, :func:`serve.cli.uvicorn_config`). The route
dependency :func:`serve.deps.require_token` stays (it documents the scheme in OpenAPI and checks
again). The comparison is constant-time (``hmac.compare_digest``) and the token is never logged.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from typing import Any

from serve.errors import Unauthorized, error_body
from serve.settings import MAX_TOKEN_CHARS

MAX_AUTHORIZATION_BYTES = len("Bearer ") + MAX_TOKEN_CHARS
"""Longest ``Authorization`` header read at all (the longest accepted token plus ``Bearer ``)."""

MISSING = "missing bearer token: send `Authorization: Bearer <token>` (the server's DOCPILOT_API_TOKEN)"
WRONG = "invalid bearer token"


def check_authorization(value: bytes | None, expected: bytes) -> str | None:
    """Why the ``Authorization`` header ``value`` does not carry the token ``expected``; ``None`` when it does.

    Args:
        value: the raw header value (``None``: no header).
        expected: the server's token, UTF-8 encoded.

    Returns:
        The 401 message, or ``None``. Wrong tokens of any length are compared in constant time.
    """
    if value is None:
        return MISSING
    if len(value) > MAX_AUTHORIZATION_BYTES:
        return (f"Authorization header is {len(value)} bytes, over the limit of {MAX_AUTHORIZATION_BYTES} bytes "
                "(`Bearer ` and a token of at most 512 characters)")
    scheme, _, credentials = value.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not credentials.strip():
        return MISSING
    return None if hmac.compare_digest(credentials.strip(), expected) else WRONG


class AuthGuard:
    """Answer 401 for protected paths from the headers alone, before the body is read, and close the connection
    (``Connection: close``): a client without the token holds no slot while a body it was refused is sent.

    Args:
        app: the wrapped ASGI app.
        token: the bearer token (``None`` with ``insecure_no_auth``: the guard lets everything through).
        protected: ``{path: route}`` for every route behind the token; the route is put in the scope of a
            refused request so the request metrics count it under its route.
        metrics: :class:`serve.metrics.ServeMetrics` (the refusal counts in ``docpilot_errors_total``).
    """

    def __init__(self, app: Any, token: str | None, protected: dict[str, Any], metrics: Any):
        self.app = app
        self.expected = token.encode("utf-8") if token is not None else None
        self.protected = protected
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.expected is None or scope.get("path") not in self.protected:
            await self.app(scope, receive, send)
            return
        problem = check_authorization(_header(scope.get("headers") or (), b"authorization"), self.expected)
        if problem is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.protected[scope["path"]]
        self.metrics.errors.labels(kind=Unauthorized.kind).inc()
        body = json.dumps(error_body(401, Unauthorized.kind, problem)).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
            (b"connection", b"close"),  # closed once answered: the slot is not held waiting for a discarded body
        ]})
        await send({"type": "http.response.body", "body": body})


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first header ``name`` (lower case) of an ASGI header list, or ``None``."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None
