"""A corpus edited while the batch runs (issue 28, item 7): each shard's bytes are checked against the plan when read.

The plan records the sha256 of each JSONL/CSV shard's byte range and of each Parquet row group (and footer). A
same-length edit of one row after planning (the fingerprint cannot see it: the plan was already made) is an
input error naming the shard when that shard is read, before it is classified. The real case runs the batch
driver over real Ray (instant stand-in engine), edits the corpus once the plan is made, and checks that the batch
stops resumable (exit 3), that no export exists, and that a rerun with the corpus restored finishes exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch import manifest as mf
from batch._config import CorpusConfig
from batch.corpus import plan_corpus
from classify.errors import InputError

N = 400


def _texts() -> list[str]:
    return [f"Shares rose {i:04d} points today." for i in range(N)]


def _write(path: Path, texts: list[str]) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"id": f"d-{i:04d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    elif path.suffix == ".csv":
        path.write_text("id,text\n" + "".join(f"d-{i:04d},{t}\n" for i, t in enumerate(texts)))
    else:
        pq.write_table(pa.table({"id": [f"d-{i:04d}" for i in range(N)], "text": texts}), path, row_group_size=50,
                       compression="none")


def _edit_in_place(path: Path, row: int) -> None:
    """Change one character of row ``row``'s text, same length (what a same-length edit does to the bytes)."""
    old = f"Shares rose {row:04d}".encode()
    data = path.read_bytes()
    at = data.index(old)
    with path.open("r+b") as fh:
        fh.seek(at)
        fh.write(b"Shares ROSE")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("row", [0, 217, N - 1], ids=["first-row", "middle-row", "last-row"])
def test_a_same_length_edit_after_planning_stops_the_shard_that_holds_it(tmp_path, suffix, row):
    path = tmp_path / f"c{suffix}"
    _write(path, _texts())
    plan = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 40, 1 << 20)
    assert plan.shards[0].get("bytes_sha256") or plan.reading.get("row_group_sha256")
    _edit_in_place(path, row)
    key = row + 1 if suffix == ".jsonl" else row  # JSONL shards count lines from 1

    def touched(shard) -> bool:
        first, last = shard["row"], shard["row"] + shard["n_rows"] - 1
        if suffix == ".parquet":  # the row group holding the row is re-hashed: every shard reading it stops
            return first // 50 <= row // 50 <= last // 50
        return first <= key <= last

    assert sum(map(touched, plan.shards)) >= 1
    for shard in plan.shards:
        if touched(shard):
            with pytest.raises(InputError, match="changed while the batch ran: .*nothing of it was classified"):
                plan.read_shard(shard, 10_000)
        else:  # the other shards still read
            assert len(plan.read_shard(shard, 10_000)) == shard["n_docs"]


def test_a_plan_without_shard_hashes_is_still_read(tmp_path):
    """A run folder planned by an earlier docpilot has no ``bytes_sha256``: read as before (resumes keep working)."""
    path = tmp_path / "c.jsonl"
    _write(path, _texts())
    plan = plan_corpus(CorpusConfig(path=str(path)), 40, 1 << 20)
    for shard in plan.shards:
        shard.pop("bytes_sha256")
    assert sum(len(plan.read_shard(s, 10_000)) for s in plan.shards) == N


@pytest.mark.ray
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_corpus_edited_during_a_real_batch_stops_it_resumable_and_no_export_claims_it(instant_ray, tmp_path, monkeypatch,
                                                                                          suffix):
    from test_batch_helpers import write_config

    import batch._attempt as attempt_mod
    from batch.driver import parse_args, run_batch
    from bench.instant_engine import remote_class

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    corpus = tmp_path / f"c{suffix}"
    _write(corpus, _texts())
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
        _edit_in_place(corpus, N - 5)
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
