"""The corpus-scale transfer and merge paths: raw JSONL shards parsed in the actor, shard files sent back as
bytes, and the Arrow merge / export check giving exactly the per-row counts (no engine, no Ray)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.corpus.plan import plan_corpus
from batch.corpus.shard import ShardInput, ShardOutput
from batch.rows import RowMatcher, read_rows, results_schema
from batch.run.merge import Tally
from classify.config.batch import CorpusConfig
from classify.errors import VerificationError
from classify.records import Result
from classify.runs.files import ids_sha256
from classify.runs.records import jsonl_body

CATS = ["business", "sport", "tech"]


def _rows() -> list[Result]:
    return [
        Result(id="a", status="accepted", category="sport", score=0.9, input_sha256="x", n_chars=5, n_tokens=7),
        Result(id="b", status="rejected", reason="empty document: no text", input_sha256="y"),
        Result(id="c\u00e9", status="accepted", category="tech", score=0.4, n_chars=3, n_tokens=4),
        Result(id="d", status="accepted", category="sport", score=1.0, n_chars=2, n_tokens=1),
        Result(id="e", status="rejected", reason="over size limit: 9 bytes", n_tokens=0),
    ]


def _per_row(rows: list[Result]) -> Tally:
    """The per-row rules of :class:`classify.runs.accounting.Ledger` (what the columnar tally must count)."""
    tally = Tally(CATS)
    for r in rows:
        tally.add(r)
    return tally


def _state(t: Tally) -> dict:
    return {"counts": t.counts(), "per_category": list(t.per_category.items()), "problems": t.problems}


def test_arrow_tally_counts_exactly_what_the_row_by_row_ledger_counts():
    rows = _rows()
    body = jsonl_body([r.row() for r in rows])
    lines, table = read_rows(body, review=False)
    assert lines is body and table.num_rows == 5
    fast = Tally(CATS)
    assert fast.add_table(table) == [r.id for r in rows]
    assert _state(fast) == _state(_per_row(rows)) and fast.ids.count == 5
    assert fast.counts()["by_category"] == {"business": 0, "sport": 2, "tech": 1}
    assert fast.counts()["reject_reasons"] == {"empty document": 1, "over size limit": 1}


@pytest.mark.parametrize(("edit", "field", "value"), [
    (lambda b: b.replace(b"\n", b"\n\n", 1), None, None),  # a blank line
    (lambda b: b[:-1], None, None),  # no last newline
    (lambda b: b.replace(b'"id": "a", ', b'"extra": 1, "id": "a", '), None, None),  # an unknown field: dropped
    (lambda b: b.replace(b'"id": "a", ', b""), "id", None),  # no id
    (lambda b: b.replace(b'"n_tokens": 7', b'"n_tokens": null'), "n_tokens", None),
])
def test_a_shard_arrow_refuses_as_it_is_is_read_line_by_line_into_the_same_table(edit, field, value):
    rows = _rows()
    body = jsonl_body([r.row() for r in rows])
    clean_lines, clean = read_rows(body, review=False)
    lines, table = read_rows(edit(body), review=False)
    assert lines.count(b"\n") == 5 and lines.endswith(b"\n") and b"\n\n" not in lines
    if field is None:
        assert table.equals(clean)
    else:
        assert table.column(field)[0].as_py() == value and table.slice(1).equals(clean.slice(1))


@pytest.mark.parametrize(("edit", "words"), [
    (lambda b: b.replace(b"{", b"[", 1), "not valid JSON"),
    (lambda b: b.replace(b'"n_chars": 5', b'"n_chars": "five"'), "not a result row"),
    (lambda b: b.replace(b'"sport"', b'"sp\xffrt"', 1), "not valid JSON: not UTF-8"),  # not a UnicodeDecodeError
    (lambda b: b.replace(b'"id": "a"', b'"id": "\\ud800"', 1), "not a result row"),  # not a UnicodeEncodeError
])
def test_a_line_that_is_no_result_row_is_refused_naming_the_line(edit, words):
    body = jsonl_body([r.row() for r in _rows()])
    with pytest.raises(VerificationError, match=rf"^s.jsonl:1: {words}"):
        read_rows(edit(body), review=False, name="s.jsonl")


def test_a_shard_whose_first_line_is_json_null_is_read_line_by_line_not_crashing_arrow():
    """pyarrow's JSON reader dies (SIGSEGV) on a body whose first value is ``null``: run in a child process."""
    import subprocess
    import sys

    code = ("from batch.rows import read_rows\n"
            "lines, table = read_rows(b'null\\n{\"id\": \"a\", \"status\": \"accepted\", \"category\": \"tech\"}\\n', False)\n"
            "print(table.num_rows, table.column('id').to_pylist())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "2 [None, 'a']\n"), done.stderr


@pytest.mark.parametrize("bad", [
    {"status": "maybe"},
    {"status": "accepted", "category": "movies"},
    {"status": "accepted", "category": None},
    {"status": "rejected", "reason": ""},
    {"status": "rejected", "reason": None, "category": None},
])
def test_a_row_the_accounting_check_flags_is_counted_and_named_as_the_ledger_does(bad):
    rows = [r.row() for r in _rows()]
    rows[3] = {**rows[3], **bad}
    rows[1] = {**rows[1], **bad}
    _, table = read_rows(jsonl_body(rows), review=False)
    tally = Tally(CATS)
    assert tally.add_table(table) == [r["id"] for r in rows]
    expected = _per_row([Result.from_json(json.dumps(r)) for r in rows])
    assert _state(tally) == _state(expected) and len(tally.problems) == 2 and tally.total == 5


def test_review_column_rows_parse_with_the_review_schema():
    rows = [Result(id="a", status="accepted", category="tech", score=0.3, review=True),
            Result(id="b", status="rejected", reason="empty document")]
    body = jsonl_body([r.row() for r in rows])
    assert read_rows(body, review=False)[1].schema.names == results_schema(False).names  # `review` dropped
    _, table = read_rows(body, review=True)
    assert table.column("review").to_pylist() == [True, None]


def test_row_matcher_follows_parquet_batches_across_shard_boundaries(tmp_path):
    rows = [Result(id=f"d{i}", status="accepted", category="tech", score=0.5, n_tokens=i).row() for i in range(10)]
    tables = [read_rows(jsonl_body(rows[a:b]), review=False)[1] for a, b in ((0, 3), (3, 4), (4, 10))]
    path = tmp_path / "r.parquet"
    pq.write_table(pa.concat_tables(tables), path, row_group_size=4)

    def compare(tables_):
        matcher = RowMatcher(pq.ParquetFile(path).iter_batches(batch_size=4))
        return next((d for t in tables_ if (d := matcher.take(t)) is not None), None) or matcher.finish()

    assert compare(tables) is True
    changed = [*rows[:6], {**rows[6], "score": 0.25}, *rows[7:]]
    other = [read_rows(jsonl_body(changed[a:b]), review=False)[1] for a, b in ((0, 3), (3, 4), (4, 10))]
    assert compare(other) == (2, {name: rows[6].get(name) for name in results_schema(False).names})  # nulls included
    assert compare(tables[:2]) is False  # the file has more rows
    assert results_schema(False).names == pq.ParquetFile(path).schema_arrow.names


def test_a_raw_jsonl_shard_parses_to_the_documents_the_driver_would_read(tmp_path):
    corpus = tmp_path / "c.jsonl"
    lines = [{"id": f"d{i}", "text": f"document number {i} " * 20} for i in range(40)]
    lines[5] = {"id": "d3", "text": "a second d3"}  # a duplicated id: folded into its first occurrence
    lines[9] = {"id": "d9", "text": ""}
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    plan = plan_corpus(CorpusConfig(path=str(corpus)), 8, 1 << 20)
    assert len(plan.shards) >= 2
    for shard in plan.shards:
        payload = plan.shard_payload(shard, 10_000)
        assert isinstance(payload, ShardInput) and payload.docs is None and len(payload) == shard.n_docs  # bytes
        assert payload.documents(10_000) == plan.read_shard(shard, 10_000)


@pytest.mark.parametrize("body", [
    b'{"id": "a", "text": "one"}\n{"id": "c",\r"text": "a carriage return as JSON whitespace"}\n{"id": "d", "text": "x"}\n',
    b'{"id": "a", "text": "old Mac line ends"}\r{"id": "b", "text": "two"}\r{"id": "c", "text": "three"}\r',
    bytes(range(256)) * 3 + b"\n" + bytes(range(255, -1, -1)) * 2,  # bytes of every value, \r and \n among them
], ids=["cr-inside-a-record", "cr-line-ends", "binary"])
def test_a_shard_reads_back_the_rows_the_plan_counted_whatever_its_carriage_returns(tmp_path, body):
    """Lines split on \\n only, as the plan pass does: a lone \\r never adds a row, so the ids match the plan."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(body)
    plan = plan_corpus(CorpusConfig(path=str(corpus)), 1, 1 << 20)
    for shard in plan.shards:
        docs = plan.read_shard(shard, 10_000)
        assert len(docs) == shard.n_docs and ids_sha256([d.id for d in docs]) == shard.ids_sha256
        assert plan.shard_payload(shard, 10_000).documents(10_000) == docs
    if body.startswith(b'{"id": "a", "text": "one"}'):
        assert [d.id for s in plan.shards for d in plan.read_shard(s, 10_000)] == ["a", "c", "d"]


def test_shard_output_is_the_shard_file_and_its_counts():
    rows = _rows()
    out = ShardOutput.of(rows)
    assert out.body == jsonl_body([r.row() for r in rows])
    assert (out.n_docs, out.accepted, out.rejected, out.n_tokens) == (5, 3, 2, 12)
    assert out.ids_sha256 == ids_sha256([r.id for r in rows])


@pytest.mark.parametrize("line", [
    b'{"id": "a", "text": "x"}\n', b'{"id": 5, "text": "x"}\n', b'{"id": true, "text": "x"}\n', b'{"id": "", "text": "x"}\n',
    b'{"text": "x"}\n', b'{"id": "\\ud800", "text": "x"}\n', b'{"id": "a\\u00e9", "text": 5}\n', b'[1]\n',
    b'{"id": "a", "path": "f.txt"}\n', b'{"id": 1.0, "text": "x"}\n', b'{"id": 123456789012345678901234567890, "text": "x"}\n',
    b'{"id": "a", "text": "x", "id": "b"}\n', b'not json\n', b'{"id": "a", "text": null}\n', b'{"id": null, "text": "x"}\n',
])
def test_the_plan_pass_fast_id_agrees_with_the_full_reader(line):
    from batch.corpus.scan import fast_line_id
    from classify.documents.read import jsonl_line_id

    fast = fast_line_id(line)
    assert fast is None or fast == jsonl_line_id("c.jsonl", 1, line)[0]
