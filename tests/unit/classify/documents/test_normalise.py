"""What carries no text is dropped before tokenising (issue 55, item 2): :func:`classify.documents.text.normalise_text`.

Pure text, no tokenizer: the ids and the engine are in ``tests/unit/classify/engine/test_prompt.py`` and
``tests/engine/test_padding_engine.py``.
"""

from __future__ import annotations

import pytest

from classify.documents.text import normalise_text

ARTICLE = "Shares rose 3% on Monday.\n\nThe bank said  profits were up.\r\n\r\nAnalysts agreed."


@pytest.mark.parametrize("tail", ["\n" * 300, "\u200b" * 500, " " * 40, "\r\n" * 50, "\n\u200b \u2060\ufeff\u00ad\n" * 100,
                                  "\u3164\u115f\ufe0f" * 30, "\x01\x7f\t" * 20, "\u2028\u2029" * 40])
def test_a_tail_or_head_of_padding_leaves_the_same_text(tail):
    for padded in (ARTICLE + tail, tail + ARTICLE, ARTICLE + "\n" + tail):
        got = normalise_text(padded)
        assert got.text == ARTICLE, repr(padded[:40])
        assert got.note() and got.note().endswith("before tokenising")


def test_ordinary_layout_is_kept_as_it_is_and_not_reported():
    for text in (ARTICLE, ARTICLE + "\n", "\n" + ARTICLE + "\r\n\r\n", "a\tb  c\n\nd", "Ünïcödé – “quotes” 😀 and 中文"):
        got = normalise_text(text)
        assert got.text == text.strip() and (got.invisible, got.padding) == (0, 0) and got.note() is None, repr(text)


def test_padding_inside_a_text_collapses_to_layout_and_is_counted():
    got = normalise_text("one" + "\n" * 300 + "two" + " " * 50 + "three\n \n \n \nfour")
    assert got.text == "one\n\ntwo three\n\nfour"
    assert (got.invisible, got.padding) == (0, 298 + 49 + 5)
    assert got.note() == "352 whitespace characters of padding before tokenising"


def test_invisible_characters_inside_words_are_dropped():
    got = normalise_text("sp\u200bo\u200crt\u00ad \U0001F468\u200d\U0001F469 caf\u2060e\u0301")
    assert got.text == "sport \U0001F468\U0001F469 cafe\u0301" and got.invisible == 5 and got.padding == 0
    assert got.note() == "5 invisible characters (zero-width, format or control) before tokenising"


def test_a_text_of_padding_alone_becomes_empty():
    got = normalise_text("\u200b\n" * 100)
    assert got.text == "" and got.invisible == 100 and got.padding == 100
