"""The offline vLLM engine: one builder for every front end.

:func:`build_engine` is the only place an offline ``vllm.LLM`` is made (pilot, Ray
batch actors and benchmarks call it); ``serve/`` builds vLLM's async engine from
the same :func:`classify.engine.args.engine_kwargs`. Documents are turned into prompts and
vLLM outputs into :class:`~classify.records.Result` records by the shared
:class:`classify.engine.scoring.Scorer`, so the offline and the async paths score identically.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from classify.config.sections import ClassifyConfig, EngineConfig, ModelConfig
from classify.engine.args import engine_env, engine_kwargs
from classify.engine.prompt import Prompt
from classify.engine.scoring import AdapterHandle, Scorer, resolve_temperature
from classify.errors import EngineError, Interrupted
from classify.model.model import ModelRef, resolve_model
from classify.records import Document, Result

log = logging.getLogger(__name__)


class Classifier:
    """An offline vLLM engine plus its :class:`Scorer`. Build it with :func:`build_engine`.

    Attributes:
        llm: the ``vllm.LLM``.
        scorer: prompt rendering and scoring.
        model: the resolved base model.
        lora_enabled: whether LoRA slots were reserved (adapters can be applied).
    """

    def __init__(self, llm: Any, scorer: Scorer, model: ModelRef, lora_enabled: bool):
        self.llm = llm
        self.scorer = scorer
        self.model = model
        self.lora_enabled = lora_enabled

    def classify(self, docs: Sequence[Document], adapter: AdapterHandle | None = None, progress: bool = False,
                 temperature: float | None = None) -> list[Result]:
        """Classify documents; one result per input document, in input order.

        Args:
            docs: documents (already-rejected ones pass straight through as rejected).
            adapter: LoRA adapter to apply, or ``None`` for the base model.
            progress: show vLLM's progress bar.
            temperature: score temperature; ``None`` takes ``adapter.temperature`` (1.0 without an
                adapter). Pass the card's value when the adapter is merged into the weights.

        Returns:
            ``len(docs)`` results, ``results[i].id == docs[i].id`` (a document of several windows,
            ``classify.long_documents: windows``, is one result: every window goes in the same ``generate`` call).

        Raises:
            EngineError: an adapter was given to an engine built without LoRA, or vLLM failed.
        """
        if adapter is not None and not self.lora_enabled:
            raise EngineError("an adapter was given but the engine was built without LoRA (enable_lora=False)")
        results: list[Result | None] = [None] * len(docs)
        pending: list[tuple[int, Prompt]] = []
        for i, rendered in enumerate(self.scorer.prompts(docs)):  # one batched tokenizer call
            if isinstance(rendered, Result):
                results[i] = rendered
            else:
                pending.append((i, rendered))
        if pending:
            self._abort_leftovers()
            try:
                outputs = self.llm.generate(
                    [w for _, p in pending for w in p.engine_inputs()],  # every window, token ids, one call
                    self.scorer.sampling_params(),
                    use_tqdm=progress,
                    lora_request=adapter.lora_request() if adapter else None,
                )
            except BaseException as err:  # whatever ended the call (a signal too), the engine stays usable
                self._abort_leftovers()
                if isinstance(err, Exception) and not isinstance(err, Interrupted):  # vLLM raises many types
                    raise EngineError(f"vLLM generate failed: {type(err).__name__}: {err}") from err
                raise
            t = resolve_temperature(adapter, temperature)
            if len(outputs) != sum(p.n_windows for _, p in pending):
                raise EngineError(f"vLLM returned {len(outputs)} outputs for {sum(p.n_windows for _, p in pending)} prompts")
            at = 0
            for i, prompt in pending:  # a document's windows are consecutive outputs, combined into one record
                results[i] = self.scorer.result(docs[i], prompt, [o.outputs[0] for o in outputs[at: at + prompt.n_windows]], t)
                at += prompt.n_windows
        return [r for r in results if r is not None]

    def _abort_leftovers(self) -> None:
        """Abort the requests an interrupted call left in the engine.

        vLLM's ``LLM.generate`` does not abort its own requests when it is interrupted (a signal, an exception in
        its loop): they stay queued, and the next call would return their outputs with its own. Called before
        every ``generate`` and when one is interrupted, so a call only ever gets its own outputs.
        """
        engine = getattr(self.llm, "llm_engine", None)
        states = getattr(getattr(engine, "output_processor", None), "request_states", None)
        if states:
            left = list(states)
            log.warning("aborting %d request(s) an interrupted engine call left queued", len(left))
            engine.abort_request(left, internal=True)

    def compiled(self) -> bool | None:
        """Whether vLLM runs this engine's model through torch.compile, as vLLM itself decided.

        ``enforce_eager: false`` is not enough: vLLM's CPU platform turns compilation off when LoRA
        is enabled (``vllm/platforms/cpu.py``, ``check_and_update_config``).

        Returns:
            ``True`` when the engine's ``compilation_config.mode`` is not ``NONE``, ``False`` when it
            is, ``None`` when the engine does not say (not a vLLM ``LLM``).
        """
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        mode = getattr(getattr(config, "compilation_config", None), "mode", None)
        return None if mode is None else int(mode) != 0  # vllm.config.CompilationMode.NONE == 0

    def shutdown(self) -> None:
        """Stop the engine's worker processes (safe to call twice)."""
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def build_engine(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    classify_cfg: ClassifyConfig,
    enable_lora: bool = False,
    model: ModelRef | None = None,
) -> Classifier:
    """Build the offline vLLM classifier: the one constructor pilot, batch and benchmarks share.

    Args:
        model_cfg: base model and dtype (resolved and provisioned if ``model`` is not given).
        engine_cfg: engine sizing.
        classify_cfg: categories and prompt settings.
        enable_lora: reserve LoRA slots so adapters can be applied per request.
        model: an already-resolved model (skips :func:`resolve_model`).

    Returns:
        A ready :class:`Classifier` (the engine start takes about 40 s on a 2-core CPU).

    Raises:
        EngineError: the model cannot be resolved or vLLM fails to start.
    """
    model = model or resolve_model(model_cfg)
    kwargs = engine_kwargs(model, model_cfg, engine_cfg, enable_lora)
    os.environ.update(engine_env(engine_cfg))
    try:
        from vllm import LLM

        llm = LLM(**kwargs)
    except Interrupted:
        raise  # SIGTERM / Ctrl-C during the start: not an engine failure
    except Exception as err:
        raise EngineError(f"vLLM could not load {model.path!r}: {type(err).__name__}: {err}") from err
    scorer = Scorer(llm.get_tokenizer(), classify_cfg, model_cfg.max_model_len)
    log.info("engine ready: model=%s scoring=%s lora=%s", model.path, scorer.mode, enable_lora)
    return Classifier(llm, scorer, model, enable_lora)
