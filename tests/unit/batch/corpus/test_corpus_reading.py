"""Reading a corpus as the batch and the pilot do (:func:`tests.support.corpora.read_corpus`: the batch plan, then
its shards read): every bad document becomes a rejected row with a reason; nothing is dropped."""

from __future__ import annotations

import json

import pytest

from batch.corpus.tabular import iter_csv
from classify.config.batch import CorpusConfig
from classify.errors import InputError
from tests.support.corpora import read_corpus


def test_folder_ids_are_relative_paths_and_hidden_files_are_skipped(tmp_path):
    """A folder corpus is every file in it but hidden ones (``batch.corpus.scan.walk_files``), a labels file too."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "labels.json").write_text("{}")
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("x")
    docs = read_corpus(CorpusConfig(path=str(tmp_path)), 1000).docs
    assert [d.id for d in docs] == ["b.txt", "labels.json", "sub/a.txt"]
    assert docs[0].reject_reason == "empty document (0 bytes)" and docs[2].text == "alpha"


def test_jsonl_bad_lines_are_accounted_for(tmp_path):
    (tmp_path / "doc.txt").write_text("from a file")
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "a", "text": "hello"}),
        "{broken",
        json.dumps({"text": "no id"}),
        json.dumps({"id": "b", "path": "doc.txt"}),
        json.dumps({"id": "c", "text": 5}),
        json.dumps({"id": "d"}),
        "",
    ]))
    docs = read_corpus(CorpusConfig(path=str(path)), 1000).docs
    assert [d.id for d in docs] == ["a", "c.jsonl#L2", "c.jsonl#L3", "b", "c", "d"]
    assert docs[1].reject_reason.startswith("line 2 is not valid JSON")
    assert docs[2].reject_reason == "line 3 has no `id` (string or integer)"
    assert docs[3].text == "from a file"
    assert docs[4].reject_reason == "`text` must be a string, got int"
    assert docs[5].reject_reason == "record has neither `text` nor `path`"


def test_csv_generated_ids_are_stable(tmp_path):
    path = tmp_path / "test.csv"
    path.write_text("text,category\nfirst,business\nsecond,tech\n")
    ids = [d.id for d, _ in iter_csv(path, 1000, id_column=None, id_prefix="bbc-test")]
    assert ids == ["bbc-test-0000", "bbc-test-0001"]
    assert [d.id for d, _ in iter_csv(path, 1000, id_column=None, id_prefix="bbc-test")] == ids
    with pytest.raises(InputError, match=r"text column 'body' not in header \['text', 'category'\]"):
        list(iter_csv(path, 1000, text_column="body"))
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty.csv: the file is empty: a CSV corpus starts with a header row naming its text column \('text'\)"):
        list(iter_csv(empty, 1000))


def test_csv_with_an_unclosed_quote_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text('text,category\nfine,tech\n"unterminated,tech\nfoo,bar\nbaz,qux\n')
    with pytest.raises(InputError, match=r"broken\.csv: malformed CSV in the record starting at line 3: unexpected end of data \(an unclosed quote"):
        list(iter_csv(path, 1000, id_column=None))


def test_duplicates_collapse_to_one_rejected_row_naming_each_occurrence(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in [("x", "one"), ("y", "two"), ("x", "three")]))
    corpus = read_corpus(CorpusConfig(path=str(path)), 1000)
    assert [d.id for d in corpus.docs] == ["x", "y"] and corpus.duplicate_rows == 1
    assert corpus.docs[0].reject_reason.startswith("duplicate id: given 2 times (c.jsonl#L1, c.jsonl#L3")
    assert corpus.docs[1].reject_reason is None


def test_bbc_csv_reads_every_row(bbc_dir):
    docs = [d for d, _ in iter_csv(bbc_dir / "test.csv", 200_000, id_column=None, id_prefix="bbc-test")]
    assert len(docs) == 334 and docs[42].id == "bbc-test-0042"
    assert all(d.reject_reason is None for d in docs)


def test_jsonl_path_must_stay_inside_the_input_folder(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    path = tmp_path / "in" / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "path": p}) for i, p in [("up", "../secret.txt"), ("abs", str(tmp_path / "secret.txt"))]))
    docs = read_corpus(CorpusConfig(path=str(path)), 1000).docs
    assert [d.text for d in docs] == [None, None]
    assert docs[0].reject_reason == "`path` '../secret.txt' leaves the folder of c.jsonl (only relative paths inside it)"
