"""``bench/long_documents.py``'s accuracy at 95% coverage (the engine part runs in ``make bench``)."""

from __future__ import annotations

from bench.long_documents import accuracy_at_coverage
from classify.records import Result


def _r(i: int, category: str, score: float | None) -> Result:
    return Result(id=str(i), status="accepted" if score is not None else "rejected", category=category, score=score,
                  reason=None if score is not None else "empty document")


def test_accuracy_at_95_coverage_drops_the_lowest_scored_five_percent():
    labels = {str(i): "sport" for i in range(40)}
    rows = [_r(i, "sport", 0.9) for i in range(37)] + [_r(37, "tech", 0.95), _r(38, "tech", 0.2), _r(39, "tech", 0.1)]
    # 38 of 40 kept (ceil(0.95 x 40)): the two lowest, both wrong, go to review; the confident wrong one stays
    assert accuracy_at_coverage(rows, labels) == round(37 / 38, 4)
    assert accuracy_at_coverage(rows, labels, 1.0) == round(37 / 40, 4)
    assert accuracy_at_coverage([_r(0, None, None)], {"0": "sport"}) is None
