"""``GET /metrics``: Prometheus text format (requests, documents, latency, errors by kind)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serve.deps import Authorized, State

router = APIRouter(tags=["metrics"], dependencies=[Authorized])


@router.get("/metrics", response_class=Response)
async def metrics(state: State) -> Response:
    """The server's counters in the Prometheus exposition format (bearer token required)."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
