"""The server's classifier: vLLM's async engine plus the shared :class:`classify.engine.Scorer`.

Built from the same :func:`classify.engine.engine_kwargs` as the offline ``vllm.LLM`` that pilot
and batch use, and scored by the same :class:`~classify.engine.Scorer`, so a document gets the
same result over HTTP as in a pilot or batch run. Nothing here runs at import time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from classify.config import ClassifyConfig, EngineConfig, ModelConfig
from classify.engine import AdapterHandle, Scorer, engine_kwargs
from classify.errors import EngineError
from classify.model import ModelRef
from classify.prompt import Prompt
from classify.records import Document, Result

log = logging.getLogger(__name__)


class AsyncClassifier:
    """vLLM's ``AsyncLLM`` and a :class:`Scorer`; many requests share the engine's batches.

    Attributes:
        llm: the ``vllm.v1.engine.async_llm.AsyncLLM``.
        scorer: prompt rendering and scoring (shared with the offline path).
        model: the resolved base model.
        lora_enabled: whether LoRA slots were reserved.
    """

    def __init__(self, llm: Any, scorer: Scorer, model: ModelRef, lora_enabled: bool):
        self.llm = llm
        self.scorer = scorer
        self.model = model
        self.lora_enabled = lora_enabled
        self._ids = itertools.count()

    async def _one(self, prompt: Prompt, params: Any, lora: Any) -> Any:
        request_id = f"docpilot-{next(self._ids)}"
        final = None
        async for output in self.llm.generate(prompt.text, params, request_id, lora_request=lora):
            final = output
        if final is None or not final.outputs:
            raise EngineError(f"vLLM returned no output for request {request_id}")
        return final.outputs[0]

    async def classify(self, docs: Sequence[Document], adapter: AdapterHandle | None = None) -> list[Result]:
        """Classify documents; one result per document, in input order.

        Prompts are rendered in a worker thread (tokenizing is CPU work that would block the
        event loop); every prompt becomes one engine request so vLLM batches them with the
        other clients' requests.

        Args:
            docs: documents (already-rejected ones pass through as rejected results).
            adapter: LoRA adapter to apply, or ``None`` for the base model.

        Returns:
            ``len(docs)`` results, ``results[i].id == docs[i].id``.

        Raises:
            EngineError: an adapter on an engine without LoRA, or vLLM failed.
        """
        if adapter is not None and not self.lora_enabled:
            raise EngineError("an adapter was requested but the server's engine was started without LoRA")
        rendered = await asyncio.to_thread(lambda: [self.scorer.prompt(d) for d in docs])
        params = self.scorer.sampling_params()
        lora = adapter.lora_request() if adapter is not None else None
        pending = [(i, p) for i, p in enumerate(rendered) if isinstance(p, Prompt)]
        try:
            outputs = await asyncio.gather(*(self._one(p, params, lora) for _, p in pending))
        except EngineError:
            raise
        except Exception as err:  # vLLM raises many types; keep the first error whole
            raise EngineError(f"vLLM generate failed: {type(err).__name__}: {err}") from err
        results: list[Result | Prompt] = list(rendered)
        for (i, prompt), completion in zip(pending, outputs, strict=True):
            results[i] = self.scorer.result(docs[i], prompt, completion)
        return [r for r in results if isinstance(r, Result)]

    def shutdown(self) -> None:
        """Stop the engine core process (safe to call twice)."""
        self.llm.shutdown()


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
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs, disable_log_stats=True))
    except Exception as err:
        raise EngineError(f"vLLM could not load {model.path!r}: {type(err).__name__}: {err}") from err
    scorer = Scorer(llm.get_tokenizer(), classify_cfg, model_cfg.max_model_len)
    log.info("async engine ready: model=%s scoring=%s lora=%s", model.path, scorer.mode, enable_lora)
    return AsyncClassifier(llm, scorer, model, enable_lora)
