"""Odd inputs (issue 12, items 5, 6, 7, 11): each kind is a rejected row with a reason or a clear refusal.

* ids and texts that cannot be written as UTF-8 (lone surrogates, from a JSON ``\\ud83d`` escape
  or from raw surrogate bytes) never crash the run: the row is rejected, its id escaped stably;
* ids of another JSON type than string or integer are rejected rows naming the type;
* text with no visible character (zero-width, format, filler characters) is an empty document,
  while right-to-left and emoji text is still classified;
* UTF-16 and UTF-32 files are refused (or rejected) naming the encoding and the ``iconv`` fix.

Pilot, batch and serve share the readers, so each kind goes through the batch corpus reader,
the pilot input reader and the HTTP app (fake engine, in process).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from batch.corpus.shard import jsonl_documents
from batch.corpus.tabular import iter_csv
from batch.layout import scan_done, write_shard
from batch.pilot.inputs import read_pilot_set
from batch.runfiles import Manifest
from classify.config.batch import CorpusConfig
from classify.config.sections import ClassifyConfig
from classify.documents.read import document_from_text
from classify.documents.text import check_bytes, check_text
from classify.errors import InputError
from classify.records import Result
from classify.runs.records import read_jsonl, write_json_atomic, write_jsonl_atomic
from tests.support.corpora import planned_shards, read_corpus
from tests.support.serve_app import AUTH
from tests.support.serve_app import make_client as make_client  # noqa: F401  (fixture)
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture)

# --- item 5: lone surrogates ---------------------------------------------------------------

# (raw JSON line for the id, the id as recorded): JSON escapes and raw surrogate bytes (json.loads
# decodes bytes with surrogatepass, so both reach the reader as a lone surrogate).
SURROGATE_IDS = [
    (b'"\\ud83d"', "\\ud83d"),
    (b'"a\\udc00b"', "a\\udc00b"),
    (b'"tail-\\udfff"', "tail-\\udfff"),
    (b'"\\ude00\\ud83d"', "\\ude00\\ud83d"),  # a pair in the wrong order is two lone halves
    (b'"raw-\xed\xa0\xbd"', "raw-\\ud83d"),  # CESU-style bytes of U+D83D
]
SURROGATE_TEXTS = [b'"\\ud83d"', b'"Shares rose \\ud83d today."', b'"ok \\udfff"', b'"x\\udc80y"', b'"raw \xed\xb0\x80 bytes"']


def _jsonl(path, lines):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _surrogate_corpus(tmp_path):
    lines = [b'{"id": "good-1", "text": "Shares rose."}']
    lines += [b'{"id": %s, "text": "fine text"}' % raw for raw, _ in SURROGATE_IDS]
    lines += [b'{"id": "bad-text-%d", "text": %s}' % (i, raw) for i, raw in enumerate(SURROGATE_TEXTS)]
    lines += [b'{"id": "good-2", "text": "The match ended 2-1."}']
    return _jsonl(tmp_path / "c.jsonl", lines)


def test_lone_surrogate_ids_and_texts_are_rejected_rows_with_safe_stable_ids(tmp_path):
    path = _surrogate_corpus(tmp_path)
    corpus = read_corpus(CorpusConfig(path=str(path)), 1000)
    by_id = {d.id: d for d in corpus.docs}
    assert len(corpus.docs) == corpus.input_rows == 2 + len(SURROGATE_IDS) + len(SURROGATE_TEXTS)
    for _, recorded in SURROGATE_IDS:
        doc = by_id[recorded]
        assert doc.text is None and doc.reject_reason.startswith("id is not valid Unicode: lone surrogate U+D")
        assert f"recorded as {recorded!r}" in doc.reject_reason
    for i in range(len(SURROGATE_TEXTS)):
        doc = by_id[f"bad-text-{i}"]
        assert doc.text is None and doc.reject_reason.startswith("text is not valid Unicode: lone surrogate U+D"), doc.reject_reason
    assert by_id["good-1"].reject_reason is None and by_id["good-2"].reject_reason is None
    for doc in corpus.docs:  # nothing that reaches a writer holds a surrogate
        (doc.id + (doc.reject_reason or "") + doc.source).encode("utf-8")
    again = read_corpus(CorpusConfig(path=str(path)), 1000)
    assert [d.id for d in again.docs] == [d.id for d in corpus.docs] and again.fingerprint == corpus.fingerprint


def test_lone_surrogate_rows_go_through_shard_writing_and_resume(tmp_path):
    path = _surrogate_corpus(tmp_path)
    corpus = read_corpus(CorpusConfig(path=str(path)), 1000)
    planned = planned_shards(path, 4, 1000)
    run = tmp_path / "run"
    for shard, docs in planned:
        rows = [(Result.rejected(d, d.reject_reason) if d.reject_reason else
                 Result(id=d.id, status="accepted", category="tech", score=0.5)) for d in docs]
        write_shard(run, shard.index, rows)
    manifest = Manifest(manifest_version=2, shards=[s for s, _ in planned], config={"classify": {"categories": ["tech"]}})
    done = scan_done(run, manifest)  # re-reads every shard and checks its ids against the plan
    assert sum(counts["docs"] for counts in done.values()) == len(corpus.docs) and len(done) == len(planned)
    for path in (run / "shards").glob("*/*.jsonl"):
        path.read_bytes().decode("utf-8")  # strict: valid UTF-8


@pytest.mark.parametrize("value", ["\ud83d", "a\udc00b", "x\udfff\ud800y", "ok \U0001f44d \ud83d"])
def test_json_writers_never_raise_on_lone_surrogates_and_round_trip(tmp_path, value):
    row = {"id": value, "reason": f"because {value}", value: 1}
    write_jsonl_atomic(tmp_path / "r.jsonl", [row, {"id": "plain"}])
    write_json_atomic(tmp_path / "s.json", row)
    (tmp_path / "r.jsonl").read_bytes().decode("utf-8")
    (tmp_path / "s.json").read_bytes().decode("utf-8")
    assert read_jsonl(tmp_path / "r.jsonl") == [row, {"id": "plain"}]
    assert json.loads((tmp_path / "s.json").read_text(encoding="utf-8")) == row


def test_surrogate_file_names_in_a_folder_get_safe_ids(tmp_path):
    names = [b"\xff.txt", b"caf\xe9.txt", b"ok.txt"]  # not UTF-8: os decodes them with surrogateescape
    for name in names:
        (tmp_path / name.decode("utf-8", "surrogateescape")).write_text("Shares rose.")
    docs = read_corpus(CorpusConfig(path=str(tmp_path)), 1000).docs
    assert sorted(d.id for d in docs) == ["\\udcff.txt", "caf\\udce9.txt", "ok.txt"]
    for doc in docs:
        (doc.id + (doc.reject_reason or "") + doc.source).encode("utf-8")
        assert (doc.reject_reason is None) == (doc.id == "ok.txt")


# --- item 6: ids of the wrong JSON type ----------------------------------------------------

WRONG_ID_TYPES = [("true", "boolean true"), ("false", "boolean false"), ("1.5", "number 1.5"), ("1.0", "number 1.0"),
                  ("1e3", "number 1000.0"), ("NaN", "number NaN"), ("null", "null"), ("[1]", "array"),
                  ('{"a": 1}', "object")]


def test_ids_that_are_neither_strings_nor_integers_are_rejected_naming_the_type(tmp_path):
    lines = [b'{"id": %s, "text": "Shares rose."}' % raw.encode() for raw, _ in WRONG_ID_TYPES]
    lines += [b'{"id": 7, "text": "an integer id"}', b'{"id": "s", "text": "a string id"}']
    corpus = read_corpus(CorpusConfig(path=str(_jsonl(tmp_path / "c.jsonl", lines))), 1000)
    docs = list(corpus.docs)
    assert [d.id for d in docs] == [f"c.jsonl#L{n}" for n in range(1, len(WRONG_ID_TYPES) + 1)] + ["7", "s"]
    for doc, (_, named) in zip(docs, WRONG_ID_TYPES, strict=False):
        assert doc.text is None
        assert doc.reject_reason.startswith(f"`id` must be a string or an integer, got {named}"), doc.reject_reason
    assert docs[-2].reject_reason is None and docs[-1].reject_reason is None


# --- item 7: text with no visible character --------------------------------------------------

INVISIBLE = ["\u200b", "\u200b" * 50, "\u200b \u200c\n\u200d", "\u2060\ufeff\u2061", "\u00ad", "\u3164\u3164",
             "\u115f\u1160", "\ufe0f\ufe00", "\U000e0041\U000e0001\U000e007f", "\u202e\u202c\u2066\u2069",
             "\u061c\u200e\u200f", "\x7f\x85\xa0", "\u2028\u200b\u2029\u3000", "\uffa0\u180e", "\U0001d173\U0001bca0"]
VISIBLE = ["مرحبا بالعالم", "\u200fשלום עולם\u200f", "\u202bسلام\u202c", "\U0001f44d", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
           "\U0001f1ec\U0001f1e7", "\u2764\ufe0f", "\u200bword\u200b", "漢字", "\u0915\u094d\u0937"]


@pytest.mark.parametrize("text", INVISIBLE, ids=[f"invisible{i}" for i in range(len(INVISIBLE))])
def test_text_without_a_visible_character_is_an_empty_document(text):
    got, reason = check_text(text)
    assert got is None and reason.startswith("empty document: no visible character"), reason
    assert check_bytes(text.encode(), 1000) == (None, reason)
    visible = VISIBLE[len(text) % len(VISIBLE)]  # right-to-left and emoji text is still classified
    assert check_text(visible) == (visible, None)


def test_invisible_texts_are_rejected_in_a_jsonl_and_a_folder_corpus(tmp_path):
    lines = [json.dumps({"id": f"inv-{i}", "text": t}).encode() for i, t in enumerate(INVISIBLE)]
    lines += [json.dumps({"id": f"vis-{i}", "text": t}).encode() for i, t in enumerate(VISIBLE)]
    corpus = read_corpus(CorpusConfig(path=str(_jsonl(tmp_path / "c.jsonl", lines))), 1000)
    reasons = {d.id: d.reject_reason for d in corpus.docs}
    assert all(reasons[f"inv-{i}"].startswith("empty document: no visible character") for i in range(len(INVISIBLE)))
    assert all(reasons[f"vis-{i}"] is None for i in range(len(VISIBLE)))
    folder = tmp_path / "dir"
    folder.mkdir()
    for i, text in enumerate(INVISIBLE[:5] + VISIBLE[:5]):
        (folder / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    docs = read_corpus(CorpusConfig(path=str(folder)), 1000).docs
    assert [d.reject_reason is not None for d in docs] == [True] * 5 + [False] * 5


# --- item 11: UTF-16 / UTF-32 files ----------------------------------------------------------

WIDE = [  # (codec, BOM written by hand or None, name in the message, iconv source encoding)
    ("utf-16-le", b"\xff\xfe", "UTF-16 LE (byte-order mark FF FE)", "UTF-16"),
    ("utf-16-be", b"\xfe\xff", "UTF-16 BE (byte-order mark FE FF)", "UTF-16"),
    ("utf-32-le", b"\xff\xfe\x00\x00", "UTF-32 LE (byte-order mark FF FE 00 00)", "UTF-32"),
    ("utf-32-be", b"\x00\x00\xfe\xff", "UTF-32 BE (byte-order mark 00 00 FE FF)", "UTF-32"),
    ("utf-16-le", b"", "UTF-16 LE without a byte-order mark", "UTF-16LE"),
    ("utf-16-be", b"", "UTF-16 BE without a byte-order mark", "UTF-16BE"),
]
WIDE_IDS = [f"{codec}{'-bom' if bom else ''}" for codec, bom, _, _ in WIDE]


@pytest.mark.parametrize(("codec", "bom", "name", "iconv"), WIDE, ids=WIDE_IDS)
def test_wide_csv_and_jsonl_are_refused_naming_the_encoding_and_the_fix(tmp_path, codec, bom, name, iconv):
    csv_path = tmp_path / "c.csv"
    csv_path.write_bytes(bom + "id,text\na,Shares rose.\n".encode(codec))
    with pytest.raises(InputError, match=rf"c\.csv is {re.escape(name)}, not UTF-8; convert it: iconv -f {iconv} -t UTF-8 "):
        list(iter_csv(csv_path, 1000))
    jsonl_path = tmp_path / "c.jsonl"
    jsonl_path.write_bytes(bom + (json.dumps({"id": "a", "text": "Shares rose."}) + "\n").encode(codec))
    with pytest.raises(InputError, match=rf"c\.jsonl is {re.escape(name)}, not UTF-8; convert it: iconv -f {iconv} -t UTF-8 "):
        read_corpus(CorpusConfig(path=str(jsonl_path)), 1000)


def test_docpilot_batch_refuses_a_utf16_corpus_before_the_config_model_or_ray(tmp_path, monkeypatch):
    """The corpus encoding is checked where the corpus is located: before the model resolves or the pilot gate."""
    import batch.run.driver as driver

    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes((json.dumps({"id": "a", "text": "Shares rose."}) + "\n").encode("utf-16"))

    def no_model(*a, **k):
        raise AssertionError("the model was resolved for a UTF-16 corpus")

    monkeypatch.setattr(driver, "resolve_model", no_model)
    config = Path(__file__).resolve().parents[4] / "config" / "docpilot.json"
    args = driver.parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", "wide",
                              "--skip-pilot-gate"])
    with pytest.raises(InputError, match=r"c\.jsonl is UTF-16 LE \(byte-order mark FF FE\), not UTF-8; convert it"):
        driver.run_batch(args)


@pytest.mark.parametrize(("codec", "bom", "name", "iconv"), WIDE, ids=WIDE_IDS)
def test_a_wide_plain_document_is_rejected_naming_the_encoding(codec, bom, name, iconv):
    text, reason = check_bytes(bom + "Shares rose.".encode(codec), 1000)
    assert text is None
    assert reason == f"not UTF-8: the document is {name}; convert it: iconv -f {iconv} -t UTF-8", reason


def test_utf16_pilot_labels_csv_is_refused_naming_the_encoding(tmp_path):
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "a.txt").write_text("Shares rose.")
    (tmp_path / "labels.csv").write_bytes("id,label\na.txt,business\n".encode("utf-16"))
    with pytest.raises(InputError, match=r"labels\.csv is UTF-16 LE \(byte-order mark FF FE\), not UTF-8; convert it"):
        read_pilot_set(tmp_path, ClassifyConfig(), 1)


# --- the pilot input reader ------------------------------------------------------------------

def test_pilot_reader_rejects_each_odd_kind_and_keeps_labels_on_the_recorded_ids(tmp_path):
    lines = [
        b'{"id": "\\ud83d", "text": "Shares rose.", "label": "reject"}',
        b'{"id": "t", "text": "Shares \\udc00 rose.", "label": "reject"}',
        b'{"id": true, "text": "Shares rose.", "label": "reject"}',
        b'{"id": 2.5, "text": "Shares rose.", "label": "reject"}',
        b'{"id": "zw", "text": "\\u200b\\u200c\\u2060", "label": "reject"}',
        b'{"id": "rtl", "text": "\\u0645\\u0631\\u062d\\u0628\\u0627", "label": "business"}',
        b'{"id": "emoji", "text": "\\ud83d\\udc4d great match", "label": "sport"}',
    ]
    docs, labels, *_ = read_pilot_set(_jsonl(tmp_path / "p.jsonl", lines), ClassifyConfig(), len(lines))
    assert [d.id for d in docs] == ["\\ud83d", "t", "p.jsonl#L3", "p.jsonl#L4", "zw", "rtl", "emoji"]
    assert [d.reject_reason is None for d in docs] == [False] * 5 + [True] * 2
    assert docs[2].reject_reason.startswith("`id` must be a string or an integer, got boolean true")
    assert labels["\\ud83d"] == "reject" and labels["emoji"] == "sport"
    folder = tmp_path / "dir"
    (folder / "documents").mkdir(parents=True)
    (folder / "documents" / "\udcff.txt").write_text("Shares rose.")
    (folder / "labels.json").write_bytes(b'{"\\udcff.txt": "reject"}')
    docs, labels, *_ = read_pilot_set(folder, ClassifyConfig(), 1)
    assert [d.id for d in docs] == ["\\udcff.txt"] and labels == {"\\udcff.txt": "reject"}


# --- serve: the real app over a fake engine --------------------------------------------------

@pytest.fixture
def client(request):
    return request.getfixturevalue("make_client")(skip_pilot_gate=True)


def _post(client, docs_json: bytes):
    body = b'{"documents": [%s]}' % docs_json
    return client.post("/v1/classify", content=body, headers={**AUTH, "Content-Type": "application/json"})


@pytest.mark.parametrize(("bad", "rec_id", "prefix"), [
    (b'{"id": "s1", "text": "\\ud83d"}', "s1", "text is not valid Unicode: lone surrogate U+D83D at character 0"),
    (b'{"id": "s2", "text": "Shares \\udfff rose"}', "s2", "text is not valid Unicode: lone surrogate U+DFFF at character 7"),
    (b'{"id": "s3", "text": "\\ude00\\ud83d"}', "s3", "text is not valid Unicode: lone surrogate U+DE00 at character 0"),
    (b'{"id": "\\ud83d", "text": "fine"}', "\\ud83d", "id is not valid Unicode: lone surrogate U+D83D at character 0"),
    (b'{"id": "x\\udc00", "text": "fine"}', "x\\udc00", "id is not valid Unicode: lone surrogate U+DC00 at character 1"),
    (b'{"id": "zw", "text": "\\u200b\\u200b"}', "zw", "empty document: no visible character"),
    (b'{"id": "hf", "text": "\\u3164 \\ufe0f"}', "hf", "empty document: no visible character"),
], ids=["text-high", "text-low", "text-reversed-pair", "id-high", "id-low", "zero-width", "filler"])
def test_serve_rejects_the_one_odd_document_and_classifies_the_others(client, bad, rec_id, prefix):
    resp = _post(client, b'{"id": "a", "text": "Shares rose."}, %s, {"id": "b", "text": "\\ud83d\\udc4d \\u0645\\u0631"}' % bad)
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["id"] for r in results] == ["a", rec_id, "b"]
    assert [r["status"] for r in results] == ["accepted", "rejected", "accepted"]
    assert results[1]["reason"].startswith(prefix), results[1]["reason"]


def test_serve_request_schema_is_unchanged_and_still_refuses_wrong_types(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]["DocumentIn"]["properties"]
    assert schema["id"] == {"type": "string", "minLength": 1, "maxLength": 512, "title": "Id"}
    assert schema["text"] == {"type": "string", "minLength": 1, "title": "Text"}
    for bad in (b'{"id": true, "text": "x"}', b'{"id": 1.5, "text": "x"}', b'{"id": "a", "text": ""}',
                b'{"id": "\\ud83d", "text": 5}', b'{"id": "' + b"\\ud83d" * 100 + b'", "text": "x"}'):
        resp = _post(client, bad)
        assert resp.status_code == 422, (bad, resp.text)


def test_serve_duplicate_check_uses_the_recorded_ids(client):
    resp = _post(client, b'{"id": "\\ud83d", "text": "a"}, {"id": "\\\\ud83d", "text": "b"}')
    assert resp.status_code == 422 and "duplicate document ids" in resp.json()["error"]["message"]


def test_document_from_text_is_the_one_rule_for_serve(tmp_path):
    start = time.perf_counter()
    doc = document_from_text("\ud83d", "x" * 100_000 + "\ud83d", 1_000_000)
    assert doc.id == "\\ud83d" and doc.reject_reason.startswith("id is not valid Unicode")
    assert "text is not valid Unicode: lone surrogate U+D83D at character 100000" in doc.reject_reason
    assert time.perf_counter() - start < 1


def test_a_csv_row_that_is_not_utf8_is_rejected_by_its_byte_offset_and_the_rest_is_read(tmp_path):
    """One bad byte costs its row (rejected, the byte and its offset named), not the whole corpus; a bad header stops."""
    from batch.corpus.tabular import csv_header, iter_csv_rows
    from classify.config.batch import CorpusConfig
    from tests.support.corpora import read_corpus

    bad = tmp_path / "bad.csv"
    bad.write_bytes(b'id,text\na,fine\nb,caf\xe9 latin-1\n"c\xff","two\nlines"\nd,"multi\nline \xe9"\ne,ok\n')
    header, offset = csv_header(bad)
    rows = list(iter_csv_rows(bad, "text", id_column="id", id_prefix="x", offset=offset, first_index=0, max_rows=10, header=header))
    assert [r.error for r in rows] == [
        None,
        "row 1 is not valid UTF-8: byte 0xE9 at byte offset 20 of the file (the file, or this row, is in another "
        "encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)",
        "row 2 is not valid UTF-8: byte 0xFF at byte offset 32 of the file (the file, or this row, is in another "
        "encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)",
        "row 3 is not valid UTF-8: byte 0xE9 at byte offset 61 of the file (the file, or this row, is in another "
        "encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)",
        None,
    ]
    corpus = read_corpus(CorpusConfig(path=str(bad), id_column="id"), 1000)  # the batch's plan and read: every row once
    assert [d.id for d in corpus.docs] == ["a", "b", "c\\udcff", "d", "e"]
    assert [d.text for d in corpus.docs] == ["fine", None, None, None, "ok"]
    assert all(d.reject_reason.startswith(f"row {i} is not valid UTF-8") for i, d in enumerate(corpus.docs[1:4], 1))
    (tmp_path / "head.csv").write_bytes(b"id,t\xe9xt\na,fine\n")
    with pytest.raises(InputError, match=r"head\.csv: cannot read CSV: 'utf-8' codec can't decode byte 0xe9 .*"
                                         r"\(in the line at byte offset 0 of the file\); the file is not UTF-8"):
        csv_header(tmp_path / "head.csv")


def test_a_jsonl_line_that_is_not_utf8_is_rejected_by_its_byte_and_keeps_its_id(tmp_path):
    """A stray UTF-16 mark or a latin-1 byte costs its line, named (was: "not valid JSON: Expecting value"), and the
    line keeps its id when it parses with the bad bytes escaped, as a CSV row does; the plan and the read agree."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "fine"}\n\xff\xfe{"id": "b", "text": "x"}\n{"id": "c", "text": "caf\xe9"}\n'
                    b'{"id": "d\xff", "text": "ok"}\n{"id": "e", "text": "ok"}\n{"id": "c", "text": "again \xe9"}\n')
    hint = "(the file, or this line, is in another encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)"
    docs = [d for _, d in jsonl_documents(bad, bad.name, 1, bad.read_bytes(), 1000)]  # an actor's read of a shard
    assert [(d.id, d.reject_reason) for d in docs] == [
        ("a", None),
        ("b", f"line 2 is not valid UTF-8: byte 0xFF at byte 0 of the line {hint}"),  # a stray mark: skipped for the id
        ("c", f"line 3 is not valid UTF-8: byte 0xE9 at byte 24 of the line {hint}"),
        ("d\\udcff", f"line 4 is not valid UTF-8: byte 0xFF at byte 9 of the line {hint}"),
        ("e", None),
        ("c", f"line 6 is not valid UTF-8: byte 0xE9 at byte 27 of the line {hint}"),
    ]
    corpus = read_corpus(CorpusConfig(path=str(bad)), 1000)  # the batch's plan and read: every id once
    assert [d.id for d in corpus.docs] == ["a", "b", "c", "d\\udcff", "e"]
    assert [d.text for d in corpus.docs] == ["fine", None, None, None, "ok"]
    assert "line 2 is not valid UTF-8" in corpus.docs[1].reject_reason
    assert "duplicate" in corpus.docs[2].reject_reason  # the repeated id: one rejected row naming its occurrences


def test_a_jsonl_line_that_is_not_utf8_keeps_its_label_and_a_first_line_mark(tmp_path):
    """The label of such a line still counts (pilot: a planned reject; batch: labelled rows), like a CSV row's;
    a UTF-8 byte-order mark on line 1 does not cost that line its id."""
    from batch.corpus.labels import iter_labels
    from batch.corpus.plan import plan_corpus
    from batch.pilot.inputs import read_pilot_set

    bad = tmp_path / "lab.jsonl"
    bad.write_bytes(b'\xef\xbb\xbf{"id": "b1", "text": "caf\xe9", "label": "reject"}\n'
                    b'{"id": "ok", "text": "fine", "label": "sport"}\n'
                    b'\xff\xfe{"id": "m", "text": "x", "label": "reject"}\n')
    docs, labels, *_ = read_pilot_set(bad, ClassifyConfig(), 3)
    assert [(d.id, d.text is None) for d in docs] == [("b1", True), ("ok", False), ("m", True)]
    assert "byte 0xE9 at byte 28 of the line" in docs[0].reject_reason  # counted in the line's bytes, mark included
    assert labels == {"b1": "reject", "ok": "sport", "m": "reject"}
    plan = plan_corpus(CorpusConfig(path=str(bad)), 16, 1 << 20, bad, 1000)
    assert list(iter_labels(plan, "label")) == [("b1", "reject"), ("ok", "sport"), ("m", "reject")]


def test_a_stray_utf16_mark_at_the_start_of_a_utf8_jsonl_costs_only_its_line(tmp_path):
    """FF FE then `{"` cannot be UTF-16 (no zero beside the ASCII): not refused as UTF-16 (whose iconv would
    garble the file), the first line is one rejected row; a real UTF-16 file is still refused."""
    stray = tmp_path / "stray.jsonl"
    stray.write_bytes(b'\xff\xfe{"id": "s1", "text": "one"}\n{"id": "s2", "text": "two"}\n')
    docs = read_corpus(CorpusConfig(path=str(stray)), 1000).docs
    assert [(d.id, d.text) for d in docs] == [("s1", None), ("s2", "two")]
    assert docs[0].reject_reason.startswith("line 1 is not valid UTF-8: byte 0xFF at byte 0 of the line")
    wide = tmp_path / "wide.jsonl"
    wide.write_bytes('{"id": "w", "text": "x"}\n'.encode("utf-16"))  # with its mark
    with pytest.raises(InputError, match=r"UTF-16 LE \(byte-order mark FF FE\), not UTF-8"):
        read_corpus(CorpusConfig(path=str(wide)), 1000)


def test_csv_rows_of_the_wrong_width_are_rejected_rows_never_a_silent_cut(tmp_path):
    """A row with more fields than the header (an unquoted comma) lost text silently, one without its text column
    was rejected as an empty document; a short row that has its text is read, the missing trailing fields empty."""
    path = tmp_path / "c.csv"
    path.write_text("doc_id,text,category\n"
                    "ok,The striker scored twice.,sport\n"
                    "m1,too,many,fields,here\n"
                    "m2\n"
                    "short,Shares fell 5% after the results.\n", encoding="utf-8")
    corpus = read_corpus(CorpusConfig(path=str(path), id_column="doc_id"), 1000)
    reasons = {d.id: d.reject_reason for d in corpus.docs}
    assert list(reasons) == ["ok", "m1", "m2", "short"]  # every row once, in order
    assert reasons["ok"] is None and reasons["short"] is None
    assert reasons["m1"] == ("row 1 has 5 fields where the header has 3 (doc_id, text, category): an unquoted comma, "
                             "or a missing `text`?")
    assert reasons["m2"].startswith("row 2 has 1 field where the header has 3")
