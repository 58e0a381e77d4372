"""BENCH ONLY: an engine actor that answers every document at once, to measure the batch machinery alone.

:class:`InstantEngineActor` has the interface of :class:`batch.pool.actor.EngineActor` (``info``,
``classify``, ``shutdown``) but loads no model: every readable document is accepted with the
first configured category and score 1.0; a document the reader rejected stays rejected with its
reason. Its answers are NOT classifications.

:class:`HostEngineActor` does ALL of the real actor's host work and skips only the model's forward pass:
it parses the shard, builds the prompt ids with the real tokenizer (:meth:`classify.engine.scoring.Scorer.prompts`),
the real sampling parameters, hands the ids to a stand-in for ``vllm.LLM`` that answers at once (the first
category's first token, log-prob 0), and turns the answers into result records and shard bytes through the
real :class:`classify.engine.build.Classifier` and :class:`classify.engine.scoring.Scorer`. Its answers are NOT
classifications either; its throughput is the ceiling the host side puts on a card.

Neither can be selected by configuration or on the command line: only Python code passes them to
:func:`batch.run.driver.run_batch` through the private keyword ``_engine_actor`` (``bench/scale.py``
and the tests do). The run's ``manifest.json`` still records the configured model.
"""

from __future__ import annotations

import os
from typing import Any

from batch.corpus.shard import ShardInput, ShardOutput
from classify.config.sections import ClassifyConfig, EngineConfig, ModelConfig
from classify.records import Result


class InstantEngineActor:
    """A stand-in engine actor for benchmarks and tests: instant, fixed valid answers, no model.

    Args:
        model_cfg: ignored (kept for the same constructor as the real actor).
        engine_cfg: ignored.
        classify_cfg: its first category is every accepted document's answer.
        adapter: ignored.
        model_fingerprint: ignored.
        temperature: ignored.
    """

    BENCH_ONLY = True

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, classify_cfg: ClassifyConfig,
                 adapter: Any, model_fingerprint: str, temperature: float | None = None):
        self.category = classify_cfg.categories[0]
        self.max_doc_bytes = classify_cfg.max_doc_bytes

    def info(self) -> dict[str, Any]:
        """Process id, no engine processes."""
        return {"pid": os.getpid(), "node": None, "cpu_bind": "none (instant bench engine)", "procs": []}

    def classify(self, shard: ShardInput) -> ShardOutput:
        """Like the real actor: parse the shard here, one result per document in order (accepted with the first
        category, or rejected with the reader's reason), returned as the shard file's bytes and counts."""
        out = []
        for d in shard.documents(self.max_doc_bytes):
            if d.reject_reason:
                out.append(Result(id=d.id, status="rejected", reason=d.reject_reason, input_sha256=d.input_sha256,
                                  n_chars=d.n_chars))
            else:
                out.append(Result(id=d.id, status="accepted", category=self.category, score=1.0,
                                  input_sha256=d.input_sha256, n_chars=d.n_chars))
        return ShardOutput.of(out)

    def shutdown(self) -> None:
        """Nothing to stop."""


class _NoForwardLLM:
    """Stands in for ``vllm.LLM`` in :class:`HostEngineActor`: takes token-id prompts, answers each at once."""

    def __init__(self, token: int):
        from types import SimpleNamespace

        self.completion = SimpleNamespace(token_ids=[token], logprobs=[{token: SimpleNamespace(logprob=0.0)}],
                                          text="", cumulative_logprob=0.0)
        self.output = SimpleNamespace(outputs=[self.completion])

    def generate(self, prompts: list[dict[str, list[int]]], params: Any, use_tqdm: bool = False,
                 lora_request: Any = None) -> list[Any]:
        """One answer per prompt; refuses anything that is not a token-id prompt (as the real path sends)."""
        if prompts and "prompt_token_ids" not in prompts[0]:
            raise TypeError("the host bench engine takes token-id prompts only")
        return [self.output] * len(prompts)


class HostEngineActor:
    """A bench engine actor doing the real actor's host work with the real tokenizer, skipping only the forward pass.

    Args:
        model_cfg: the base model (its tokenizer is loaded; no weights).
        engine_cfg: ignored.
        classify_cfg: categories and prompt settings (the real :class:`classify.engine.scoring.Scorer`).
        adapter: ignored.
        model_fingerprint: ignored.
        temperature: ignored.
    """

    BENCH_ONLY = True

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, classify_cfg: ClassifyConfig,
                 adapter: Any, model_fingerprint: str, temperature: float | None = None):
        from transformers import AutoTokenizer

        from classify.engine.build import Classifier
        from classify.engine.prompt import set_tokenizer_threads
        from classify.engine.scoring import Scorer
        from classify.model.model import resolve_model

        set_tokenizer_threads()  # as the real actor: the batch encode on this actor's cores
        model = resolve_model(model_cfg)
        scorer = Scorer(AutoTokenizer.from_pretrained(model.path), classify_cfg, model_cfg.max_model_len)
        self.clf = Classifier(_NoForwardLLM(scorer.first_tokens[0] if scorer.first_tokens else 0), scorer, model,
                              lora_enabled=False)
        self.max_doc_bytes = classify_cfg.max_doc_bytes

    def info(self) -> dict[str, Any]:
        """Process id, no engine processes."""
        return {"pid": os.getpid(), "node": None, "cpu_bind": "none (host bench engine)", "procs": []}

    def classify(self, shard: ShardInput) -> ShardOutput:
        """As :meth:`batch.pool.actor.EngineActor.classify`: parse, prompt ids, (no forward pass), records, shard bytes."""
        return ShardOutput.of(self.clf.classify(shard.documents(self.max_doc_bytes)))

    def shutdown(self) -> None:
        """Nothing to stop."""


def remote_class(host: bool = False) -> Any:
    """The ``ray.remote`` class to pass as ``run_batch(..., _engine_actor=...)``.

    Args:
        host: :class:`HostEngineActor` (real host work) instead of :class:`InstantEngineActor`.
    """
    import ray

    return ray.remote(max_restarts=0, max_task_retries=0)(HostEngineActor if host else InstantEngineActor)
