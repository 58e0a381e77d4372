"""The vLLM engine wrapper through the real engine: first-token scoring, choice fallback, rejects.

Split by tier: this file holds the engine tests; the others of the same subject are in ``tests/slow/test_engine_compiled.py``.
"""

from __future__ import annotations

import pytest

from classify.config.sections import ClassifyConfig
from classify.documents.read import document_from_text
from classify.engine.build import Classifier
from classify.engine.scoring import Scorer
from classify.errors import EngineError

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
    from classify.engine.scoring import AdapterHandle

    clf = Classifier(engine.llm, engine.scorer, engine.model, lora_enabled=False)
    with pytest.raises(EngineError, match="engine was built without LoRA"):
        clf.classify(_docs()[:1], adapter=AdapterHandle("x@1", "/nowhere", 1))


def test_first_token_collision_refused_when_forced(engine):
    with pytest.raises(EngineError, match="two categories share a first token"):
        Scorer(engine.scorer.tokenizer, ClassifyConfig(categories=("sport", "sports"), scoring="first-token"), 1024)


class _Stop(BaseException):
    """Raised by the test's SIGALRM handler inside ``generate``, as a KeyboardInterrupt would be."""


def test_an_interrupted_call_leaves_no_request_for_the_next_one(engine, bbc_dir):
    """vLLM's ``generate`` keeps the requests of a call interrupted in its loop; the next call must not get them."""
    import csv
    import itertools
    import signal

    with open(bbc_dir / "train.csv", newline="", encoding="utf-8") as f:
        texts = [row["text"][:1500] for row in itertools.islice(csv.DictReader(f), 24)]
    docs = [document_from_text(f"t{i}", t, 10_000) for i, t in enumerate(texts)]
    queued = []

    def stop(signum, frame):
        queued.append(engine.llm.llm_engine.get_num_unfinished_requests())
        raise _Stop

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Stop):
            engine.classify(docs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert queued and queued[0] > 0  # the signal landed while the call's requests were in the engine
    assert engine.llm.llm_engine.get_num_unfinished_requests() == 0
    again = engine.classify(docs[:2])  # was: EngineError "vLLM returned 24 outputs for 2 prompts"
    assert [r.id for r in again] == ["t0", "t1"] and all(r.status == "accepted" for r in again)
