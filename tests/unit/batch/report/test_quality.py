"""Score calibration, review flags and the quality reports (accuracy, confusion matrix, pictures).

Fast tests: a fake tokenizer and fake vLLM outputs drive the real :class:`classify.engine.scoring.Scorer`
through the offline (pilot, batch) and async (serve) classifiers, and the reports run on
hand-made result rows.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/engine/test_quality_engine.py``, ``tests/ray/test_quality_ray.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from classify.config.sections import ClassifyConfig
from classify.documents.read import document_from_text
from classify.engine.build import Classifier
from classify.engine.scoring import AdapterHandle, Scorer, softmax_at

CATS = ClassifyConfig().categories
# first-token log-probs the fake engine answers with (already normalised over the categories)
LOGPROBS = dict(zip(range(len(CATS)), [math.log(p) for p in (0.70, 0.20, 0.05, 0.03, 0.02)], strict=True))


class FakeTokenizer:
    """Category i starts with token i; prompts are rendered through the chat template stand-in."""

    def __call__(self, text, add_special_tokens=False, split_special_tokens=False):
        if isinstance(text, list):  # a batch (the prompt builder's plain-text call on a slow tokenizer)
            return {"input_ids": [self(t)["input_ids"] for t in text]}
        return {"input_ids": [CATS.index(text) if text in CATS else 99] + [7] * (len(text) // 8)}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [7] * max(1, len(text) // 8)

    def decode(self, ids):
        return "x" * len(ids)


def _completion():
    return SimpleNamespace(token_ids=[0], text=CATS[0], cumulative_logprob=LOGPROBS[0],
                           logprobs=[{t: SimpleNamespace(logprob=lp) for t, lp in LOGPROBS.items()}])


class FakeLLM:
    """``vllm.LLM.generate`` stand-in: every prompt answers category 0 with :data:`LOGPROBS`."""

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        return [SimpleNamespace(outputs=[_completion()]) for _ in prompts]


class FakeAsyncLLM:
    """``AsyncLLM.generate`` stand-in (one final output per request)."""

    async def generate(self, prompt, params, request_id, lora_request=None):
        yield SimpleNamespace(outputs=[_completion()])


def _scorer(**cfg):
    return Scorer(FakeTokenizer(), ClassifyConfig(**cfg), 4096)


def _docs():
    return [document_from_text("a", "Shares fell after the results.", 10_000), document_from_text("b", "", 10_000)]


def test_softmax_at_is_raw_at_t1_and_flattens_above():
    assert softmax_at(LOGPROBS, 0) == pytest.approx(0.70)
    tempered = [softmax_at(LOGPROBS, k, 2.0) for k in LOGPROBS]
    assert sum(tempered) == pytest.approx(1.0)
    expected = math.sqrt(0.70) / sum(math.sqrt(p) for p in (0.70, 0.20, 0.05, 0.03, 0.02))
    assert tempered[0] == pytest.approx(expected) and tempered[0] < 0.70
    assert softmax_at(LOGPROBS, 0, 0.01) == pytest.approx(1.0)  # sharp T: no underflow to 0/0


@pytest.mark.parametrize("t", [0.05, 0.5, 1.0, 1.7, 20.0])
def test_the_engine_applies_the_temperature_as_the_fit_does(t):
    """``adapters.train.calibration.apply_temperature`` (training's fit) and the Scorer's softmax_at agree."""
    from adapters.train.calibration import apply_temperature

    fitted = apply_temperature([list(LOGPROBS.values())], t)[0]
    assert [softmax_at(LOGPROBS, k, t) for k in LOGPROBS] == pytest.approx(list(fitted), abs=1e-12)


def _registry_adapter(tmp_path, temperature):
    from adapters.registry.registry import Registry

    reg = Registry(tmp_path / "registry")
    src = tmp_path / "src"
    src.mkdir()
    (src / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (src / "adapter_model.safetensors").write_bytes(b"weights are not read here")
    card = {"base_model": {"name": "fake-base", "fingerprint": "sha256:" + "0" * 64}}
    if temperature is not None:
        card["calibration"] = {"temperature": temperature}
    reg.publish(src, "cal", 1, card)
    return reg.resolve("cal@latest")


@pytest.mark.parametrize("temperature", [None, 2.5])
def test_pilot_batch_and_serve_apply_the_card_temperature_identically(tmp_path, temperature):
    from serve.engine import AsyncClassifier

    resolved = _registry_adapter(tmp_path, temperature)
    handle = resolved.handle()
    t = 1.0 if temperature is None else temperature
    assert handle.temperature == t
    expected = round(softmax_at(LOGPROBS, 0, t), 6)
    offline = Classifier(FakeLLM(), _scorer(), None, lora_enabled=True)
    lora = offline.classify(_docs(), adapter=handle)  # pilot and batch in LoRA mode (the batch actor's call)
    merged = Classifier(FakeLLM(), _scorer(), None, lora_enabled=False).classify(_docs(), temperature=handle.temperature)
    served = asyncio.run(AsyncClassifier(FakeAsyncLLM(), _scorer(), None, True).classify(_docs(), adapter=handle))
    assert lora == merged == served
    assert lora[0].score == expected and lora[1].status == "rejected"
    if temperature is None:  # no calibration: the raw probability, as before calibration existed
        assert lora[0].score == 0.7
    base = offline.classify(_docs())  # the base model: never tempered
    assert base[0].score == 0.7


def test_the_batch_actor_applies_the_temperature_in_lora_and_merged_mode(tmp_path, monkeypatch):
    from batch.corpus.shard import ShardInput
    from batch.pool.actor import EngineActor

    monkeypatch.setattr("batch.pool.actor.build_engine", lambda *a, **k: Classifier(FakeLLM(), _scorer(), None, True))
    handle = _registry_adapter(tmp_path, 2.5).handle()
    expected = round(softmax_at(LOGPROBS, 0, 2.5), 6)
    for adapter, temperature in ((handle, None), (None, handle.temperature)):  # LoRA mode, merged mode
        actor = EngineActor(None, None, ClassifyConfig(), adapter, "", temperature=temperature)
        try:
            out = actor.classify(ShardInput.of_documents(_docs()))  # the shard file's bytes, as the driver writes them
            assert json.loads(out.body.splitlines()[0])["score"] == expected and out.n_docs == 2
            raw = ShardInput.of_jsonl("c.jsonl", "c.jsonl", 1, b"".join(json.dumps({"id": d.id, "text": d.text or ""}).encode()
                                                                        + b"\n" for d in _docs()), 2)
            assert actor.classify(raw) == out  # a JSONL shard sent as raw bytes is parsed in the actor alike
        finally:
            actor.shutdown()


@pytest.mark.parametrize("threshold, flag", [(None, None), (0.6, False), (0.75, True)])
def test_the_scorer_flags_review_only_with_a_threshold_and_rows_stay_as_before_without(threshold, flag):
    from serve.schemas import ResultOut

    (accepted, rejected) = Classifier(FakeLLM(), _scorer(review_below_score=threshold), None, True).classify(_docs())
    assert accepted.score == 0.7 and accepted.review is flag and rejected.review is None
    row = accepted.row()
    if threshold is None:  # byte-identical to the rows written before review flags existed
        assert list(row) == ["id", "status", "category", "score", "reason", "input_sha256", "n_chars", "n_tokens",
                             "n_doc_tokens", "n_windows", "truncated"]  # issue 41 added the last three
    else:
        assert row["review"] is flag
    assert "review" not in rejected.row()
    out = json.loads(ResultOut.of(accepted).model_dump_json())
    assert out.get("review", "absent") == ("absent" if flag is None else flag)


def test_handle_default_temperature_is_one():
    assert AdapterHandle("x@1", "/nowhere", 1).temperature == 1.0


# --- review flags and the report --------------------------------------------------------------------------------

def _row(i, category, score, status="accepted"):
    if status == "rejected":
        return {"id": str(i), "status": "rejected", "category": None, "score": None, "reason": "empty document"}
    return {"id": str(i), "status": "accepted", "category": category, "score": score}


def test_needs_review_only_with_a_threshold():
    from classify.engine.scoring import needs_review

    assert needs_review(0.1, None) is None  # off: rows carry no flag
    assert needs_review(0.59, 0.6) is True and needs_review(0.6, 0.6) is False and needs_review(None, 0.6) is True


def test_review_counts_per_category_and_accuracy_above_and_below_the_threshold():
    from batch.report.quality import QualityTally

    t = QualityTally(["sport", "tech"], review_below_score=0.6)
    rows = [(_row(0, "sport", 0.95), "sport"), (_row(1, "sport", 0.9), "tech"), (_row(2, "tech", 0.5), "tech"),
            (_row(3, "tech", 0.4), "sport"), (_row(4, "tech", 0.55), "tech"), (_row(5, None, None, "rejected"), "tech"),
            (_row(6, "sport", 0.3), None)]
    for row, label in rows:
        t.add(row, label)
    rep = t.report()
    assert rep["review"] == {"below_score": 0.6, "flagged": 4, "by_category": {"sport": 1, "tech": 3}}
    lab = rep["labelled"]
    assert (lab["documents"], lab["correct"], lab["accuracy"], lab["rejected"], lab["unlabelled"]) == (6, 3, 0.5, 1, 1)
    assert lab["by_review"]["above"] == {"documents": 2, "correct": 1, "accuracy": 0.5}
    assert lab["by_review"]["below"] == {"documents": 3, "correct": 2, "accuracy": 0.6667}
    assert lab["confusion"]["predicted"] == ["sport", "tech", "rejected"]
    assert lab["confusion"]["counts"] == [[1, 1, 0], [1, 2, 1]]
    assert lab["per_category"]["tech"] == {"documents": 4, "correct": 2, "accuracy": 0.5, "precision": 0.6667, "rejected": 1}
    assert rep["distribution"] == {"sport": 3, "tech": 3, "rejected": 1}
    assert rep["score_histogram"]["counts"][19] == 1 and sum(rep["score_histogram"]["counts"]) == 6


def test_a_rows_own_review_flag_is_counted_as_given():
    from batch.report.quality import QualityTally

    t = QualityTally(["sport", "tech"], review_below_score=0.6)
    t.add({**_row(0, "tech", 0.9), "review": True})
    t.add({**_row(1, "tech", 0.1), "review": False})
    assert t.report()["review"]["by_category"] == {"sport": 0, "tech": 1}


def test_an_unlabelled_run_has_no_accuracy_and_no_review_section_without_a_threshold(tmp_path):
    from batch.report.quality import QualityTally, quality_table, write_report

    t = QualityTally(["sport", "tech"])
    t.add(_row(0, "sport", 0.7))
    t.add(_row(1, "tech", 0.8), label="not-a-category")
    rep = write_report(tmp_path, t, "run-x")
    assert "labelled" not in rep and "review" not in rep
    assert rep["files"] == ["category_distribution.png", "score_histogram.png", "quality.md"]
    assert not (tmp_path / "confusion_matrix.png").exists()
    assert (tmp_path / "score_histogram.png").read_bytes()[:4] == b"\x89PNG"
    assert "accuracy" not in quality_table(rep)


def test_labelled_pilot_rows_write_the_confusion_matrix_with_planned_rejects(tmp_path):
    from batch.report.quality import tally_rows, write_report

    rows = [_row("a", "sport", 0.9), _row("b", "tech", 0.8), _row("c", None, None, "rejected")]
    rep = write_report(tmp_path, tally_rows(rows, {"a": "sport", "b": "sport", "c": "reject"}, ["sport", "tech"]), "pilot")
    assert rep["labelled"]["accuracy"] == 0.5 and rep["labelled"]["planned_rejects"] == 1
    assert rep["labelled"]["confusion"]["labels"] == ["sport", "tech", "reject"]
    assert (tmp_path / "confusion_matrix.png").stat().st_size > 10_000
    text = (tmp_path / "quality.md").read_text()
    assert "accuracy 50.0% (1/2 labelled documents" in text and "| sport | 1 | 2 | 1 | 50.0% | 100.0% |" in text


# --- corpus labels, streamed in results order -------------------------------------------------------------------

def _labelled_corpora(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": f"d{i}", "text": f"document number {i} " * 5, "category": ["sport", "tech", ""][i % 3]} for i in range(40)]
    rows.insert(7, {"id": "d3", "text": "a later row with an id used before", "category": "tech"})
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    csv_path = tmp_path / "c.csv"
    import csv

    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["id", "text", "category"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=9)
    return [jsonl, csv_path, tmp_path / "c.parquet"]


def test_corpus_labels_come_in_the_order_of_the_documents_for_every_format(tmp_path):
    from batch.corpus.labels import has_labels, iter_labels
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    for path in _labelled_corpora(tmp_path):
        plan = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 5, 1 << 30)
        docs = [d for s in plan.shards for d in plan.read_shard(s, 200_000)]
        assert has_labels(plan, "category") and not has_labels(plan, "topic"), path
        pairs = list(iter_labels(plan, "category"))
        assert [i for i, _ in pairs] == [d.id for d in docs], path
        labels = dict(pairs)
        assert (labels["d0"], labels["d1"], labels["d2"], labels["d3"]) == ("sport", "tech", None, "sport"), path


def test_jsonl_labels_found_past_lines_that_only_mention_the_column(tmp_path):
    """The key's bytes in a text (or a broken line) are not a label; the first record with the key is."""
    from batch.corpus.labels import has_labels
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    lines = ['{"id": "a", "text": "no category here"}', '{"id": "b", "text": "category: none {"}',
             '{"id": "c", "text": "the last one", "category": "tech"}']
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines))  # no final newline
    assert has_labels(plan_corpus(CorpusConfig(path=str(corpus)), 5, 1 << 30), "category")
    corpus.write_text("\n".join(lines[:2]) + "\n")
    assert not has_labels(plan_corpus(CorpusConfig(path=str(corpus)), 5, 1 << 30), "category")


def test_a_folder_corpus_has_no_labels(tmp_path):
    from batch.corpus.labels import has_labels
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    (tmp_path / "a.txt").write_text("some text")
    assert not has_labels(plan_corpus(CorpusConfig(path=str(tmp_path)), 5, 1 << 30), "category")


def _results_for(plan, folder, answer):
    from batch.corpus.plan import CorpusPlan  # noqa: F401 - the plan's type

    docs = [d for s in plan.shards for d in plan.read_shard(s, 200_000)]
    rows = [{"id": d.id, "status": "rejected", "category": None, "score": None, "reason": d.reject_reason}
            if d.reject_reason else {"id": d.id, "status": "accepted", "category": answer, "score": 0.75} for d in docs]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_batch_report_labelled_and_unlabelled(tmp_path):
    from batch.corpus.plan import plan_corpus
    from batch.report.quality import batch_report
    from classify.config.batch import CorpusConfig

    jsonl = _labelled_corpora(tmp_path)[0]
    plan = plan_corpus(CorpusConfig(path=str(jsonl), id_column="id"), 5, 1 << 30)
    run = tmp_path / "run"
    run.mkdir()
    _results_for(plan, run, "sport")
    rep = batch_report(run, plan, label_column="category", categories=["sport", "tech"], review_below_score=0.8,
                       run="b-1")
    lab = rep["labelled"]
    # 40 distinct ids: labels sport 14, tech 13, none 13; the duplicated d3 is one rejected row; the broken line unlabelled
    assert (lab["documents"], lab["correct"], lab["rejected"]) == (27, 13, 1)
    assert rep["label_column"] == "category" and rep["label_problem"] is None
    assert rep["review"]["flagged"] == 39 and (run / "confusion_matrix.png").exists()
    off = tmp_path / "off"
    off.mkdir()
    _results_for(plan, off, "sport")
    rep = batch_report(off, plan, label_column=None, categories=["sport", "tech"], review_below_score=None, run="b-2")
    assert "labelled" not in rep and rep["label_column"] is None and not (off / "confusion_matrix.png").exists()
    assert (off / "category_distribution.png").exists() and (off / "score_histogram.png").exists()


def test_labels_out_of_step_are_dropped_with_the_reason(tmp_path):
    from batch.report.quality import tally_results_file

    (tmp_path / "results.jsonl").write_text(json.dumps(_row("a", "sport", 0.9)) + "\n")
    tally, problem = tally_results_file(tmp_path / "results.jsonl", iter([("b", "sport")]), ["sport"])
    assert "out of step" in problem and "labelled" not in tally.report()


# --- a labelled pilot (stand-in engine: the bookkeeping and the pictures are under test) --------------------------


# --- batches over a labelled and an unlabelled corpus (real local Ray, the instant bench engine) -------------------


@pytest.mark.parametrize("threshold", [None, 0.6])
def test_a_results_table_is_counted_in_slices_as_a_whole(threshold):
    """``add_table`` (Arrow kernels) gives the same report over any slicing of the rows, and the counts by hand."""
    import pyarrow as pa

    from batch.report.quality import QualityTally, quality_table

    cats = ["business", "sport", "tech"]
    rows = [
        {"id": "a", "status": "accepted", "category": "sport", "score": 0.97, "review": False},
        {"id": "b", "status": "accepted", "category": "tech", "score": 0.31, "review": True},
        {"id": "c", "status": "accepted", "category": "tech", "score": 1.0, "review": None},
        {"id": "d", "status": "accepted", "category": "business", "score": None, "review": None},
        {"id": "e", "status": "accepted", "category": "movies", "score": 0.5, "review": None},
        {"id": "f", "status": "rejected", "category": None, "score": None, "review": None},
        {"id": "g", "status": "accepted", "category": "sport", "score": 0.0, "review": None},
        {"id": "h", "status": "accepted", "category": "sport", "score": 0.55, "review": None},
    ]
    labels = ["sport", "sport", "business", None, "tech", "tech", "reject", "odd"]
    schema = pa.schema([("id", pa.string()), ("status", pa.string()), ("category", pa.string()),
                        ("score", pa.float64()), ("review", pa.bool_())])
    table = pa.Table.from_pylist(rows, schema=schema)
    whole, sliced, in_memory = QualityTally(cats, threshold), QualityTally(cats, threshold), QualityTally(cats, threshold)
    whole.add_table(table, labels)
    sliced.add_table(table.slice(0, 3), labels[:3])
    sliced.add_table(table.slice(3), labels[3:])
    in_memory.add_rows(rows, labels)
    rep = whole.report()
    assert rep == sliced.report() == in_memory.report()
    assert rep["distribution"] == {"business": 1, "sport": 3, "tech": 2, "rejected": 2} and sum(whole.hist) == 6
    assert whole.hist[19] == 2 and whole.hist[0] == 1 and whole.hist[6] == 1  # 0.97 and 1.0, 0.0, 0.31
    lab = rep["labelled"]
    assert (lab["documents"], lab["correct"], lab["unlabelled"], lab["labels_outside_categories"]) == (5, 1, 1, {"odd": 1})
    assert lab["confusion"]["counts"][3] == [0, 1, 0, 0] and lab.get("planned_rejects") == 1  # reject -> sport
    assert rep["labels_outside_categories"] == {"rows": 1, "labels": {"odd": 1}}
    assert "1 rows with a label outside the categories, not scored ('odd': 1)" in quality_table(rep)
    if threshold is not None:  # b flagged by its record; d (no score), e, g and h (scores under 0.6) by the threshold
        assert rep["review"]["flagged"] == 5
        assert lab["by_review"]["above"]["documents"] + lab["by_review"]["below"]["documents"] == 4
    only_odd = QualityTally(cats, threshold)
    only_odd.add_rows(rows[:2], ["mixed", "mixed"])  # no label among the categories: no accuracy, yet counted
    assert "labelled" not in only_odd.report()
    assert "2 rows with a label outside the categories, not scored ('mixed': 2)" in quality_table(only_odd.report())
    odd = pa.Table.from_pylist([{"id": "x", "status": "accepted", "category": "tech", "score": 1.5},
                                {"id": "y", "status": "accepted", "category": "tech", "score": float("nan")}])
    out = QualityTally(cats, threshold)
    out.add_table(odd)  # a score over 1 falls in the last bin, NaN in none
    assert out.hist[19] == 1 and sum(out.hist) == 1 and out.total == 2


def test_the_few_wrong_answers_get_a_panel_of_their_own_in_the_score_histogram(tmp_path, monkeypatch):
    """Issue 42 item 8: 2 wrong answers beside 300 right ones are one pixel each on a shared linear axis; the picture
    draws them again on their own axis, where one wrong answer is at least a third of the panel's height."""
    from batch.report import plots
    from batch.report.quality import QualityTally, write_report

    t = QualityTally(["sport", "tech"])
    for i in range(300):
        t.add(_row(i, "sport", 0.97), label="sport")
    t.add(_row(300, "tech", 0.96), label="sport")
    t.add(_row(301, "tech", 0.55), label="sport")
    figures = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: figures.append((path.name, fig)) or real(plt, fig, path))
    write_report(tmp_path, t, "run-x")
    [fig] = [f for name, f in figures if name == plots.HISTOGRAM_PNG]
    assert len(fig.axes) == 2, "the wrong answers have no panel of their own"
    low = fig.axes[1]
    heights = [p.get_height() for p in low.patches]
    assert sum(heights) == 2 and max(heights) == 1
    assert 1 / low.get_ylim()[1] >= 1 / 3
    assert (tmp_path / plots.HISTOGRAM_PNG).read_bytes()[:4] == b"\x89PNG"
