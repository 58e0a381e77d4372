"""BENCH ONLY: an engine actor that answers every document at once, to measure the batch machinery alone.

:class:`InstantEngineActor` has the interface of :class:`batch._actor.EngineActor` (``info``,
``classify``, ``shutdown``) but loads no model: every readable document is accepted with the
first configured category and score 1.0; a document the reader rejected stays rejected with its
reason. Its answers are NOT classifications.

It cannot be selected by configuration or on the command line: only Python code passes it to
:func:`batch.driver.run_batch` through the private keyword ``_engine_actor`` (``bench/scale.py``
and the tests do). The run's ``manifest.json`` still records the configured model.
"""

from __future__ import annotations

import os
from typing import Any

from batch._shard_io import RawShard, ShardOutput, as_documents
from classify.config import ClassifyConfig, EngineConfig, ModelConfig
from classify.records import Document, Result


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

    def classify(self, shard: RawShard | list[Document]) -> ShardOutput:
        """Like the real actor: parse the shard here, one result per document in order (accepted with the first
        category, or rejected with the reader's reason), returned as the shard file's bytes and counts."""
        out = []
        for d in as_documents(shard, self.max_doc_bytes):
            if d.reject_reason:
                out.append(Result(id=d.id, status="rejected", reason=d.reject_reason, input_sha256=d.input_sha256,
                                  n_chars=d.n_chars))
            else:
                out.append(Result(id=d.id, status="accepted", category=self.category, score=1.0,
                                  input_sha256=d.input_sha256, n_chars=d.n_chars))
        return ShardOutput.of(out)

    def shutdown(self) -> None:
        """Nothing to stop."""


def remote_class() -> Any:
    """The ``ray.remote`` class to pass as ``run_batch(..., _engine_actor=...)``."""
    import ray

    return ray.remote(max_restarts=0, max_task_retries=0)(InstantEngineActor)
