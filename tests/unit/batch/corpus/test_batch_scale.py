"""Batch at scale: streaming plan, content-sized shards, duplicates across shards, Parquet in and out, resume.

The run-level tests use the bench-only instant engine (``bench/instant_engine.py``) through the
real Ray pool and real run folders; the rest need neither Ray nor an engine.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_batch_scale_ray.py``.
"""

from __future__ import annotations

import json

import pytest

from batch.corpus.ids import IdHashBuckets
from batch.corpus.plan import plan_corpus
from classify.config.batch import CorpusConfig
from tests.support.corpora import ROOT, news_rows, read_corpus, write_jsonl


def test_shards_are_cut_by_bytes_with_a_document_cap(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", news_rows(1000))  # ids d-00000..d-00999: every line has the same length
    line = len(json.dumps(news_rows(1)[0])) + 1
    by_bytes = plan_corpus(CorpusConfig(path=str(path)), 1000, 10 * line)
    assert [s.n_docs for s in by_bytes.shards] == [10] * 100
    by_docs = plan_corpus(CorpusConfig(path=str(path)), 7, 1 << 30)
    assert [s.n_docs for s in by_docs.shards] == [7] * 142 + [6]
    # every shard re-reads exactly its rows, and together they are the corpus
    docs = [d for s in by_bytes.shards for d in by_bytes.read_shard(s, 200_000)]
    assert [d.id for d in docs] == [r["id"] for r in news_rows(1000)]
    assert by_bytes.fingerprint == by_docs.fingerprint  # content, not the plan


def test_a_small_corpus_still_makes_enough_shards_for_every_actor(tmp_path):
    from batch.corpus.plan import MIN_SHARDS

    path = write_jsonl(tmp_path / "c.jsonl", news_rows(100))
    plan = plan_corpus(CorpusConfig(path=str(path)), 1000, 4 << 20)  # the default 4 MiB target: one shard before
    assert MIN_SHARDS <= len(plan.shards) <= 2 * MIN_SHARDS
    assert sum(s.n_docs for s in plan.shards) == 100


def test_duplicates_across_shards_one_rejected_row_at_the_first_occurrence(tmp_path):
    rows = news_rows(30)
    rows += [{"id": "d-00002", "text": "again"}, {"id": "d-00025", "text": "twice"}, {"id": "d-00002", "text": "thrice"}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    plan = plan_corpus(CorpusConfig(path=str(path)), 4, 1 << 30)
    assert (plan.input_rows, plan.duplicate_rows, plan.distinct_ids) == (33, 3, 30)
    docs = [d for s in plan.shards for d in plan.read_shard(s, 200_000)]
    assert [d.id for d in docs] == [r["id"] for r in news_rows(30)]  # first-seen order, each id once
    by_id = {d.id: d for d in docs}
    assert by_id["d-00002"].reject_reason.startswith("duplicate id: given 3 times (c.jsonl#L3, c.jsonl#L31, c.jsonl#L33;")
    assert by_id["d-00025"].reject_reason.startswith("duplicate id: given 2 times")
    assert sum(s.n_docs for s in plan.shards) == 30
    assert [d.id for d in read_corpus(CorpusConfig(path=str(path)), 200_000).docs] == [d.id for d in docs]


def test_id_hash_buckets_find_repeats_in_flat_memory():
    buckets = IdHashBuckets()
    for i in range(50_000):
        buckets.add(f"id-{i}", i)
    buckets.add("id-123", 50_000)
    assert buckets.candidate_rows() == [123, 50_000]


def test_parquet_corpus_reads_like_the_same_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = news_rows(40) + [{"id": "empty", "text": ""}, {"id": "d-00003", "text": "dup"}]
    jsonl = write_jsonl(tmp_path / "c.jsonl", rows)
    pq.write_table(pa.table({"doc": [r["id"] for r in rows], "body": [r["text"] for r in rows]}), tmp_path / "c.parquet",
                   row_group_size=7)
    from_jsonl = plan_corpus(CorpusConfig(path=str(jsonl)), 6, 1 << 30)
    from_pq = plan_corpus(CorpusConfig(path=str(tmp_path / "c.parquet"), id_column="doc", text_column="body"), 6, 1 << 30)
    a = [d for s in from_jsonl.shards for d in from_jsonl.read_shard(s, 200_000)]
    b = [d for s in from_pq.shards for d in from_pq.read_shard(s, 200_000)]
    assert [(d.id, d.text, d.input_sha256) for d in a] == [(d.id, d.text, d.input_sha256) for d in b]
    assert [d.reject_reason is None for d in a] == [d.reject_reason is None for d in b]
    generated = read_corpus(CorpusConfig(path=str(tmp_path / "c.parquet"), text_column="body", id_prefix="p"), 200_000)
    assert generated.docs[0].id == "p-0000" and len(generated.docs) == 42


def test_csv_shards_by_byte_offsets_with_multiline_records(tmp_path):
    path = tmp_path / "c.csv"
    body = "".join(f'"line one {i}\nline two {i}",tech\n' for i in range(25))
    path.write_text("text,category\n" + body, encoding="utf-8")
    plan = plan_corpus(CorpusConfig(path=str(path), id_prefix="c"), 4, 1 << 30)
    docs = [d for s in plan.shards for d in plan.read_shard(s, 200_000)]
    assert [d.id for d in docs] == [f"c-{i:04d}" for i in range(25)]
    assert docs[24].text == "line one 24\nline two 24"


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_second_plan_of_the_same_tabular_file_reuses_the_stored_one(tmp_path, fmt, monkeypatch):
    """The resume's quick fingerprint of a CSV or Parquet file is the planning pass's, so the stored plan is reused
    (no second planning pass), and the plan itself is what it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import batch.run.attempt as attempt
    from batch.corpus.plan import plan_corpus, quick_fingerprint
    from batch.runfiles import Manifest
    from classify.config.batch import BatchConfig

    rows = news_rows(40)
    path = tmp_path / f"c.{fmt}"
    if fmt == "csv":
        path.write_text("id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), path)
    cfg = BatchConfig.model_validate({"corpus": {"path": str(path), "id_column": "id"}, "batch": {"shard_docs": 8}})
    first = plan_corpus(cfg.corpus, cfg.batch.shard_docs, cfg.batch.shard_target_bytes, path)
    assert first.fingerprint.startswith("sha256:") and quick_fingerprint(path, fmt, first.describe()) == first.fingerprint
    old = Manifest(manifest_version=2, corpus=first.describe(), corpus_fingerprint=first.fingerprint, shards=first.shards)
    monkeypatch.setattr(attempt, "plan_corpus", lambda *a, **k: pytest.fail("planned again"))
    second = attempt.plan_or_reuse(cfg, path, fmt, old, "b")
    assert second.shards is old.shards and second.fingerprint == first.fingerprint
    assert second.describe() == first.describe() and [d.id for s in second.shards for d in second.read_shard(s, 10_000)] == [
        r["id"] for r in rows]


def test_a_version_1_run_folder_is_refused_with_a_clear_message(tmp_path):
    from batch import layout as mf
    from classify.errors import InputError
    from classify.runs.records import write_json_atomic

    write_json_atomic(tmp_path / "old" / mf.MANIFEST, {"batch_id": "old", "shards": [], "corpus": {}})
    with pytest.raises(InputError, match=r"batch old was made by an earlier docpilot \(run folder manifest_version 1, "
                                         r".*\(manifest_version 2\) and cannot resume it"):
        mf.read_manifest(tmp_path / "old", "resume")  # as the driver reads it (BatchRun._run)


def test_the_instant_engine_cannot_be_selected_by_config_or_cli():
    from batch.run.driver import parse_args

    assert "instant" not in (ROOT / "config" / "docpilot.json").read_text().lower()
    with pytest.raises(SystemExit):
        parse_args(["--engine", "instant"])
    for folder in ("batch", "classify", "serve", "adapters"):  # no product code names it: only bench/ and tests pass it
        for path in (ROOT / folder).rglob("*.py"):
            assert "from bench" not in path.read_text(encoding="utf-8"), path
