"""A batch whose every row was rejected for bytes that are not text never exits 0 (issue 55, item 4).

Fast: ``docpilot batch``'s ``main`` with the batch itself stood in by its summary (the summaries are the shapes
:func:`batch.run.merge.merge_results` writes). The compressed corpus refused before planning is tested on moto in
``tests/process/test_corpus_store.py``.
"""

from __future__ import annotations

import gzip

import pytest

from batch.run import driver
from classify.documents.read import document_from_bytes
from classify.errors import InputError


def _summary(accepted: int, reasons: dict[str, int]) -> dict:
    total = accepted + sum(reasons.values())
    return {"batch_id": "b1", "total": total, "accepted": accepted, "rejected": total - accepted, "input_rows": total,
            "duplicate_rows": 0, "reject_reasons": reasons, "run_dir": "/runs/b1", "export_dir": "/exports/b1",
            "this_attempt": {"processed_docs": total, "docs_per_s": 1.0, "wall_s": 1.0}}


@pytest.mark.parametrize("reasons", [{"line 1 is not valid JSON": 1, "line 2 is not valid JSON": 1, "not valid UTF-8": 7},
                                     {"compressed document (gzip)": 3}, {"binary content": 2}])
def test_every_row_rejected_for_bytes_that_are_not_text_exits_3(monkeypatch, tmp_path, reasons):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setattr(driver, "run_batch", lambda args: _summary(0, reasons))
    with pytest.raises(InputError, match=r"batch b1: every one of its \d+ rows was rejected because its bytes are not "
                                         r"text .*nothing was classified\. Is the corpus compressed or binary\?") as err:
        driver.main(["--batch-id", "b1"])
    assert err.value.exit_code == 3


@pytest.mark.parametrize(("accepted", "reasons"), [(1, {"binary content": 5}), (0, {"empty document": 2}), (4, {})])
def test_a_batch_with_text_or_other_rejects_still_exits_0(monkeypatch, tmp_path, capsys, accepted, reasons):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setattr(driver, "run_batch", lambda args: _summary(accepted, reasons))
    assert driver.main(["--batch-id", "b1"]) == 0


def test_a_compressed_document_is_a_rejected_row_naming_the_compression():
    doc = document_from_bytes("a.txt.gz", gzip.compress(b"Shares rose on Monday."), 100_000)
    assert doc.text is None and doc.reject_reason == "compressed document (gzip): decompress it first (gunzip -k)"
