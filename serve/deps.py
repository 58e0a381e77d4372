"""FastAPI dependencies as ``Annotated`` aliases: server state, bearer-token auth, the ready engine."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serve.errors import EngineNotReady, Unauthorized
from serve.state import ServerState

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <DOCPILOT_API_TOKEN>`")


def get_state(request: Request) -> ServerState:
    """The app's :class:`ServerState`."""
    return request.app.state.server


State = Annotated[ServerState, Depends(get_state)]


def require_token(state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Check the bearer token in constant time (``hmac.compare_digest``).

    Raises:
        Unauthorized: no ``Authorization: Bearer`` header, or a wrong token (401).
    """
    if state.settings.insecure_no_auth:
        return
    if credentials is None or not credentials.credentials:
        raise Unauthorized("missing bearer token: send `Authorization: Bearer <token>` (the server's DOCPILOT_API_TOKEN)")
    expected = state.settings.api_token.get_secret_value().encode() if state.settings.api_token else b""
    if not hmac.compare_digest(credentials.credentials.encode("utf-8", "surrogatepass"), expected):
        raise Unauthorized("invalid bearer token")


Authorized = Depends(require_token)
"""Add to a router's ``dependencies`` to protect every route in it."""


def get_engine(state: State) -> Any:
    """The loaded :class:`serve.engine.AsyncClassifier`.

    Raises:
        EngineNotReady: still loading, the load failed, or the engine died (503, with the reason).
    """
    if state.load_error:
        raise EngineNotReady(f"the engine failed to load: {state.load_error}")
    if state.engine_error:
        raise EngineNotReady(f"the engine died: {state.engine_error}")
    if state.engine is None:
        raise EngineNotReady("the engine is still loading; retry when GET /readyz answers 200")
    return state.engine


Engine = Annotated[Any, Depends(get_engine)]
