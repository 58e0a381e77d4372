"""A corpus edited while the batch runs (issue 28, item 7): each shard's bytes are checked against the plan when read.

The plan records the sha256 of each JSONL/CSV shard's byte range and of each Parquet row group (and footer). A
same-length edit of one row after planning (the fingerprint cannot see it: the plan was already made) is an
input error naming the shard when that shard is read, before it is classified. The real case runs the batch
driver over real Ray (instant stand-in engine), edits the corpus once the plan is made, and checks that the batch
stops resumable (exit 3), that no export exists, and that a rerun with the corpus restored finishes exactly once.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/corpus/test_corpus_edit.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch import layout as mf
from classify.errors import InputError
from tests.support.corpora import edit_in_place, numbered_texts, write_texts

N = 400


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_corpus_edited_during_a_real_batch_stops_it_resumable_and_no_export_claims_it(local_ray, tmp_path, monkeypatch,
                                                                                          suffix):
    import batch.run.attempt as attempt_mod
    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from tests.support.corpora import write_config

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    corpus = tmp_path / f"c{suffix}"
    write_texts(corpus, numbered_texts(N))
    original = corpus.read_bytes()
    config = write_config(tmp_path / "b.json", shard_docs=20, shard_target_bytes=100_000)
    data = json.loads(config.read_text())
    data["corpus"]["id_column"] = "id"
    data["corpus"]["label_column"] = None
    config.write_text(json.dumps(data))
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", "edited", "--skip-pilot-gate",
                       "--no-progress"])
    real = attempt_mod.BatchRun.run_shards

    def edit_then_run(self, *a, **k):  # planned; now the corpus is edited in place while the batch runs
        edit_in_place(corpus, N - 5)
        return real(self, *a, **k)

    monkeypatch.setattr(attempt_mod.BatchRun, "run_shards", edit_then_run)
    with pytest.raises(InputError, match="changed while the batch ran") as caught:
        run_batch(args, _engine_actor=remote_class())
    assert caught.value.exit_code == 3
    run_dir = tmp_path / "runs" / "edited"
    manifest = json.loads((run_dir / mf.MANIFEST).read_text())
    assert "changed while the batch ran" in manifest["attempts"][-1]["error"]
    assert not (run_dir / mf.SUMMARY).exists() and not (tmp_path / "exports" / "edited").exists()  # nothing claims it

    monkeypatch.setattr(attempt_mod.BatchRun, "run_shards", real)
    corpus.write_bytes(original)  # restored: the same batch resumes and finishes exactly once
    summary = run_batch(args, _engine_actor=remote_class())
    rows = [json.loads(line) for line in (run_dir / mf.RESULTS).read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"d-{i:04d}" for i in range(N)]
    assert summary["total"] == N and Path(summary["export_dir"]).is_dir()
