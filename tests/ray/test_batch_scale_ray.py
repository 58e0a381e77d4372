"""Batch at scale: streaming plan, content-sized shards, duplicates across shards, Parquet in and out, resume.

The run-level tests use the bench-only instant engine (``bench/instant_engine.py``) through the
real Ray pool and real run folders; the rest need neither Ray nor an engine.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/corpus/test_batch_scale.py``.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from batch import layout as mf
from batch.run.export import check_export
from tests.support.corpora import news_rows, write_config, write_jsonl


def _run(tmp_path, corpus, batch_id, monkeypatch, corpus_fields=None, extra_args=(), **batch_fields):
    from batch.run.driver import parse_args, run_batch
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


def test_parquet_and_jsonl_batches_give_the_same_results_and_parquet_equals_jsonl(local_ray, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from classify.runs.export import verify_export
    from classify.runs.records import read_jsonl

    rows = news_rows(300) + [{"id": "d-00007", "text": "dup"}, {"id": "blank", "text": "   "}]
    jsonl = write_jsonl(tmp_path / "c.jsonl", rows)
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
    assert check_export(export) == []
    # a changed Parquet row in the copy is found by the re-check
    bad = pq.read_table(export / mf.RESULTS_PARQUET).to_pylist()
    bad[5]["category"] = "sport"
    os.chmod(export / mf.RESULTS_PARQUET, 0o644)
    pq.write_table(pa.Table.from_pylist(bad, schema=pq.read_schema(export / mf.RESULTS_PARQUET)), export / mf.RESULTS_PARQUET)
    assert [p for p in check_export(export) if "parquet" in p] == [
        f"results.parquet row 5 differs from results.jsonl: {bad[5]} != {rb[5]}"]  # the row is named


def test_resume_with_half_the_shards_is_exactly_once_and_folders_stay_small(local_ray, tmp_path, monkeypatch):
    from classify.runs.records import read_jsonl

    # the fan-out at a tenth of its size: 100 shard files a folder (the driver writes every shard file), 250 shards
    monkeypatch.setattr(mf, "SHARDS_PER_FOLDER", 100)
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(250, "x"))
    first = _run(tmp_path, corpus, "r", monkeypatch, shard_docs=1, shard_target_bytes=1 << 20)
    run = tmp_path / "runs" / "r"
    manifest = mf.read_manifest(run)
    assert manifest.manifest_version == 2 and len(manifest.shards) == 250
    for folder, _, files in os.walk(run):
        assert len(files) <= mf.SHARDS_PER_FOLDER, folder  # 250 shard files in 3 folders
    assert sorted(os.listdir(run / mf.SHARDS)) == ["000", "001", "002"]
    removed = manifest.shards[::2]
    for s in removed:
        mf.shard_path(run, s.index).unlink()
    for name in (mf.RESULTS, mf.RESULTS_PARQUET, mf.SUMMARY):
        (run / name).unlink()
    import shutil

    shutil.rmtree(tmp_path / "exports" / "r")
    again = _run(tmp_path, corpus, "r", monkeypatch, shard_docs=1, shard_target_bytes=1 << 20)
    assert again["this_attempt"]["processed_docs"] == len(removed)
    ids = [r["id"] for r in read_jsonl(run / mf.RESULTS)]
    assert ids == [r["id"] for r in news_rows(250, "x")] and first["total"] == again["total"] == 250
    progress = json.loads((run / mf.PROGRESS).read_text())
    assert (progress["state"], progress["done"]) == ("done", 250)


def test_a_batch_past_its_lease_end_says_so_in_progress_and_manifest(local_ray, tmp_path, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(200, "x"))
    _run(tmp_path, corpus, "lease", monkeypatch, extra_args=("--lease-ends", "2020-01-01T00:00:00Z"),
         shard_docs=10, shard_target_bytes=1 << 20)
    run = tmp_path / "runs" / "lease"
    lease = json.loads((run / mf.PROGRESS).read_text())["lease"]
    assert lease["fits"] is False and lease["short"] == "lease: ENDED" and "the lease ENDED" in lease["message"]
    attempt = mf.read_manifest(run).attempts[-1]
    assert attempt["lease_ends_at"] == "2020-01-01T00:00:00+00:00"
    assert attempt["config"] == str((tmp_path / "lease.json").resolve())  # what a resume hint repeats


def _dropping_actor():
    """An instant actor whose answer for the first shard lacks its last result (a broken engine actor)."""
    from batch.corpus.shard import ShardOutput
    from bench.instant_engine import InstantEngineActor
    from classify.records import Result

    class DroppingActor(InstantEngineActor):
        def classify(self, shard):
            out = super().classify(shard)
            rows = [Result.from_json(line) for line in out.body.splitlines()]
            return ShardOutput.of(rows[:-1]) if rows[0].id == "d-00000" else out

    return DroppingActor


def test_a_shard_whose_returned_ids_differ_from_the_plan_is_never_written(local_ray, tmp_path, monkeypatch):
    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from classify.errors import VerificationError

    jsonl = write_jsonl(tmp_path / "c.jsonl", news_rows(2000))  # large enough for 16-document shards
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "b.json", shard_docs=16, shard_target_bytes=100_000)
    args = parse_args(["--config", str(config), "--corpus", str(jsonl), "--batch-id", "drop", "--skip-pilot-gate", "--no-progress"])
    with pytest.raises(VerificationError, match=r"shard 0: the engine actor returned 15 results whose ids differ from the "
                                                r"planned shard \(16 ids\); nothing written"):
        run_batch(args, _engine_actor=local_ray.remote(max_restarts=0, max_task_retries=0)(_dropping_actor()))
    assert not mf.shard_path(tmp_path / "runs" / "drop", 0).exists()
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


@pytest.mark.parametrize("n_docs, compiler, expected", [(1000, "g++", "auto"), (4100, "g++", False), (4100, None, "auto")],
                         ids=["short", "long", "long-no-compiler"])
def test_auto_turns_torch_compile_on_only_for_enough_documents_per_engine(local_ray, tmp_path, monkeypatch, n_docs, compiler,
                                                                         expected):
    from batch.run.driver import parse_args, run_batch
    from classify.config.engine import COMPILE_MIN_DOCS_PER_ENGINE

    monkeypatch.setattr("batch.run.attempt.cpp_compiler", lambda: compiler)  # none: "auto" stays eager on CPU engines

    assert 1000 < COMPILE_MIN_DOCS_PER_ENGINE <= 4100 // 2  # one actor below the line, two above it
    jsonl = write_jsonl(tmp_path / "c.jsonl", news_rows(n_docs))
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "b.json", cpu_actors=2)
    args = parse_args(["--config", str(config), "--corpus", str(jsonl), "--batch-id", f"eager-{n_docs}-{compiler or 'none'}".replace("+", "p"),
                       "--skip-pilot-gate", "--no-progress"])
    actor = local_ray.remote(max_restarts=0, max_task_retries=0)(_eager_checking_actor(expected))
    summary = run_batch(args, _engine_actor=actor)
    assert summary["this_attempt"]["enforce_eager"] == expected and summary["this_attempt"]["actors"] == 2
    assert summary["this_attempt"]["compiled"] == ["none"]  # the stand-in engine has no vLLM to ask
    assert summary["accepted"] == n_docs


def test_a_corpus_given_on_the_command_line_names_its_rows_by_its_own_file(local_ray, tmp_path, monkeypatch):
    """Issue 42 item 5: `make batch CORPUS=news.csv` with the shipped config (`corpus.id_prefix: bbc-test`, no id
    column) names its rows `news-NNNN` (the file's stem), not `bbc-test-NNNN`; the configured corpus keeps its prefix."""
    import csv

    from classify.runs.records import read_jsonl

    def write_csv(path, n):
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([[r["text"]] for r in news_rows(n)])
        return path

    shipped = write_csv(tmp_path / "test.csv", 5)
    fields = {"path": str(shipped), "format": "auto", "id_column": None, "id_prefix": "bbc-test"}
    _run(tmp_path, write_csv(tmp_path / "news.csv", 3), "other", monkeypatch, corpus_fields=fields)
    assert [r["id"] for r in read_jsonl(tmp_path / "runs" / "other" / mf.RESULTS)] == ["news-0000", "news-0001", "news-0002"]
    _run(tmp_path, shipped, "shipped", monkeypatch, corpus_fields=fields)
    assert [r["id"] for r in read_jsonl(tmp_path / "runs" / "shipped" / mf.RESULTS)][:2] == ["bbc-test-0000", "bbc-test-0001"]


def _terminal(stream: str) -> list[str]:
    """``stream`` as a terminal shows it: a carriage return goes back to the start of the line, text overwrites."""
    lines, line, col = [], [], 0
    for ch in stream:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            line[col:col + 1] = [ch]
            col += 1
    return lines + (["".join(line).rstrip()] if line else [])


def test_the_steady_rate_is_in_the_bar_progress_json_summary_and_the_final_lines(local_ray, tmp_path, monkeypatch,
                                                                                capfd):
    """Issue 42 item 4: docs/s and tokens/s after the first shard on the bar, in progress.json and summary.json and the
    last lines; the bar ends with one 100% line (as a terminal shows it), not two at different rates."""
    from batch.run.driver import main as batch_main
    from bench.instant_engine import remote_class

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "c.json", shard_docs=50, shard_target_bytes=4000)
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(400))
    import batch.run.driver as driver

    real = driver.run_batch
    monkeypatch.setattr(driver, "run_batch", lambda options: real(options, _engine_actor=remote_class()))
    import batch.run.attempt as attempt

    real_bar = attempt.progress_bar

    def every_update_drawn(*args, **kwargs):  # as on a real lot, where shards are seconds apart (tqdm's mininterval)
        bar = real_bar(*args, **kwargs)
        bar.mininterval, bar.miniters, bar.dynamic_miniters = 0, 1, False
        return bar

    monkeypatch.setattr(attempt, "progress_bar", every_update_drawn)
    assert batch_main(["--config", str(config), "--corpus", str(corpus), "--batch-id", "s", "--skip-pilot-gate"]) == 0
    out = capfd.readouterr()
    screen = _terminal(out.err)
    full = [line for line in screen if "400/400" in line]
    assert len(full) == 1 and "steady" in full[0] and "tokens/s" in full[0], screen[-8:]
    drawn = [part for part in re.split(r"[\r\n]", out.err) if "400/400" in part]  # as a log file holds it
    assert len(drawn) == 1, drawn
    summary = json.loads((tmp_path / "runs" / "s" / mf.SUMMARY).read_text())["this_attempt"]
    progress = json.loads((tmp_path / "runs" / "s" / mf.PROGRESS).read_text())
    assert summary["steady_docs_per_s"] > 0 and summary["steady_tokens_per_s"] is not None  # the instant engine: 0 tokens
    assert progress["steady_docs_per_s"] == summary["steady_docs_per_s"]
    assert f"steady rate after the first shard: {summary['steady_docs_per_s']} docs/s" in out.out
