"""The vLLM engine wrapper through the real engine: first-token scoring, choice fallback, rejects.

Split by tier: this file holds the slow tests; the others of the same subject are in ``tests/engine/test_engine.py``.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]  # long tests: an hour each at most


@pytest.mark.slow  # a second engine with torch.compile: about 2-3 min of start on the 2-core CPU
def test_compiled_engine_answers_like_the_eager_one(engine, pilot_config):
    """``enforce_eager: false`` (what ``auto`` gives a batch of 2,000+ documents per engine) classifies as eager does."""
    from bench.common import bbc_test
    from classify.engine.build import build_engine
    from tests.support.answers import assert_same_answers, score_tolerance

    docs, _ = bbc_test(24)
    eager = engine.classify(docs)
    compiled_engine = build_engine(pilot_config.model, pilot_config.engine.model_copy(update={"enforce_eager": False}),
                                   pilot_config.classify, enable_lora=False)
    try:
        assert compiled_engine.compiled() is True and engine.compiled() is False  # as vLLM decided (LoRA: never)
        compiled = compiled_engine.classify(docs)
    finally:
        compiled_engine.shutdown()
    assert [r.id for r in compiled] == [r.id for r in eager]
    # torch.compile (Inductor) fuses and reorders the bf16 reductions: a further source of drift beside
    # batch composition. Measured 2026-12-06 on a 2-core Xeon with AMX, in the whole slow tier: a near
    # tie moved 0.532 -> 0.594 (bbc-test-0005, same category), past batch composition's 0.06; alone the
    # test passed. So 0.08 in bf16 (float32 keeps its 2e-3); clear-margin categories must still match.
    tol = score_tolerance(pilot_config.model)
    assert_same_answers(eager, compiled, tol if tol < 0.01 else 0.08, min_clear=12)
