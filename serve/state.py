"""What one server process holds: settings, config, the engine (once loaded) and the adapter service.

The engine starts in a worker thread from the app's lifespan, so ``/healthz`` answers while
the weights load and ``/readyz`` turns 200 when the engine is ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from classify.config import PilotConfig
from classify.documents import document_from_text
from classify.model import ModelRef
from serve.adapters import AdapterService
from serve.metrics import ServeMetrics
from serve.settings import ServeSettings

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """The server's long-lived objects (one per app; built by :func:`serve.app.create_app`).

    Attributes:
        settings: the server settings.
        config: the pilot config (model, engine, classify).
        model: the resolved base model.
        adapters: registry look-ups and the pilot gate.
        metrics: Prometheus counters.
        max_doc_bytes: effective per-document byte limit.
        engine: the :class:`serve.engine.AsyncClassifier` once loaded, else ``None``.
        load_error: why the engine failed to load, if it did.
        started_at: UNIX time the process started loading.
    """

    settings: ServeSettings
    config: PilotConfig
    model: ModelRef
    adapters: AdapterService
    metrics: ServeMetrics
    max_doc_bytes: int
    engine: Any = None
    load_error: str | None = None
    started_at: float = field(default_factory=time.time)
    _task: asyncio.Task | None = None

    async def start(self, engine_factory: Any) -> None:
        """Load the engine (in a thread) and the start-up adapters; record a failure instead of raising.

        Args:
            engine_factory: ``() -> AsyncClassifier`` (blocking).
        """
        try:
            engine = await asyncio.to_thread(engine_factory)
            # vLLM's first generate pays a one-time warm-up (~20 s on CPU): pay it before /readyz says ready.
            await engine.classify([document_from_text("warm-up", "Warm-up document.", 1000, "start-up")])
            for ref in self.settings.adapters:
                adapter = await asyncio.to_thread(self.adapters.resolve, ref)
                await engine.llm.add_lora(adapter.handle().lora_request())
                log.info("adapter %s loaded (sha256 %s)", adapter.ref, adapter.sha256[:12])
            self.engine = engine
            self.metrics.ready.set(1)
            log.info("ready after %.0f s: POST /v1/classify on %s:%d", time.time() - self.started_at,
                     self.settings.host, self.settings.port)
        except Exception as err:  # keep serving /healthz and /readyz with the reason
            self.load_error = f"{type(err).__name__}: {err}"
            log.error("engine failed to load: %s", self.load_error)

    def begin(self, engine_factory: Any) -> None:
        """Schedule :meth:`start` on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self.start(engine_factory))

    async def stop(self) -> None:
        """Wait for a load in progress, then stop the engine core (graceful shutdown)."""
        if self._task is not None and not self._task.done():
            log.info("shutdown requested while the engine loads: waiting for the load to finish")
            await asyncio.shield(self._task)
        if self.engine is not None:
            log.info("stopping the engine")
            self.engine.shutdown()
            self.engine = None
            self.metrics.ready.set(0)
