"""Prometheus metrics and the ASGI middleware that counts requests and enforces the body-size limit.

Each app owns its :class:`prometheus_client.CollectorRegistry` (nothing global), so two apps
in one process (tests) never share counters. Latency buckets span 5 ms to 5 min: a CPU
engine answers one document in about 0.1-1 s, a full request of 64 documents in tens of seconds.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from classify.errors import PayloadTooLarge

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class ServeMetrics:
    """The server's counters, one registry per app.

    Attributes:
        registry: the collector registry ``/metrics`` renders.
        requests: ``docpilot_requests_total{route, method, status}``.
        documents: ``docpilot_documents_total{adapter, status}`` (status accepted/rejected).
        latency: ``docpilot_request_latency_seconds{route}`` histogram.
        errors: ``docpilot_errors_total{kind}`` (kind = the error's ``kind``).
        ready: ``docpilot_engine_ready`` (1 once the engine answers).
        in_flight: ``docpilot_documents_in_flight`` (admitted and not yet finished or aborted).
        aborted: ``docpilot_documents_aborted_total`` (documents aborted in the engine because their client hung up).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "docpilot_requests", "HTTP requests answered", ["route", "method", "status"], registry=self.registry
        )
        self.documents = Counter(
            "docpilot_documents", "Documents classified, by outcome", ["adapter", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "docpilot_request_latency_seconds", "Request latency in seconds", ["route"],
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.errors = Counter("docpilot_errors", "Error answers, by kind", ["kind"], registry=self.registry)
        self.ready = Gauge("docpilot_engine_ready", "1 when the engine is loaded", registry=self.registry)
        self.in_flight = Gauge("docpilot_documents_in_flight", "Documents admitted to the engine and not yet done",
                               registry=self.registry)
        self.aborted = Counter("docpilot_documents_aborted", "Documents aborted in the engine: their client hung up",
                               registry=self.registry)


class ServeMiddleware:
    """Pure ASGI middleware: body-size limit (413 while the body streams in, before parsing) and request metrics.

    Args:
        app: the wrapped ASGI app.
        metrics: where to count.
        max_request_bytes: largest accepted request body in bytes (``Content-Length`` or streamed).
    """

    def __init__(self, app: Any, metrics: ServeMetrics, max_request_bytes: int):
        self.app = app
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_box = {"status": 500}
        limit = self.max_request_bytes

        async def send_counting(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_box["status"] = message["status"]
            await send(message)

        declared = dict(scope.get("headers") or []).get(b"content-length")
        received = 0

        async def receive_limited() -> dict:
            # checked when the app first asks for the body, so a request refused from its headers alone
            # (401, 429) is answered without the body limit or the body itself coming into it
            nonlocal received
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise PayloadTooLarge(self._message(int(declared), exact=True))
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(self._message(received))
            return message

        await self.app(scope, receive_limited, send_counting)
        route = scope.get("route")
        label = getattr(route, "path", None) or "unmatched"
        self.metrics.requests.labels(route=label, method=scope.get("method", ""), status=str(status_box["status"])).inc()
        self.metrics.latency.labels(route=label).observe(time.perf_counter() - started)

    def _message(self, size: int, exact: bool = False) -> str:
        return (
            f"request body is {'' if exact else 'at least '}{size} bytes, over the limit of "
            f"{self.max_request_bytes} bytes (`max_request_bytes`); send fewer or smaller documents per request"
        )
