"""Long documents (issue 41) on the real engine: the session vLLM engine (base model, no adapter) scores windows.

The session engine's classifier is built with the shipped config (``cut``); the ``windows`` classifier here is the
same ``vllm.LLM`` with a :class:`classify.engine.scoring.Scorer` of ``long_documents: windows`` (what ``build_engine``
makes for such a config; no second engine starts). Every text is real BBC text from train.csv (never test.csv).

Split by tier: this file holds the engine tests; the others of the same subject are in
``tests/unit/classify/engine/test_long_documents.py``, ``tests/ray/test_long_documents_ray.py``; the served path's is in
``tests/engine/test_serve_mixed_adapters.py``.
"""

from __future__ import annotations

import pytest

from classify.documents.read import document_from_text
from classify.engine.build import Classifier
from classify.engine.scoring import Scorer
from tests.support.answers import score_tolerance
from tests.support.corpora import long_document, train_texts

pytestmark = pytest.mark.timeout(1200)

OPENING_TOKENS = 320
"""Tokens of the planted document's non-sport opening: more than one window (256), so ``cut`` reads nothing else."""


def _windows(engine, **changes) -> Classifier:
    cfg = engine.scorer.cfg.model_copy(update={"long_documents": "windows", **changes})
    scorer = Scorer(engine.llm.get_tokenizer(), cfg, engine.scorer.max_model_len)
    return Classifier(engine.llm, scorer, engine.model, engine.lora_enabled)


def test_a_ten_x_document_is_one_row_with_its_windows_on_the_real_engine(engine, bbc_dir):
    tok = engine.llm.get_tokenizer()
    n = engine.scorer.cfg.max_doc_tokens
    docs = [document_from_text("long", long_document(tok, bbc_dir, 10 * n), 200_000)]
    (row,) = _windows(engine, max_windows=16).classify(docs)
    assert row.status == "accepted" and row.category in engine.scorer.cfg.categories and 0 < row.score <= 1
    assert (row.n_windows, row.n_doc_tokens, row.truncated) == (10, 10 * n, False)
    (cut,) = engine.classify(docs)
    assert (cut.n_windows, cut.n_doc_tokens, cut.truncated) == (1, n, True) and cut.n_tokens < row.n_tokens


def test_a_short_document_gets_the_same_category_and_score_in_both_modes(engine, bbc_dir, pilot_config):
    tok = engine.llm.get_tokenizer()
    short = [t for t in train_texts(bbc_dir) if len(tok(t, add_special_tokens=False)["input_ids"]) < 200][:3]
    docs = [document_from_text(f"s{i}", t, 200_000) for i, t in enumerate(short)]
    assert len(docs) == 3
    windows = _windows(engine)
    assert engine.scorer.prompts(docs) == windows.scorer.prompts(docs)  # the same token ids go to the engine
    cut, win = engine.classify(docs), windows.classify(docs)
    # the same rows; the score to the engine's own run-to-run rounding (prefix cache, batch shape: answers.py),
    # bit for bit where the engine's outputs are the same (tests/unit/classify/engine/test_long_documents.py)
    tol = score_tolerance(pilot_config.model)
    for c, w in zip(cut, win, strict=True):
        assert c.model_copy(update={"score": None}) == w.model_copy(update={"score": None})
        assert w.n_windows == 1 and not w.truncated and abs(c.score - w.score) <= tol


def _head(tok, text: str, n: int) -> str:
    return tok.decode(tok(text, add_special_tokens=False)["input_ids"][:n])


@pytest.mark.slow  # about 40 s (make test-slow); the ten-x document's windows on the real engine stay in make test
def test_a_topic_found_only_after_the_first_window_is_read_with_windows_not_with_cut(engine, bbc_dir):
    """A planted document: a non-sport article's first 320 tokens, then three sport articles (real BBC train text).

    What each part alone is called is measured first, so the test states its premises instead of hoping: the
    opening is called non-sport in ``cut`` mode, the sport articles are called sport. The planted document must
    then be called what its opening is with ``cut`` (it reads the opening only) and sport with ``windows``.
    """
    tok = engine.llm.get_tokenizer()
    openings = [_head(tok, t, OPENING_TOKENS) for c in ("business", "politics", "tech") for t in train_texts(bbc_dir, c)[:3]]
    sport = [t for t in train_texts(bbc_dir, "sport") if len(tok(t, add_special_tokens=False)["input_ids"]) > 300][:8]
    alone = engine.classify([document_from_text(f"o{i}", t, 200_000) for i, t in enumerate(openings)]
                            + [document_from_text(f"s{i}", t, 200_000) for i, t in enumerate(sport)])
    opening = next(t for t, r in zip(openings, alone, strict=False) if r.category != "sport")
    called_sport = [t for t, r in zip(sport, alone[len(openings):], strict=True) if r.category == "sport"]
    assert len(called_sport) >= 3, [r.category for r in alone[len(openings):]]  # premise: the model knows sport
    planted = document_from_text("planted", "\n\n".join([opening, *called_sport[:3]]), 200_000)
    (cut,) = engine.classify([planted])
    (win,) = _windows(engine, max_windows=16).classify([planted])
    assert cut.truncated and cut.category != "sport"
    print(f"planted: cut {cut.category} {cut.score}, windows {win.category} {win.score} over {win.n_windows} windows")
    assert win.category == "sport" and win.n_windows >= 4 and not win.truncated, win
