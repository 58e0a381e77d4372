"""The one JSON error shape, mapped once from docpilot's exception types to HTTP statuses.

Every error answer is ``{"error": {"status": int, "kind": str, "message": str}}``. The status
comes from the exception type's ``http_status`` (``classify.errors``), never from its message.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from classify.config.base import problem_message
from classify.errors import DocpilotError, EngineError, InputError

log = logging.getLogger(__name__)


class Unauthorized(DocpilotError):
    """The request has no bearer token or a wrong one."""

    exit_code = 1
    http_status = 401
    kind = "unauthorized"


class EngineNotReady(EngineError):
    """The engine is still loading (or failed to load); ``/readyz`` says which."""

    kind = "not_ready"


class BadRequestBody(InputError):
    """The body is not UTF-8, not JSON, or not a JSON object."""

    http_status = 400
    kind = "bad_request"


class BadJson(InputError):
    """The body is not valid JSON (syntax, a number too long to read, or nested too deeply)."""

    http_status = 400
    kind = "bad_json"


class Overloaded(DocpilotError):
    """Admitting the request would put more than ``max_in_flight_documents`` documents in the engine (429).

    Attributes:
        retry_after_s: whole seconds the client should wait (the ``Retry-After`` header).
    """

    exit_code = 1
    http_status = 429
    kind = "overloaded"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def error_body(status: int, kind: str, message: str) -> dict[str, Any]:
    """The JSON error document for ``status``/``kind``/``message``."""
    return {"error": {"status": status, "kind": kind, "message": message}}


def _record(request: Request, kind: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(kind=kind).inc()


def _answer(request: Request, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    _record(request, kind)
    return JSONResponse(error_body(status, kind, message), status_code=status, headers=headers)


def _note_engine_error(request: Request, exc: BaseException) -> None:
    """Let the server state check whether the engine died (vLLM's ``EngineDeadError``): 503 from then on."""
    state = getattr(request.app.state, "server", None)
    if state is not None:
        state.note_error(exc)


def _validation_message(err: RequestValidationError) -> tuple[int, str, str]:
    lines = []
    for item in err.errors():
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        if item.get("type") == "json_invalid":
            detail = (item.get("ctx") or {}).get("error", "JSON decode error")
            return 400, "bad_json", f"request body is not valid JSON: {detail} at character {loc[0] if loc else '?'}"
        if not loc and item.get("type") in ("model_attributes_type", "dict_type"):
            return 400, "bad_request", "request body must be a JSON object sent with `Content-Type: application/json`"
        field = ".".join(loc) or "(body)"
        msg = problem_message(item, unknown_field="is not a known field (allowed: adapter, documents[].id, documents[].text)")
        got = item.get("input")
        shown = repr(got)[:60] if isinstance(got, (str, int, float, bool)) or got is None else type(got).__name__
        lines.append(f"`{field}` {msg}, got {shown}")
    return 422, "input", "; ".join(lines) or "request body is invalid"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every exception into the one error shape.

    Args:
        app: the FastAPI application.
    """

    @app.exception_handler(DocpilotError)
    async def _docpilot(request: Request, exc: DocpilotError) -> JSONResponse:
        if isinstance(exc, EngineError) and not isinstance(exc, EngineNotReady):
            _note_engine_error(request, exc)
        headers = {"WWW-Authenticate": "Bearer", "Connection": "close"} if exc.http_status == 401 else None
        if isinstance(exc, Overloaded):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if exc.http_status >= 500:
            log.error("%s %s -> %s: %s", request.method, request.url.path, exc.kind, exc)
        return _answer(request, exc.http_status, exc.kind, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, kind, message = _validation_message(exc)
        return _answer(request, status, kind, message)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if isinstance(cause, DocpilotError):  # raised while FastAPI read the body (size limit)
            return await _docpilot(request, cause)
        if isinstance(cause, UnicodeDecodeError):
            return _answer(
                request, 400, "bad_request",
                f"request body is not valid UTF-8: byte 0x{cause.object[cause.start]:02x} at offset {cause.start} "
                "(send JSON encoded as UTF-8)",
            )
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        return _answer(request, exc.status_code, kind, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        _note_engine_error(request, exc)
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _answer(request, 500, "internal", f"internal error: {type(exc).__name__} (see the server log)")
