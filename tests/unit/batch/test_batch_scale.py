"""Batch at scale: streaming plan, content-sized shards, duplicates across shards, Parquet in and out, resume.

The run-level tests use the bench-only instant engine (``bench/instant_engine.py``) through the
real Ray pool and real run folders; the rest need neither Ray nor an engine.
"""

from __future__ import annotations

import json
import os

import pytest

from batch import manifest as mf
from batch._config import CorpusConfig
from batch._id_buckets import IdHashBuckets
from batch.corpus import plan_corpus, read_corpus
from batch.merge import check_export
from tests.test_batch_helpers import ROOT, write_config


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _docs(n, text="news about markets " * 10):
    return [{"id": f"d-{i:05d}", "text": f"{text}{i}"} for i in range(n)]


def test_shards_are_cut_by_bytes_with_a_document_cap(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl", _docs(1000))  # ids d-00000..d-00999: every line has the same length
    line = len(json.dumps(_docs(1)[0])) + 1
    by_bytes = plan_corpus(CorpusConfig(path=str(path)), 1000, 10 * line)
    assert [s["n_docs"] for s in by_bytes.shards] == [10] * 100
    by_docs = plan_corpus(CorpusConfig(path=str(path)), 7, 1 << 30)
    assert [s["n_docs"] for s in by_docs.shards] == [7] * 142 + [6]
    # every shard re-reads exactly its rows, and together they are the corpus
    docs = [d for s in by_bytes.shards for d in by_bytes.read_shard(s, 200_000)]
    assert [d.id for d in docs] == [r["id"] for r in _docs(1000)]
    assert by_bytes.fingerprint == by_docs.fingerprint  # content, not the plan


def test_a_small_corpus_still_makes_enough_shards_for_every_actor(tmp_path):
    from batch.corpus import MIN_SHARDS

    path = _jsonl(tmp_path / "c.jsonl", _docs(100))
    plan = plan_corpus(CorpusConfig(path=str(path)), 1000, 4 << 20)  # the default 4 MiB target: one shard before
    assert MIN_SHARDS <= len(plan.shards) <= 2 * MIN_SHARDS
    assert sum(s["n_docs"] for s in plan.shards) == 100


def test_duplicates_across_shards_one_rejected_row_at_the_first_occurrence(tmp_path):
    rows = _docs(30)
    rows += [{"id": "d-00002", "text": "again"}, {"id": "d-00025", "text": "twice"}, {"id": "d-00002", "text": "thrice"}]
    path = _jsonl(tmp_path / "c.jsonl", rows)
    plan = plan_corpus(CorpusConfig(path=str(path)), 4, 1 << 30)
    assert (plan.input_rows, plan.duplicate_rows, plan.distinct_ids) == (33, 3, 30)
    docs = [d for s in plan.shards for d in plan.read_shard(s, 200_000)]
    assert [d.id for d in docs] == [r["id"] for r in _docs(30)]  # first-seen order, each id once
    by_id = {d.id: d for d in docs}
    assert by_id["d-00002"].reject_reason.startswith("duplicate id: given 3 times (c.jsonl#L3, c.jsonl#L31, c.jsonl#L33;")
    assert by_id["d-00025"].reject_reason.startswith("duplicate id: given 2 times")
    assert sum(s["n_docs"] for s in plan.shards) == 30
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

    rows = _docs(40) + [{"id": "empty", "text": ""}, {"id": "d-00003", "text": "dup"}]
    jsonl = _jsonl(tmp_path / "c.jsonl", rows)
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


def _run(tmp_path, corpus, batch_id, monkeypatch, corpus_fields=None, extra_args=(), **batch_fields):
    from batch.driver import parse_args, run_batch
    from bench.instant_engine import remote_class

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / f"{batch_id}.json", **batch_fields)
    data = json.loads(config.read_text())
    data["corpus"].update(corpus_fields or {})
    config.write_text(json.dumps(data))
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", batch_id,
                       "--skip-pilot-gate", "--no-progress", *extra_args])
    return run_batch(args, _engine_actor=remote_class())


@pytest.mark.ray
def test_parquet_and_jsonl_batches_give_the_same_results_and_parquet_equals_jsonl(instant_ray, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from classify.export import verify_export
    from classify.runrecords import read_jsonl

    rows = _docs(300) + [{"id": "d-00007", "text": "dup"}, {"id": "blank", "text": "   "}]
    jsonl = _jsonl(tmp_path / "c.jsonl", rows)
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), tmp_path / "c.parquet",
                   row_group_size=50)
    a = _run(tmp_path, jsonl, "j", monkeypatch, shard_docs=64, shard_target_bytes=5000, corpus_fields={"id_column": "id"})
    b = _run(tmp_path, tmp_path / "c.parquet", "p", monkeypatch, shard_docs=64, shard_target_bytes=5000,
             corpus_fields={"id_column": "id"})
    ra, rb = read_jsonl(tmp_path / "runs" / "j" / mf.RESULTS), read_jsonl(tmp_path / "runs" / "p" / mf.RESULTS)
    strip = ("reason",)  # reasons name the source (c.jsonl#L8 / c.parquet#row7)
    assert [{k: v for k, v in r.items() if k not in strip} for r in ra] == [{k: v for k, v in r.items() if k not in strip} for r in rb]
    assert len(ra) == a["total"] == b["total"] == 301 and a["rejected"] == b["rejected"] == 2
    table = pq.read_table(tmp_path / "runs" / "p" / mf.RESULTS_PARQUET).to_pylist()
    assert table == [{k: r.get(k) for k, _ in mf.RESULT_COLUMNS} for r in rb]  # row for row
    sums = (tmp_path / "exports" / "p" / "SHA256SUMS").read_text()
    assert "results.parquet" in sums and "results.jsonl" in sums
    assert verify_export(tmp_path / "exports" / "p", check_export) == []
    export = tmp_path / "exports" / "p"
    from batch._export_check import _check_export_fast
    from batch.runfiles import Manifest

    manifest = Manifest.read(export / mf.MANIFEST)
    summary = json.loads((export / mf.SUMMARY).read_text())
    assert _check_export_fast(export, manifest, summary) == []  # the clean copy passes the columnar check itself
    # a changed Parquet row in the copy is found by the re-check
    bad = pq.read_table(export / mf.RESULTS_PARQUET).to_pylist()
    bad[5]["category"] = "sport"
    os.chmod(export / mf.RESULTS_PARQUET, 0o644)
    pq.write_table(pa.Table.from_pylist(bad, schema=pq.read_schema(export / mf.RESULTS_PARQUET)), export / mf.RESULTS_PARQUET)
    assert _check_export_fast(export, manifest, summary) is None  # the columnar check hands over ...
    assert any("results.parquet row 5 differs" in p for p in check_export(export))  # ... and the row is named


@pytest.mark.ray
def test_resume_with_half_the_shards_is_exactly_once_and_folders_stay_small(instant_ray, tmp_path, monkeypatch):
    from classify.runrecords import read_jsonl

    corpus = _jsonl(tmp_path / "c.jsonl", _docs(2500, "x"))
    first = _run(tmp_path, corpus, "r", monkeypatch, shard_docs=1, shard_target_bytes=1 << 20)
    run = tmp_path / "runs" / "r"
    manifest = mf.read_manifest(run)
    assert manifest.manifest_version == 2 and len(manifest.shards) == 2500
    for folder, _, files in os.walk(run):
        assert len(files) <= mf.SHARDS_PER_FOLDER, folder  # 2500 shard files in 3 folders
    assert sorted(os.listdir(run / mf.SHARDS)) == ["000", "001", "002"]
    removed = manifest.shards[::2]
    for s in removed:
        mf.shard_path(run, s["index"], 2).unlink()
    for name in (mf.RESULTS, mf.RESULTS_PARQUET, mf.SUMMARY):
        (run / name).unlink()
    import shutil

    shutil.rmtree(tmp_path / "exports" / "r")
    again = _run(tmp_path, corpus, "r", monkeypatch, shard_docs=1, shard_target_bytes=1 << 20)
    assert again["this_attempt"]["processed_docs"] == len(removed)
    ids = [r["id"] for r in read_jsonl(run / mf.RESULTS)]
    assert ids == [r["id"] for r in _docs(2500, "x")] and first["total"] == again["total"] == 2500
    progress = json.loads((run / mf.PROGRESS).read_text())
    assert (progress["state"], progress["done"]) == ("done", 2500)


def test_a_version_1_run_folder_is_refused_with_a_clear_message(tmp_path):
    from batch._attempt import plan_or_reuse
    from batch._config import BatchConfig
    from batch.runfiles import Manifest
    from classify.errors import InputError

    corpus = _jsonl(tmp_path / "c.jsonl", _docs(3))
    with pytest.raises(InputError, match=r"batch old was started by an earlier docpilot \(run folder manifest_version 1"):
        plan_or_reuse(BatchConfig(), corpus, "jsonl", Manifest(shards=[], corpus={}), "old")


def test_the_instant_engine_cannot_be_selected_by_config_or_cli():
    from batch.driver import parse_args

    assert "instant" not in (ROOT / "config" / "docpilot.json").read_text().lower()
    with pytest.raises(SystemExit):
        parse_args(["--engine", "instant"])
    for folder in ("batch", "classify", "serve", "adapters"):  # no product code names it: only bench/ and tests pass it
        for path in (ROOT / folder).rglob("*.py"):
            assert "from bench" not in path.read_text(encoding="utf-8"), path


@pytest.mark.ray
def test_a_batch_past_its_lease_end_says_so_in_progress_and_manifest(instant_ray, tmp_path, monkeypatch):
    corpus = _jsonl(tmp_path / "c.jsonl", _docs(200, "x"))
    _run(tmp_path, corpus, "lease", monkeypatch, extra_args=("--lease-ends", "2020-01-01T00:00:00Z"),
         shard_docs=10, shard_target_bytes=1 << 20)
    run = tmp_path / "runs" / "lease"
    lease = json.loads((run / mf.PROGRESS).read_text())["lease"]
    assert lease["fits"] is False and lease["short"] == "lease: ENDED" and "the lease ENDED" in lease["message"]
    assert mf.read_manifest(run).attempts[-1]["lease_ends_at"] == "2020-01-01T00:00:00+00:00"


def _dropping_actor():
    """An instant actor whose answer for the first shard lacks its last result (a broken engine actor)."""
    from batch._shard_io import ShardOutput
    from bench.instant_engine import InstantEngineActor
    from classify.records import Result

    class DroppingActor(InstantEngineActor):
        def classify(self, shard):
            out = super().classify(shard)
            rows = [Result.from_json(line) for line in out.body.splitlines()]
            return ShardOutput.of(rows[:-1]) if rows[0].id == "d-00000" else out

    return DroppingActor


@pytest.mark.ray
def test_a_shard_whose_returned_ids_differ_from_the_plan_is_never_written(instant_ray, tmp_path, monkeypatch):
    from batch.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from classify.errors import VerificationError

    jsonl = _jsonl(tmp_path / "c.jsonl", _docs(2000))  # large enough for 16-document shards
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "b.json", shard_docs=16, shard_target_bytes=100_000)
    args = parse_args(["--config", str(config), "--corpus", str(jsonl), "--batch-id", "drop", "--skip-pilot-gate", "--no-progress"])
    with pytest.raises(VerificationError, match=r"shard 0: the engine actor returned 15 results whose ids differ from the "
                                                r"planned shard \(16 ids\); nothing written"):
        run_batch(args, _engine_actor=instant_ray.remote(max_restarts=0, max_task_retries=0)(_dropping_actor()))
    assert not mf.shard_path(tmp_path / "runs" / "drop", 0, 2).exists()
    again = run_batch(args, _engine_actor=remote_class())  # the same batch id resumes and finishes exactly once
    assert again["total"] == 2000 and again["accepted"] + again["rejected"] == 2000


def _eager_checking_actor(expected):
    """An instant actor that refuses to classify unless the driver gave it ``engine.enforce_eager == expected``."""
    from bench.instant_engine import InstantEngineActor

    class EagerCheckingActor(InstantEngineActor):
        def __init__(self, model_cfg, engine_cfg, *args, **kwargs):
            super().__init__(model_cfg, engine_cfg, *args, **kwargs)
            self.enforce_eager = engine_cfg.enforce_eager

        def classify(self, shard):
            if self.enforce_eager != expected:
                raise ValueError(f"engine.enforce_eager {self.enforce_eager!r}, expected {expected!r}")
            return super().classify(shard)

    return EagerCheckingActor


@pytest.mark.ray
@pytest.mark.parametrize("n_docs, compiler, expected", [(1000, "g++", "auto"), (4100, "g++", False), (4100, None, "auto")],
                         ids=["short", "long", "long-no-compiler"])
def test_auto_turns_torch_compile_on_only_for_enough_documents_per_engine(instant_ray, tmp_path, monkeypatch, n_docs, compiler,
                                                                         expected):
    from batch.driver import parse_args, run_batch
    from classify.engineconfig import COMPILE_MIN_DOCS_PER_ENGINE

    monkeypatch.setattr("batch._attempt.cpp_compiler", lambda: compiler)  # none: "auto" stays eager on CPU engines

    assert 1000 < COMPILE_MIN_DOCS_PER_ENGINE <= 4100 // 2  # one actor below the line, two above it
    jsonl = _jsonl(tmp_path / "c.jsonl", _docs(n_docs))
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "b.json", cpu_actors=2)
    args = parse_args(["--config", str(config), "--corpus", str(jsonl), "--batch-id", f"eager-{n_docs}-{compiler or 'none'}".replace("+", "p"),
                       "--skip-pilot-gate", "--no-progress"])
    actor = instant_ray.remote(max_restarts=0, max_task_retries=0)(_eager_checking_actor(expected))
    summary = run_batch(args, _engine_actor=actor)
    assert summary["this_attempt"]["enforce_eager"] == expected and summary["this_attempt"]["actors"] == 2
    assert summary["this_attempt"]["compiled"] == ["none"]  # the stand-in engine has no vLLM to ask
    assert summary["accepted"] == n_docs
