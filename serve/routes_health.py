"""``GET /healthz`` (liveness) and ``GET /readyz`` (engine loaded): no authentication."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve.deps import State

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(state: State) -> JSONResponse:
    """200 while the process is alive and loading or serving; 503 once the engine failed to load."""
    if state.load_error:
        return JSONResponse({"status": "failed", "error": state.load_error}, status_code=503)
    return JSONResponse({"status": "ok", "uptime_s": round(time.time() - state.started_at, 1)})


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    """200 when the engine answers requests; 503 while loading (or after a failed load)."""
    if state.engine is None:
        status = "failed" if state.load_error else "loading"
        return JSONResponse({"status": status, "error": state.load_error}, status_code=503)
    return JSONResponse({"status": "ready", "model": state.model.name, "fingerprint": state.model.fingerprint})
