"""What one server process holds: settings, config, the engine (once loaded) and the adapter service.

The engine starts in a worker thread from the app's lifespan, so ``/healthz`` answers while
the weights load and ``/readyz`` turns 200 when the engine is ready. From then on a watchdog
task polls vLLM's ``AsyncLLM.errored`` (set by vLLM's own monitor thread the moment the
engine-core process exits); a request that meets vLLM's ``EngineDeadError`` flips the state at
once. A failed load or a dead engine turns ``/healthz``, ``/readyz`` and every request into
503 with the reason, and after ``settings.engine_failure_exit_delay_s`` the server is asked to
exit (``docpilot serve`` then exits with :attr:`classify.errors.EngineError.exit_code`), so a
supervisor (Docker's restart policy, Kubernetes) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from classify.config.sections import PilotConfig
from classify.documents.read import document_from_text
from classify.model.model import ModelRef
from serve.adapters import AdapterService
from serve.admission import Admission
from serve.metrics import ServeMetrics
from serve.settings import ServeSettings

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 1.0
"""Seconds between two looks at the engine's health."""


def _is_engine_dead_error(err: BaseException | None) -> bool:
    """Whether ``err`` or one of its causes is vLLM's ``EngineDeadError`` (matched by name: no vLLM import)."""
    seen = 0
    while err is not None and seen < 10:
        if type(err).__name__ == "EngineDeadError":
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _engine_core_exit_codes(llm: Any) -> list[int | None]:
    """Best effort: exit codes of vLLM's engine-core processes (empty when vLLM's internals differ)."""
    try:
        procs = llm.engine_core.resources.engine_manager.processes
        return [p.exitcode for p in procs]
    except Exception:
        return []


@dataclass
class ServerState:
    """The server's long-lived objects (one per app; built by :func:`serve.app.create_app`).

    Attributes:
        settings: the server settings.
        config: the config file's pilot view (:class:`classify.config.sections.PilotConfig`; the server reads its shared
            ``model``, ``engine`` and ``classify`` sections, the ones the pilot gate keys on).
        model: the resolved base model.
        adapters: registry look-ups and the pilot gate.
        metrics: Prometheus counters.
        max_doc_bytes: effective per-document byte limit.
        engine: the :class:`serve.engine.AsyncClassifier` once loaded, else ``None``
            (kept after the engine died, so shutdown can still release it).
        load_error: why the engine failed to load, if it did.
        engine_error: why a loaded engine stopped answering (its core process died), if it did.
        on_fatal: called (once, on the event loop) when the process should exit after a failed load
            or a dead engine; ``docpilot serve`` sets uvicorn's ``should_exit`` here. ``None``: stay up.
        started_at: UNIX time the process started loading.
        admission: documents in flight under ``settings.max_in_flight_documents`` (429 beyond).
    """

    settings: ServeSettings
    config: PilotConfig
    model: ModelRef
    adapters: AdapterService
    metrics: ServeMetrics
    max_doc_bytes: int
    engine: Any = None
    load_error: str | None = None
    engine_error: str | None = None
    on_fatal: Callable[[], None] | None = None
    started_at: float = field(default_factory=time.time)
    admission: Admission = field(default=None)  # type: ignore[assignment]  # set from settings below
    _task: asyncio.Task | None = None
    _watchdog: asyncio.Task | None = None
    _exit_scheduled: bool = False

    def __post_init__(self) -> None:
        if self.admission is None:
            self.admission = Admission(self.settings.max_in_flight_documents)

    @property
    def failure(self) -> str | None:
        """Why the server cannot classify for good (failed load or dead engine), else ``None``."""
        return self.load_error or self.engine_error

    @property
    def ready(self) -> bool:
        """Whether the engine is loaded and alive."""
        return self.engine is not None and self.failure is None

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
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
            log.info("ready after %.0f s: POST /v1/classify on %s:%d", time.time() - self.started_at,
                     self.settings.host, self.settings.port)
        except Exception as err:  # keep serving /healthz and /readyz with the reason, then exit
            self.load_error = f"{type(err).__name__}: {err}"
            log.error("engine failed to load: %s", self.load_error)
            self._schedule_exit()

    def begin(self, engine_factory: Any) -> None:
        """Schedule :meth:`start` on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self.start(engine_factory))

    def engine_dead_reason(self) -> str | None:
        """Ask the loaded engine whether it died (vLLM's ``AsyncLLM.errored``).

        Returns:
            The reason (with the engine-core exit codes when vLLM exposes them), or ``None`` while it is alive.
        """
        llm = getattr(self.engine, "llm", None)
        if llm is None or not getattr(llm, "errored", False):
            return None
        codes = [c for c in _engine_core_exit_codes(llm) if c is not None]
        shown = f" (exit code {', '.join(map(str, codes))})" if codes else ""
        return f"the vLLM engine core process died{shown}; the server exits so its supervisor restarts it"

    def engine_died(self, reason: str) -> None:
        """Record that the loaded engine died: 503 everywhere from now on, then exit (idempotent).

        Args:
            reason: what happened, shown by ``/healthz``, ``/readyz`` and every 503.
        """
        if self.engine_error is not None:
            return
        self.engine_error = reason
        self.metrics.ready.set(0)
        log.error("engine died: %s", reason)
        self._schedule_exit()

    def note_error(self, err: BaseException) -> None:
        """Check, after a request failed with ``err``, whether the engine died; flip the state if so.

        Args:
            err: the exception the request raised (vLLM's ``EngineDeadError`` anywhere in its chain counts).
        """
        if self.engine is None or self.engine_error is not None:
            return
        reason = self.engine_dead_reason()
        if reason is None and _is_engine_dead_error(err):
            reason = "the vLLM engine core died (EngineDeadError); the server exits so its supervisor restarts it"
        if reason is not None:
            self.engine_died(reason)

    async def _watch(self) -> None:
        while self.engine_error is None:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            reason = self.engine_dead_reason()
            if reason is not None:
                self.engine_died(reason)

    def _schedule_exit(self) -> None:
        if self.on_fatal is None or self._exit_scheduled:
            return
        self._exit_scheduled = True
        delay = self.settings.engine_failure_exit_delay_s
        log.error("exiting in %.1f s (engine_failure_exit_delay_s); /healthz and /readyz answer 503 until then", delay)
        asyncio.get_running_loop().call_later(delay, self.on_fatal)

    async def stop(self) -> None:
        """Wait for a load in progress, then stop the watchdog and the engine core (graceful shutdown)."""
        if self._task is not None and not self._task.done():
            log.info("shutdown requested while the engine loads: waiting for the load to finish")
            await asyncio.shield(self._task)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.engine is not None:
            log.info("stopping the engine")
            self.engine.shutdown()
            self.engine = None
            self.metrics.ready.set(0)
        self.adapters.close()
