"""A named batch id with no run under the runs folder says that a new batch starts with it."""

from __future__ import annotations

import logging

import pytest

from batch.run import driver
from classify.errors import InputError


def test_an_unknown_batch_id_says_a_new_batch_starts(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setattr(driver, "run_batch", lambda options: (_ for _ in ()).throw(InputError("stop here")))
    with caplog.at_level(logging.INFO, logger="docpilot.batch"), pytest.raises(InputError):
        driver.main(["--batch-id", "bk-new"])
    assert f"no batch 'bk-new' under {tmp_path}: starting a new batch with that id" in caplog.text
