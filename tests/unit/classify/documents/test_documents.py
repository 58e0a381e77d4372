"""Document text rules: every bad document becomes a rejected row with a reason; nothing is dropped.

How a corpus's files, lines and rows become documents is tested where the batch reads them:
``tests/unit/batch/corpus/test_corpus_reading.py``.
"""

from __future__ import annotations

import pytest

from classify.documents.text import check_bytes, check_text


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


def test_check_bytes_given_the_decoded_text_answers_as_if_it_decoded_the_bytes():
    """``document_from_text`` passes the string it encoded; the answer (text, reason) is the same as decoding."""
    samples = ["plain text", "\ufeffwith a mark", "\ufeff", "\ufeff\ufeffdouble", "  \n\t ", "", "\x01\x02ab",
               "\x07" * 5 + "x" * 5, "a\x0bb\x0cc\x1fd" * 3, "caf\u00e9 \u4e2d\u6587 \U0001f600", "\u200b\u200d",
               "\ufeff\x01\x01\x01x", "tab\tnew\nline\rcr", "\x00nul"]
    for text in samples:
        raw = text.encode("utf-8")
        assert check_bytes(raw, 1000, text) == check_bytes(raw, 1000), repr(text)
        if raw and b"\x00" not in raw:
            decoded = raw.decode("utf-8-sig")
            assert check_bytes(raw, 1000) == check_text(decoded), repr(text)
