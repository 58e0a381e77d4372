"""A missing corpus's hint is in the user's form (``CORPUS=PATH`` under make)."""

from __future__ import annotations

import pytest

from batch.corpus.plan import locate_corpus
from classify.config.batch import CorpusConfig
from classify.errors import InputError
from classify.usercommand import VIA_MAKE_ENV


def test_a_missing_corpus_hint_is_in_the_make_form(tmp_path, monkeypatch):
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    with pytest.raises(InputError, match=r"pass CORPUS=PATH\)$"):
        locate_corpus(CorpusConfig(path=None), tmp_path / "nonexistent.csv")
    with pytest.raises(InputError, match=r"pass CORPUS=PATH$"):
        CorpusConfig(path=None).resolved_path()
