"""Document reading: every bad document becomes a rejected row with a reason; nothing is dropped."""

from __future__ import annotations

import json

import pytest

from batch.corpus.tabular import iter_csv
from classify.documents.read import collapse_duplicates, iter_directory, iter_jsonl
from classify.documents.text import check_bytes
from classify.errors import InputError


@pytest.mark.parametrize(
    ("raw", "text", "reason"),
    [
        (b"Shares rose.", "Shares rose.", None),
        ("Price \u00c2\u00a3100".encode(), "Price \u00c2\u00a3100", None),  # mojibake is still text
        (b"", None, "empty document (0 bytes)"),
        (b"  \n\t ", None, "empty document: only whitespace"),
        (b"ab\x00cd", None, "binary content: contains NUL bytes (not a text document)"),
        (b"caf\xe9", None, "not valid UTF-8: byte 0xe9 at offset 3 (re-encode the file as UTF-8)"),
        (b"\x01\x02\x03\x04abc", None, "binary content: 57% control characters"),
        (b"x" * 11, None, "over size limit: 11 bytes > classify.max_doc_bytes 10"),
    ],
    ids=["text", "mojibake", "empty", "whitespace", "nul", "latin1", "control", "oversize"],
)
def test_check_bytes(raw, text, reason):
    assert check_bytes(raw, 10 if len(raw) == 11 else 1000) == (text, reason)


def test_directory_ids_are_relative_paths_and_labels_are_skipped(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "labels.json").write_text("{}")
    (tmp_path / ".hidden").write_text("x")
    docs = list(iter_directory(tmp_path, 1000))
    assert [d.id for d in docs] == ["b.txt", "sub/a.txt"]
    assert docs[0].reject_reason == "empty document (0 bytes)" and docs[1].text == "alpha"


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
    docs = [d for d, _ in iter_jsonl(path, 1000)]
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
    docs = collapse_duplicates([d for d, _ in iter_jsonl(path, 1000)])
    assert [d.id for d in docs] == ["x", "y"]
    assert docs[0].reject_reason.startswith("duplicate id: given 2 times (c.jsonl#L1, c.jsonl#L3")
    assert docs[1].reject_reason is None


def test_bbc_csv_reads_every_row(bbc_dir):
    docs = [d for d, _ in iter_csv(bbc_dir / "test.csv", 200_000, id_column=None, id_prefix="bbc-test")]
    assert len(docs) == 334 and docs[42].id == "bbc-test-0042"
    assert all(d.reject_reason is None for d in docs)


def test_jsonl_path_must_stay_inside_the_input_folder(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    path = tmp_path / "in" / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "path": p}) for i, p in [("up", "../secret.txt"), ("abs", str(tmp_path / "secret.txt"))]))
    docs = [d for d, _ in iter_jsonl(path, 1000)]
    assert [d.text for d in docs] == [None, None]
    assert docs[0].reject_reason == "`path` '../secret.txt' leaves the folder of c.jsonl (only relative paths inside it)"


def test_check_bytes_given_the_decoded_text_answers_as_if_it_decoded_the_bytes():
    """``document_from_text`` passes the string it encoded; the answer (text, reason) is the same as decoding."""
    from classify.documents.text import check_bytes, check_text

    samples = ["plain text", "\ufeffwith a mark", "\ufeff", "\ufeff\ufeffdouble", "  \n\t ", "", "\x01\x02ab",
               "\x07" * 5 + "x" * 5, "a\x0bb\x0cc\x1fd" * 3, "caf\u00e9 \u4e2d\u6587 \U0001f600", "\u200b\u200d",
               "\ufeff\x01\x01\x01x", "tab\tnew\nline\rcr", "\x00nul"]
    for text in samples:
        raw = text.encode("utf-8")
        assert check_bytes(raw, 1000, text) == check_bytes(raw, 1000), repr(text)
        if raw and b"\x00" not in raw:
            decoded = raw.decode("utf-8-sig")
            assert check_bytes(raw, 1000) == check_text(decoded), repr(text)
