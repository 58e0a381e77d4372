"""The vLLM engine wrapper through the real engine: first-token scoring, choice fallback, rejects."""

from __future__ import annotations

import pytest

from classify.config import ClassifyConfig
from classify.documents import document_from_text
from classify.engine import Classifier
from classify.errors import EngineError
from classify.scoring import Scorer

pytestmark = pytest.mark.engine

TEXTS = {
    "a": "The striker scored twice as the home side won the league match 3-0 on Saturday.",
    "b": "Shares in the bank fell 5% after it reported lower quarterly profits and cut its dividend.",
    "c": "",
}


def _docs():
    return [document_from_text(k, v, 10_000) for k, v in TEXTS.items()]


def test_first_token_path_one_result_per_document_in_order(engine):
    assert engine.scorer.mode == "first-token"
    results = engine.classify(_docs())
    assert [r.id for r in results] == ["a", "b", "c"]
    for r in results[:2]:
        assert r.status == "accepted" and r.category in ClassifyConfig().categories
        assert 0 < r.score <= 1 and r.n_tokens > 20
    assert results[2].status == "rejected" and results[2].reason == "empty document (0 bytes)"


def test_choice_fallback_when_first_tokens_collide(engine):
    cfg = ClassifyConfig(categories=("sport", "sports", "business"))
    scorer = Scorer(engine.scorer.tokenizer, cfg, engine.scorer.max_model_len)
    assert scorer.mode == "choice"
    clf = Classifier(engine.llm, scorer, engine.model, lora_enabled=True)
    results = clf.classify(_docs()[:2])
    for r in results:
        assert r.status == "accepted" and r.category in cfg.categories and 0 < r.score <= 1


def test_forced_choice_scoring_answers_inside_the_set(engine):
    cfg = ClassifyConfig(scoring="choice")
    scorer = Scorer(engine.scorer.tokenizer, cfg, engine.scorer.max_model_len)
    assert scorer.mode == "choice"
    choice = Classifier(engine.llm, scorer, engine.model, True).classify(_docs())
    assert [r.status for r in choice] == ["accepted", "accepted", "rejected"]
    assert all(r.category in cfg.categories and 0 < r.score <= 1 for r in choice[:2])


def test_prompt_over_context_is_rejected_with_reason(engine):
    clf = Classifier(engine.llm, Scorer(engine.scorer.tokenizer, ClassifyConfig(), 64), engine.model, True)
    (result,) = clf.classify(_docs()[:1])
    assert result.status == "rejected"
    assert result.reason.startswith("prompt is ") and "over max_model_len 64" in result.reason


def test_adapter_needs_a_lora_engine(engine):
    from classify.scoring import AdapterHandle

    clf = Classifier(engine.llm, engine.scorer, engine.model, lora_enabled=False)
    with pytest.raises(EngineError, match="engine was built without LoRA"):
        clf.classify(_docs()[:1], adapter=AdapterHandle("x@1", "/nowhere", 1))


def test_first_token_collision_refused_when_forced(engine):
    with pytest.raises(EngineError, match="two categories share a first token"):
        Scorer(engine.scorer.tokenizer, ClassifyConfig(categories=("sport", "sports"), scoring="first-token"), 1024)


@pytest.mark.slow  # a second engine with torch.compile: about 2-3 min of start on the 2-core CPU
def test_compiled_engine_answers_like_the_eager_one(engine, pilot_config):
    """``enforce_eager: false`` (what ``auto`` gives a batch of 2,000+ documents per engine) classifies as eager does."""
    from bench.common import bbc_test
    from classify.engine import build_engine
    from tests.answers import assert_same_answers, score_tolerance

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
    assert_same_answers(eager, compiled, score_tolerance(pilot_config.model), min_clear=12)
