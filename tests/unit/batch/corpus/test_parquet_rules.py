"""Parquet held to the JSONL/CSV id and text rules (issue 28, item 9).

* ids: strings and integers only; any other type (binary, float, NaN, -0.0, boolean, list, timestamp, decimal)
  is a rejected row ``<file>#row<index>`` whose reason names the type (was: its Python repr, accepted);
* text that is not UTF-8 in a string column is a rejected row naming the byte (was: exit 1 and a traceback
  on every rerun), an id that is not UTF-8 a rejected row with its id escaped;
* a damaged file (bad page header) is a clear input error naming the row group, at plan and through the CLI;
* reads go in bounded batches with a cursor: each row is decoded once whatever the row-group size.

All through the real readers the batch plan and shard reader use (:func:`tests.support.corpora.read_corpus` is
:func:`batch.corpus.plan.plan_corpus` + :meth:`batch.corpus.plan.CorpusPlan.read_shard`).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batch.corpus.scan as _corpus_scan
from batch.corpus.plan import plan_corpus
from classify.config.batch import CorpusConfig
from classify.errors import InputError
from tests.support.corpora import read_corpus

ROOT = Path(__file__).resolve().parents[4]

ODD_IDS = [
    ("binary", pa.array([b"doc-000", b"doc-001"], pa.binary()), "binary b'doc-000'"),
    ("float", pa.array([1.0, 2.5], pa.float64()), "floating point number 1.0"),
    ("nan", pa.array([float("nan"), 3.0], pa.float64()), "floating point number nan"),
    ("negative-zero", pa.array([-0.0, 1.0], pa.float32()), "floating point number -0.0"),
    ("bool", pa.array([True, False], pa.bool_()), "boolean True"),
    ("list", pa.array([[1, 2], [3]], pa.list_(pa.int64())), "list [1, 2]"),
    ("timestamp", pa.array([dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 3)], pa.timestamp("s")), "timestamp"),
    ("decimal", pa.array([Decimal("1.50"), Decimal("2.00")], pa.decimal128(5, 2)), "decimal Decimal('1.50')"),
    ("struct", pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int64())])), "struct {'a': 1}"),
]


@pytest.mark.parametrize(("kind", "ids", "words"), ODD_IDS, ids=[k for k, _, _ in ODD_IDS])
def test_parquet_ids_of_other_types_are_rejected_rows_naming_the_type(tmp_path, kind, ids, words):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ids, "text": ["Shares rose.", "The match ended."]}), path)
    docs = read_corpus(CorpusConfig(path=str(path), id_column="id"), 10_000).docs
    assert [d.id for d in docs] == ["c.parquet#row0", "c.parquet#row1"]  # one row each, never the repr
    assert all(d.text is None and d.reject_reason.startswith("`id` must be a string or an integer, got ") for d in docs)
    assert words in docs[0].reject_reason, docs[0].reject_reason


def test_parquet_string_and_integer_ids_are_kept(tmp_path):
    for ids, want in ((pa.array(["a", "b"]), ["a", "b"]), (pa.array([7, -3], pa.int32()), ["7", "-3"]),
                      (pa.array(["x", "y"], pa.large_string()), ["x", "y"]),
                      (pa.array(["p", "q"]).dictionary_encode(), ["p", "q"])):
        path = tmp_path / "c.parquet"
        pq.write_table(pa.table({"id": ids, "text": ["Shares rose.", "The match ended."]}), path)
        docs = read_corpus(CorpusConfig(path=str(path), id_column="id"), 10_000).docs
        assert [d.id for d in docs] == want and all(d.reject_reason is None for d in docs)


def _not_utf8(values: list[bytes], large: bool = False) -> pa.Array:
    """A string column holding bytes that are not UTF-8 (Arrow writes them to Parquet unchecked, as other writers do)."""
    return pa.array(values, pa.large_binary() if large else pa.binary()).view(pa.large_string() if large else pa.string())


@pytest.mark.parametrize("large", [False, True], ids=["string", "large_string"])
def test_parquet_text_not_utf8_is_a_rejected_row_naming_the_byte(tmp_path, large):
    path = tmp_path / "c.parquet"
    texts = [b"Shares rose.", b"caf\xe9 au lait", b"\xff\xfe bad start", b"ok \xed\xa0\x80 cesu", b"The match ended."]
    ids = _not_utf8([b"a", b"b", b"c", b"d", b"bad-\xff-id"], large)
    pq.write_table(pa.table({"id": ids, "text": _not_utf8(texts, large)}), path, row_group_size=2)
    docs = {d.id: d for d in read_corpus(CorpusConfig(path=str(path), id_column="id"), 10_000).docs}
    assert docs["a"].reject_reason is None and docs["a"].text == "Shares rose."
    assert docs["b"].reject_reason.startswith("not valid UTF-8: byte 0xe9 at offset 3")
    assert docs["c"].reject_reason.startswith("not valid UTF-8: byte 0xff at offset 0")
    assert docs["d"].reject_reason.startswith("not valid UTF-8")
    bad_id = "bad-\\udcff-id"  # the undecodable byte escaped, stable, writable
    assert docs[bad_id].text is None and docs[bad_id].reject_reason.startswith("id is not valid Unicode")
    assert len(docs) == 5


def _damaged(tmp_path: Path, groups: int = 3) -> tuple[Path, int]:
    path = tmp_path / "c.parquet"
    n = 30
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(n)], "text": [f"text number {i} " * 20 for i in range(n)]}),
                   path, row_group_size=n // groups, compression="none")
    meta = pq.ParquetFile(path).metadata
    bad_group = groups - 1
    offset = meta.row_group(bad_group).column(1).data_page_offset
    with path.open("r+b") as fh:  # overwrite the text column's page header of the last row group
        fh.seek(offset)
        fh.write(b"\xff" * 24)
    return path, bad_group


def test_a_bad_page_header_is_an_input_error_naming_the_row_group(tmp_path):
    path, group = _damaged(tmp_path)
    with pytest.raises(InputError, match=f"cannot read Parquet row group {group} \\(rows 20..29\\)"):
        plan_corpus(CorpusConfig(path=str(path), id_column="id"), 1000, 1 << 20)


def test_batch_cli_on_a_damaged_parquet_exits_3_without_a_traceback(tmp_path):
    path, group = _damaged(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "docpilot", "batch", "--corpus", str(path), "--batch-id", "damaged",
                           "--skip-pilot-gate", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ.copy())
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert f"cannot read Parquet row group {group}" in proc.stderr and "Traceback" not in proc.stderr


def _corpus(path: Path, n: int, group_rows: int) -> None:
    pq.write_table(pa.table({"id": [f"d{i:06d}" for i in range(n)], "text": [f"Document {i} about markets." for i in range(n)]}),
                   path, row_group_size=group_rows)


def test_rows_are_decoded_once_whatever_the_row_group_size(tmp_path, monkeypatch):
    decoded = []
    real = _corpus_scan.iter_parquet_batches

    def counting(*args, **kwargs):
        for row0, batch in real(*args, **kwargs):
            decoded.append(batch.num_rows)
            yield row0, batch

    monkeypatch.setattr(_corpus_scan, "iter_parquet_batches", counting)
    n = 20_000
    single, small = tmp_path / "single.parquet", tmp_path / "small.parquet"
    _corpus(single, n, n)
    _corpus(small, n, 500)
    results = {}
    for path in (single, small):
        decoded.clear()
        plan = plan_corpus(CorpusConfig(path=str(path), id_column="id"), 500, 1 << 20)
        planned = sum(decoded)
        decoded.clear()
        docs = [d for s in plan.shards for d in plan.read_shard(s, 10_000)]
        assert len(plan.shards) >= 32
        assert planned == n and sum(decoded) <= n + 2048, (path.name, sum(decoded))  # each row decoded once
        results[path.name] = [(d.id, d.text) for d in docs]
    assert results["single.parquet"] == results["small.parquet"]
    plan = plan_corpus(CorpusConfig(path=str(single), id_column="id"), 500, 1 << 20)
    shard = plan.shards[-1]
    again = [d.id for d in plan.read_shard(shard, 10_000)]  # a retry of an earlier shard starts again, same rows
    assert again == [d.id for d in plan.read_shard(shard, 10_000)]
    first = plan.read_shard(plan.shards[0], 10_000)
    assert first[0].id == "d000000" and len(first) == plan.shards[0].n_docs

