"""The app factory: FastAPI over vLLM's async engine, in one process.

:func:`create_app` reads the config and resolves the base model (cheap: the model cache
holds its fingerprint) but starts nothing heavy; the engine loads in the app's lifespan,
in a worker thread, and stops there on shutdown (uvicorn drains requests first on SIGTERM).

Example:
    >>> app = create_app(load_settings(config_path="config/docpilot.json"))  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI

from adapters.registry.registry import Registry
from classify.config.sections import EngineConfig, PilotConfig, load_config
from classify.machine.device import detect_device
from classify.machine.probe import probe
from classify.model.memory import resolve_tensor_parallel
from classify.model.model import ModelRef, resolve_model, verify_model
from serve import routes_adapters, routes_classify, routes_health, routes_metrics
from serve.adapters import AdapterService
from serve.deps import require_token
from serve.engine import build_async_engine
from serve.errors import install_error_handlers
from serve.guard import AuthGuard
from serve.metrics import ServeMetrics, ServeMiddleware
from serve.schemas import ClassifyRequest, ErrorResponse
from serve.settings import ServeSettings
from serve.state import ServerState

log = logging.getLogger(__name__)

UNAUTHORIZED = {
    401: {
        "model": ErrorResponse,
        "description": "missing or wrong bearer token",
        "headers": {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    }
}
"""The answer every route behind the bearer token documents in the OpenAPI schema."""


def load_server_config(settings: ServeSettings) -> PilotConfig:
    """Read ``settings.config_path`` with ``settings.base_model`` applied on top.

    Raises:
        ConfigError: missing file or invalid fields.
    """
    overrides = {"model.base_model": settings.base_model} if settings.base_model else None
    return load_config(PilotConfig, settings.config_path, overrides)


def server_engine(config: PilotConfig, device: str | None = None) -> EngineConfig:
    """The engine section the server's vLLM engine is built with: ``tensor_parallel_size`` a number.

    ``auto`` is resolved by the batch's own function (:func:`classify.model.memory.resolve_tensor_parallel`: the
    smallest size with which vLLM starts by the plan's formula) over the cards this process can use (a server is one
    node: ``CUDA_VISIBLE_DEVICES`` applied, a MIG slice counted with its own memory) and the first one's memory, as
    ``nvidia-smi`` reports them (:meth:`classify.machine.probe.Machine.visible`);
    a number is kept on an accelerator; CPU engines run with 1.

    Args:
        config: the server's config (its ``model`` and ``engine`` sections).
        device: ``cpu``, ``cuda`` or ``rocm``; ``None``: this machine's (:func:`classify.machine.device.detect_device`).

    Returns:
        ``config.engine`` with ``tensor_parallel_size`` 1, 2, 4 or 8.

    Raises:
        ConfigError: ``auto`` and the model starts on no group of this machine's cards (the figures in the message).
    """
    device = device or detect_device()
    cards, card_mib = 0, None
    if device != "cpu" and config.engine.tensor_parallel_size == "auto":
        gpus = probe().visible()
        cards, card_mib = len(gpus), next((g.memory_mib for g in gpus if g.memory_mib), None)
    tp = resolve_tensor_parallel(config.engine, config.model, device, cards_per_node=cards, card_mib=card_mib)
    log.info("engine on %s: tensor_parallel_size %d (configured %s)", device, tp, config.engine.tensor_parallel_size)
    return config.engine.model_copy(update={"tensor_parallel_size": tp})


def create_app(
    settings: ServeSettings,
    config: PilotConfig | None = None,
    model: ModelRef | None = None,
    registry: Any = None,
    engine_factory: Callable[[], Any] | None = None,
) -> FastAPI:
    """Build the FastAPI application (routes, error shape, metrics, lifespan).

    Args:
        settings: server settings (token, limits, pilot-gate override).
        config: the pilot config (default: read from ``settings.config_path``).
        model: the resolved base model (default: :func:`classify.model.model.resolve_model`).
        registry: the adapter registry (default: ``adapters.registry.registry.Registry()`` at ``DOCPILOT_REGISTRY``).
        engine_factory: blocking ``() -> AsyncClassifier`` (default: :func:`serve.engine.build_async_engine`
            with LoRA enabled); tests pass a fake one for bookkeeping checks.

    Returns:
        The app; the engine starts when the server runs its lifespan.

    Raises:
        ConfigError: invalid config. EngineError: the base model cannot be resolved.
    """
    config = config or load_server_config(settings)
    config = config.model_copy(update={"engine": server_engine(config)})  # the TP the engine gets, recorded (/readyz)
    model = model or verify_model(resolve_model(config.model))  # re-hashed at server start (#28 item 3)
    if registry is None:
        registry = Registry()
    if engine_factory is None:
        engine_factory = partial(build_async_engine, model, config.model, config.engine, config.classify, True)
    metrics = ServeMetrics()
    state = ServerState(
        settings=settings,
        config=config,
        model=model,
        adapters=AdapterService(registry, model, config.model, config.classify, skip_pilot_gate=settings.skip_pilot_gate,
                                engine_cfg=config.engine),
        metrics=metrics,
        max_doc_bytes=settings.max_doc_bytes or config.classify.max_doc_bytes,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.begin(engine_factory)
        yield
        await state.stop()

    app = FastAPI(
        title="docpilot",
        summary="Document classification with a base model + LoRA adapters on vLLM",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.server = state
    app.state.metrics = metrics
    install_error_handlers(app)
    protected: dict[str, Any] = {}
    for module in (routes_health, routes_classify, routes_adapters, routes_metrics):
        behind_token = any(dep.dependency is require_token for dep in module.router.dependencies)
        app.include_router(module.router, responses=UNAUTHORIZED if behind_token else None)
        if behind_token:
            protected.update({route.path: route for route in module.router.routes})
    token = None if settings.insecure_no_auth or settings.api_token is None else settings.api_token.get_secret_value()
    # the last added is outermost: ServeMiddleware counts every answer, AuthGuard's 401s (headers only) included
    app.add_middleware(AuthGuard, token=token, protected=protected, metrics=metrics)
    app.add_middleware(ServeMiddleware, metrics=metrics, max_request_bytes=settings.max_request_bytes)
    app.openapi = partial(_openapi_with_limits, app, settings.max_documents)  # type: ignore[method-assign]
    return app


def _openapi_with_limits(app: FastAPI, max_documents: int) -> dict[str, Any]:
    """FastAPI's OpenAPI document with this server's ``max_documents`` as ``documents.maxItems``.

    Args:
        app: the application.
        max_documents: the server's per-request document limit (more: 413).

    Returns:
        The (cached) OpenAPI document.
    """
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        # /v1/classify reads its body itself (parsed off the event loop, serve.body): its schema is added here
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        body = ClassifyRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components["ClassifyRequest"] = body
        request = components.get("ClassifyRequest")
        if request is not None:
            request["properties"]["documents"]["maxItems"] = max_documents
    return app.openapi_schema
