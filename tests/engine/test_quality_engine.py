"""Score calibration, review flags and the quality reports (accuracy, confusion matrix, pictures).

Fast tests: a fake tokenizer and fake vLLM outputs drive the real :class:`classify.engine.scoring.Scorer`
through the offline (pilot, batch) and async (serve) classifiers, and the reports run on
hand-made result rows.

Split by tier: this file holds the engine tests; the others of the same subject are in ``tests/unit/batch/report/test_quality.py``, ``tests/ray/test_quality_ray.py``.
"""

from __future__ import annotations

from classify.config.sections import ClassifyConfig
from classify.documents.read import document_from_text
from classify.engine.scoring import softmax_at

CATS = ClassifyConfig().categories
# first-token log-probs the fake engine answers with (already normalised over the categories)


# --- review flags and the report --------------------------------------------------------------------------------


# --- corpus labels, streamed in results order -------------------------------------------------------------------


def test_real_engine_tempers_the_category_logprobs_it_returns(engine, monkeypatch):
    """The real vLLM output: the score at T = 2 is softmax(logprobs / 2) of the returned category log-probs."""
    seen = []
    real = engine.scorer.result

    def spy(doc, prompt, completions, temperature=1.0):
        (completion,) = completions  # one output per window; these short documents are one window each
        lp = {t: v.logprob for t, v in completion.logprobs[0].items() if t in engine.scorer._token_to_category}  # noqa: SLF001
        seen.append((lp, completion.token_ids[0], temperature))
        return real(doc, prompt, completions, temperature)

    monkeypatch.setattr(engine.scorer, "result", spy)
    docs = [document_from_text("a", "Shares in the bank fell 5% after it cut its dividend.", 10_000),
            document_from_text("b", "The striker scored twice as the home side won 3-0.", 10_000)]
    raw = engine.classify(docs)
    hot = engine.classify(docs, temperature=2.0)  # what the pilot and the batch pass for a merged calibrated adapter
    assert [t for _, _, t in seen] == [1.0, 1.0, 2.0, 2.0]
    for r, h, (lp, token, _) in zip(raw, hot, seen[2:], strict=True):
        assert len(lp) == len(CATS) and r.category == h.category
        assert h.score == round(softmax_at(lp, token, 2.0), 6) and h.score <= r.score
        assert r.score == round(softmax_at(lp, token, 1.0), 6)


# --- a labelled pilot (stand-in engine: the bookkeeping and the pictures are under test) --------------------------


# --- batches over a labelled and an unlabelled corpus (real local Ray, the instant bench engine) -------------------
