"""``GET /healthz`` (liveness) and ``GET /readyz`` (engine loaded and alive): no authentication.

Both tell the truth about the engine: after a failed load or once the engine core died they
answer 503 with the reason (and the process exits shortly after, see :mod:`serve.state`).
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve.deps import State
from serve.schemas import HealthOut, NotReadyOut, ReadyOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, responses={
    503: {"model": NotReadyOut, "description": "the engine failed to load or died; the process is about to exit"},
})
async def healthz(state: State) -> JSONResponse:
    """200 while the process is alive and loading or serving; 503 once the engine failed to load or died."""
    if state.failure:
        return JSONResponse(NotReadyOut(status="failed", error=state.failure).model_dump(), status_code=503)
    return JSONResponse(HealthOut(status="ok", uptime_s=round(time.time() - state.started_at, 1)).model_dump())


@router.get("/readyz", response_model=ReadyOut, responses={
    503: {"model": NotReadyOut, "description": "the engine is loading (`loading`), or failed to load or died (`failed`)"},
})
async def readyz(state: State) -> JSONResponse:
    """200 when the engine answers requests; 503 while loading, after a failed load, or once the engine died."""
    if not state.ready:
        status = "failed" if state.failure else "loading"
        return JSONResponse(NotReadyOut(status=status, error=state.failure).model_dump(), status_code=503)
    return JSONResponse(ReadyOut(status="ready", model=state.model.name, fingerprint=state.model.fingerprint,
                                 tensor_parallel_size=state.config.engine.tensor_parallel_size).model_dump())
