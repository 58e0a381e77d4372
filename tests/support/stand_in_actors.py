"""Stand-in engine actors for bookkeeping tests of the pilot and batch pipeline (real Ray, no model).

The pilot and the batch run their engines as Ray actors (:mod:`batch.pool.actor`); a test that checks the
bookkeeping around them (stages, decisions, shards, merge, export) passes one of these as the private
``_engine_actor``. They answer fixed categories: their answers are NOT classifications. At least one
test of every path runs the real vLLM engine actor instead (``tests/ray/test_pilot.py``'s default trial).

This module is pickled by value for the Ray workers (they cannot import ``tests/`` modules by name).
"""

from __future__ import annotations

import sys
from typing import Any

from bench.instant_engine import InstantEngineActor


def answer_actor(answers: dict[str, tuple[str, float]] | None = None) -> Any:
    """A ``ray.remote`` actor class answering ``answers[id] = (category, score)``, else the first category, score 1.0.

    Args:
        answers: per-document answers; a document the reader rejected stays rejected with its reason.

    Returns:
        The remote class, for ``run_pilot(..., _engine_actor=...)`` / ``run_batch(..., _engine_actor=...)``.
    """
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    table = dict(answers or {})

    class AnswerActor(InstantEngineActor):
        def __init__(self, model_cfg: Any, engine_cfg: Any, classify_cfg: Any, *args: Any, **kwargs: Any):
            super().__init__(model_cfg, engine_cfg, classify_cfg, *args, **kwargs)
            self.review_below = classify_cfg.review_below_score

        def classify(self, shard: Any) -> Any:
            from batch.corpus.shard import ShardOutput

            return ShardOutput.of([self.answer(d) for d in shard.documents(self.max_doc_bytes)])

        def answer(self, doc: Any) -> Any:
            from classify.records import Result

            if doc.reject_reason:
                return Result.rejected(doc, doc.reject_reason)
            category, score = table.get(doc.id, (self.category, 1.0))
            review = None if self.review_below is None else score < self.review_below
            return Result(id=doc.id, status="accepted", category=category, score=score, review=review,
                          input_sha256=doc.input_sha256, n_chars=doc.n_chars)

    return ray.remote(max_restarts=0, max_task_retries=0)(AnswerActor)
