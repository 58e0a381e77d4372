"""A corpus edited while the batch runs (issue 28, item 7): each shard's bytes are checked against the plan when read.

The plan records the sha256 of each JSONL/CSV shard's byte range and of each Parquet row group (and footer). A
same-length edit of one row after planning (the fingerprint cannot see it: the plan was already made) is an
input error naming the shard when that shard is read, before it is classified. The real case runs the batch
driver over real Ray (instant stand-in engine), edits the corpus once the plan is made, and checks that the batch
stops resumable (exit 3), that no export exists, and that a rerun with the corpus restored finishes exactly once.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_corpus_edit_ray.py``.
"""

from __future__ import annotations

import pytest

from batch.corpus.plan import plan_corpus
from batch.runfiles import Shard
from classify.config.batch import CorpusConfig
from classify.errors import InputError
from tests.support.corpora import edit_in_place, numbered_texts, write_texts

N = 400


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("row", [0, 217, N - 1], ids=["first-row", "middle-row", "last-row"])
def test_a_same_length_edit_after_planning_stops_the_shard_that_holds_it(tmp_path, suffix, row):
    path = tmp_path / f"c{suffix}"
    write_texts(path, numbered_texts(N))
    plan = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 40, 1 << 20)
    assert plan.shards[0].bytes_sha256 or plan.reading.get("row_group_sha256")
    edit_in_place(path, row)
    key = row + 1 if suffix == ".jsonl" else row  # JSONL shards count lines from 1

    def touched(shard) -> bool:
        first, last = shard.row, shard.row + shard.n_rows - 1
        if suffix == ".parquet":  # the row group holding the row is re-hashed: every shard reading it stops
            return first // 50 <= row // 50 <= last // 50
        return first <= key <= last

    assert sum(map(touched, plan.shards)) >= 1
    for shard in plan.shards:
        if touched(shard):
            with pytest.raises(InputError, match="changed while the batch ran: .*nothing of it was classified"):
                plan.read_shard(shard, 10_000)
        else:  # the other shards still read
            assert len(plan.read_shard(shard, 10_000)) == shard.n_docs


def test_a_plan_without_shard_hashes_is_still_read(tmp_path):
    """A run folder planned by an earlier docpilot has no ``bytes_sha256``: read as before (resumes keep working)."""
    path = tmp_path / "c.jsonl"
    write_texts(path, numbered_texts(N))
    plan = plan_corpus(CorpusConfig(path=str(path)), 40, 1 << 20)
    plan.shards = [Shard.of({k: v for k, v in s.to_json().items() if k != "bytes_sha256"}) for s in plan.shards]
    assert all(s.bytes_sha256 is None for s in plan.shards)
    assert sum(len(plan.read_shard(s, 10_000)) for s in plan.shards) == N
