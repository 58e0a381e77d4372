"""Padding cannot decide a category (issue 55, item 2) on the real engine: the session vLLM engine (base model).

Real BBC train articles are classified as they are and with a tail that carries no text (hundreds of blank lines,
zero-width spaces and other format characters, both mixed), in ``windows`` mode (the tail used to fill windows
without words, which then carried the vote) and in ``cut`` mode (a run of newlines inside the one window). The
engine must receive the same token ids and give the same categories; the padded rows say what was dropped.
The fast tests of the normaliser are in ``tests/unit/classify/documents/test_normalise.py``.
"""

from __future__ import annotations

import pytest

from classify.documents.read import document_from_text
from classify.engine.build import Classifier
from classify.engine.scoring import Scorer
from tests.support.answers import score_tolerance
from tests.support.corpora import train_texts

pytestmark = pytest.mark.timeout(1200)

TAILS = {
    "blank lines": "\n" * 600,
    "zero-width": "\u200b" * 900,
    "mixed": "\n\u200b \u2060\ufeff\u00ad\n" * 300,
}


def _classifier(engine, **changes) -> Classifier:
    cfg = engine.scorer.cfg.model_copy(update=changes)
    scorer = Scorer(engine.llm.get_tokenizer(), cfg, engine.scorer.max_model_len)
    return Classifier(engine.llm, scorer, engine.model, engine.lora_enabled)


@pytest.mark.parametrize("mode", ["windows", "cut"])
def test_articles_with_and_without_a_tail_of_padding_get_the_same_categories(engine, bbc_dir, pilot_config, mode):
    tok = engine.llm.get_tokenizer()
    # short articles: with `windows` the padding used to be a window (or several) of its own
    articles = [t for t in train_texts(bbc_dir) if len(tok(t, add_special_tokens=False)["input_ids"]) < 240][:8]
    assert len(articles) == 8
    clf = _classifier(engine, long_documents=mode, max_windows=8)
    plain = [document_from_text(f"a{i}", t, 200_000) for i, t in enumerate(articles)]
    padded = [document_from_text(f"a{i}-{name}", t + tail, 200_000)
              for name, tail in TAILS.items() for i, t in enumerate(articles)]
    prompts = clf.scorer.prompts(plain)
    for j, prompt in enumerate(clf.scorer.prompts(padded)):
        assert prompt.windows == prompts[j % len(articles)].windows, padded[j].id  # the same ids reach the engine
    rows = clf.classify(plain + padded)
    base, rest = rows[:len(plain)], rows[len(plain):]
    tol = score_tolerance(pilot_config.model)
    for j, row in enumerate(rest):
        ref = base[j % len(articles)]
        assert row.status == ref.status == "accepted", row
        assert (row.category, row.n_windows, row.n_doc_tokens) == (ref.category, ref.n_windows, ref.n_doc_tokens), row.id
        assert abs(row.score - ref.score) <= tol, (row.id, row.score, ref.score)
        assert row.dropped and "before tokenising" in row.dropped, row
    assert all(r.dropped is None and "dropped" not in r.row() for r in base)


def test_a_document_of_padding_alone_is_rejected_not_scored(engine):
    clf = _classifier(engine, long_documents="windows")
    (row,) = clf.classify([document_from_text("pad", "...\n" + "\u200b" * 500 + " -- " * 400, 200_000)])
    assert row.status == "rejected" and row.reason.startswith("no words: nothing to classify"), row
    assert row.n_windows == 0
