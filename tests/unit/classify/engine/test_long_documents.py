"""Long documents (issue 41): ``classify.long_documents: cut | windows`` with the real tokenizer and a fake engine.

The prompt builder and the scorer are the real ones (the base model's tokenizer, no engine); the engine is a
stand-in that answers each prompt with log-probs that depend on the prompt, so combining windows is visible.
The real engine's tests of the same subject are in ``tests/engine/test_long_documents_engine.py`` (and the
served path in ``tests/engine/test_serve_mixed_adapters.py``); pilot and batch over real Ray in
``tests/ray/test_long_documents_ray.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from classify.config.sections import ClassifyConfig, ModelConfig, classification_sha256
from classify.documents.read import document_from_text
from classify.engine.build import Classifier
from classify.engine.prompt import build_prompts, build_training_examples, prompt_builder, window_spans
from classify.engine.scoring import Scorer, mean_logprobs, softmax_at
from classify.records import Result
from classify.runs.accounting import Ledger
from tests.support.corpora import long_document, train_texts

CUT = ClassifyConfig()
WINDOWS = ClassifyConfig(long_documents="windows")


@pytest.fixture(scope="module")
def tokenizer(pilot_config):
    from transformers import AutoTokenizer

    from classify.model.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(pilot_config.model).path)


@pytest.fixture(scope="module")
def long_text(tokenizer, bbc_dir):
    """Real BBC train text of exactly 10 x ``max_doc_tokens`` ids."""
    return long_document(tokenizer, bbc_dir, 10 * CUT.max_doc_tokens)


class WindowLLM:
    """``vllm.LLM.generate`` stand-in: each prompt answers log-probs that depend on its length (so windows differ)."""

    def __init__(self, first_tokens):
        self.first = first_tokens
        self.calls = []

    def logprobs(self, ids):
        k = len(ids) % len(self.first)
        raw = [-abs(k - j) - 0.1 * j for j in range(len(self.first))]
        norm = math.log(sum(math.exp(v) for v in raw))
        return {t: v - norm for t, v in zip(self.first, raw, strict=True)}

    def completion(self, ids):
        lps = self.logprobs(ids)
        best = max(lps, key=lps.__getitem__)
        return SimpleNamespace(token_ids=[best], text="", cumulative_logprob=lps[best],
                               logprobs=[{t: SimpleNamespace(logprob=v) for t, v in lps.items()}])

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        self.calls.append(len(prompts))
        return [SimpleNamespace(outputs=[self.completion(p["prompt_token_ids"])]) for p in prompts]


class WindowAsyncLLM(WindowLLM):
    """``AsyncLLM.generate`` stand-in of :class:`WindowLLM` (one final output per request)."""

    async def generate(self, prompt, params, request_id, lora_request=None):
        self.calls.append(1)
        yield SimpleNamespace(outputs=[self.completion(prompt["prompt_token_ids"])])


@pytest.mark.parametrize("n, window", [(0, 256), (1, 256), (256, 256), (257, 256), (2560, 256), (2561, 256), (7, 3)])
def test_windows_tile_the_document_balanced_without_overlap(n, window):
    spans = window_spans(n, window)
    assert len(spans) == max(1, math.ceil(n / window))
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # consecutive, no overlap
    sizes = [b - a for a, b in spans]
    assert max(sizes) <= window and max(sizes) - min(sizes) <= 1


def test_a_ten_x_document_gives_ten_windows_of_the_whole_document(tokenizer, long_text):
    text = long_text
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(whole) == 10 * CUT.max_doc_tokens
    cut, win = build_prompts(tokenizer, CUT, [text])[0], build_prompts(tokenizer, WINDOWS, [text])[0]
    assert cut.truncated and cut.n_windows == 1 and cut.n_doc_tokens == CUT.max_doc_tokens
    wide = ClassifyConfig(long_documents="windows", max_windows=16)
    full = build_prompts(tokenizer, wide, [text])[0]
    assert full.n_windows == 10 and not full.truncated and full.n_doc_tokens == len(whole)
    builder = prompt_builder(tokenizer, wide)
    prefix, suffix = builder.prefix_ids, builder.suffix_ids
    assert cut.ids == prefix + whole[:256] + suffix
    doc_parts = [w[len(prefix): len(w) - len(suffix)] for w in full.windows]
    assert all(w[: len(prefix)] == prefix and w[len(w) - len(suffix):] == suffix for w in full.windows)
    assert sum(doc_parts, []) == whole  # every token read once, in order
    assert full.n_tokens == sum(len(w) for w in full.windows) and full.longest <= len(cut.ids)
    # over the cap (default max_windows 8): the first max_windows x max_doc_tokens tokens, and the row says so
    assert win.truncated and win.n_doc_tokens == 8 * 256 and [len(w) for w in win.windows] == [len(cut.ids)] * 8


def test_a_short_document_has_the_same_prompt_in_both_modes(tokenizer):
    text = "Shares in the carmaker rose 3% on Monday after strong quarterly sales."
    cut, win = build_prompts(tokenizer, CUT, [text])[0], build_prompts(tokenizer, WINDOWS, [text])[0]
    assert cut == win and win.n_windows == 1 and not win.truncated


def test_training_examples_follow_the_windows(tokenizer, long_text):
    text = long_text
    assert len(build_training_examples(tokenizer, CUT, [text, "short"], ["sport", "tech"])) == 2
    examples = build_training_examples(tokenizer, WINDOWS, [text, "short"], ["sport", "tech"])
    assert len(examples) == 8 + 1  # one per window (capped at max_windows), then the short document's one
    prompts = build_prompts(tokenizer, WINDOWS, [text])[0].windows
    for ex, ids in zip(examples, prompts, strict=False):
        assert ex["input_ids"][: len(ids)] == ids and ex["labels"][: len(ids)] == [-100] * len(ids)
        assert tokenizer.decode([t for t in ex["labels"] if t != -100]).startswith("sport")


def test_one_row_per_long_document_with_its_windows_scored_in_one_call(tokenizer, long_text):
    text = long_text
    scorer = Scorer(tokenizer, ClassifyConfig(long_documents="windows", max_windows=16), 1024)
    llm = WindowLLM(scorer.first_tokens)
    docs = [document_from_text("long", text, 200_000), document_from_text("short", "The striker scored twice.", 200_000),
            document_from_text("empty", "", 200_000)]
    rows = Classifier(llm, scorer, None, False).classify(docs)
    assert [r.id for r in rows] == ["long", "short", "empty"] and llm.calls == [11]  # 10 + 1 prompts, one call
    long, short, empty = rows
    assert (long.n_windows, long.truncated, long.n_doc_tokens) == (10, False, 2560)
    prompt = scorer.prompts([docs[0]])[0]
    combined = mean_logprobs([llm.logprobs(w) for w in prompt.windows])
    best = max(combined, key=combined.__getitem__)
    assert long.category == scorer.cfg.categories[scorer.first_tokens.index(best)]
    assert long.score == round(softmax_at(combined, best), 6) and long.n_tokens == prompt.n_tokens
    assert short.n_windows == 1 and empty.status == "rejected" and empty.n_windows == 0
    led = Ledger(CUT.categories)
    for r in rows:
        led.add(r)
    assert led.counts()["n_windows"] == 11 and led.counts()["truncated"] == 0


def test_a_short_document_gets_identical_category_and_score_in_both_modes(tokenizer, bbc_dir):
    short = [t for t in train_texts(bbc_dir)[:400] if len(tokenizer(t, add_special_tokens=False)["input_ids"]) <= 256][:5]
    assert len(short) == 5
    docs = [document_from_text(f"d{i}", t, 200_000) for i, t in enumerate(short)]
    rows = {}
    for name, cfg in (("cut", CUT), ("windows", WINDOWS)):
        scorer = Scorer(tokenizer, cfg, 1024)
        rows[name] = Classifier(WindowLLM(scorer.first_tokens), scorer, None, False).classify(docs, temperature=1.7)
    assert rows["cut"] == rows["windows"]  # every field: category, score, n_tokens, n_windows 1, truncated False
    assert all(r.n_windows == 1 and not r.truncated for r in rows["cut"])


def test_cut_rows_say_truncated_and_the_row_keeps_its_old_columns_first(tokenizer, long_text):
    scorer = Scorer(tokenizer, CUT, 1024)
    row = Classifier(WindowLLM(scorer.first_tokens), scorer, None, False).classify(
        [document_from_text("x", long_text, 200_000)])[0]
    assert row.truncated and row.n_windows == 1 and row.n_doc_tokens == 256
    assert list(row.row())[:8] == ["id", "status", "category", "score", "reason", "input_sha256", "n_chars", "n_tokens"]
    assert list(row.row())[8:] == ["n_doc_tokens", "n_windows", "truncated"]  # review, dropped: only when set
    old = Result.from_json(json.dumps({"id": "o", "status": "accepted", "category": "tech", "score": 0.5}))
    assert (old.n_windows, old.truncated) == (0, False)  # a row written before issue 41 reads back


def test_serve_gives_one_result_per_long_document_with_its_windows(tokenizer, long_text):
    from serve.engine import AsyncClassifier
    from serve.schemas import ResultOut

    scorer = Scorer(tokenizer, ClassifyConfig(long_documents="windows", max_windows=16), 1024)
    llm = WindowAsyncLLM(scorer.first_tokens)
    docs = [document_from_text("long", long_text, 200_000),
            document_from_text("short", "The striker scored twice.", 200_000)]
    served = asyncio.run(AsyncClassifier(llm, scorer, None, False).classify(docs))
    offline = Classifier(WindowLLM(scorer.first_tokens), scorer, None, False).classify(docs)
    assert served == offline and len(llm.calls) == 11
    out = json.loads(ResultOut.of(served[0]).model_dump_json())
    assert (out["n_windows"], out["n_doc_tokens"], out["truncated"]) == (10, 2560, False)


def test_choice_scoring_votes_over_windows():
    scorer = SimpleNamespace(cfg=CUT)

    def c(text, p):
        return SimpleNamespace(text=text, cumulative_logprob=math.log(p))

    vote = Scorer._choice
    assert vote(scorer, [c("sport", 0.9)]) == ("sport", pytest.approx(0.9))
    assert vote(scorer, [c("tech", 0.9), c("sport", 0.6), c("sport", 0.7), c("nonsense", 1.0)]) == (
        "sport", pytest.approx(1.3 / 4))


def test_classification_key_of_cut_mode_is_what_it_was():
    import hashlib

    from classify.config.base import canonical_json

    model, classify = ModelConfig(), ClassifyConfig()
    old = classify.model_dump(mode="json", exclude={"review_below_score", "long_documents", "max_windows", "descriptions"})
    before = hashlib.sha256(canonical_json({"model": model.model_dump(mode="json", exclude={"adapter_mode"}),
                                            "classify": old}).encode()).hexdigest()
    assert classification_sha256(model, classify) == before  # pilots recorded before issue 41 still open batches
    assert classification_sha256(model, WINDOWS) != before
    assert classification_sha256(model, WINDOWS) != classification_sha256(model, WINDOWS.model_copy(update={"max_windows": 4}))


def test_training_check_captures_the_combined_logprobs_a_long_document_is_scored_with():
    from adapters.train.validate import _capture_logprobs

    first = [11, 12, 13, 14, 15]
    scorer = SimpleNamespace(mode="first-token", first_tokens=first, result=lambda doc, prompt, completion, t=1.0: "r")
    captured = _capture_logprobs(scorer)

    def window(lps):
        return SimpleNamespace(logprobs=[{t: SimpleNamespace(logprob=v) for t, v in zip(first, lps, strict=True)}])

    a, b = [-0.1, -3.0, -4.0, -5.0, -6.0], [-4.0, -0.2, -3.0, -5.0, -6.0]
    assert scorer.result(SimpleNamespace(id="long"), None, [window(a), window(b)]) == "r"
    assert scorer.result(SimpleNamespace(id="short"), None, window(a)) == "r"
    assert captured["long"] == [(x + y) / 2 for x, y in zip(a, b, strict=True)] and captured["short"] == a
