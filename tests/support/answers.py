"""Comparing two engines' answers for the same documents: exact in float32, by clear margin in bfloat16.

Shared by the tests that classify the same documents twice through different engine instances,
batch compositions or compile modes (dead-engine batch vs the session engine, compiled vs eager,
the server's mixed-adapter batches).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest


def score_tolerance(model_cfg) -> float:
    """Absolute tolerance between the scores of the same document classified in different batches.

    float32 engines agree to rounding (2e-3). In bfloat16 the products of a batch depend on its
    shape and on which requests share it (oneDNN picks other kernels and accumulation orders; AMX on
    Xeons): measured on a 2-core Xeon with AMX, the same document's score moved by 0.019 and 0.033
    between a LoRA request alone and beside base-model requests, and by 0.031 between two batch
    compositions, so 0.06 there. The category must still match exactly where the margin is clear,
    which is what catches an answer attributed to the wrong adapter or a shard's rows shifted.
    """
    from classify.engine.args import compute_dtype

    return 2e-3 if compute_dtype(model_cfg) == "float32" else 0.06


def _field(answer: Any, key: str) -> Any:
    return answer[key] if isinstance(answer, Mapping) else getattr(answer, key)


def assert_same_answers(want: Iterable[Any], got: Iterable[Any], tol: float, min_clear: int) -> int:
    """Assert that ``got`` answers every document of ``want`` as ``want`` does, within ``tol``.

    Every id once in both, the same status for each; a document without a score (rejected) keeps its
    category; a category whose reference score is at least ``0.5 + tol`` (a margin no rounding can
    flip; every scored document when ``tol < 0.01``, i.e. float32) must be the same with a score
    within ``tol``; a near tie may change category but, where it does not, the score stays within ``tol``.

    Args:
        want, got: :class:`classify.records.Result` objects or result rows (dicts) with ``id``,
            ``status``, ``category`` and ``score`` (probability in [0, 1] or ``None``).
        tol: absolute score tolerance (:func:`score_tolerance`).
        min_clear: at least this many documents must have a clear margin (else the check proves little).

    Returns:
        How many documents had a clear margin.
    """
    want_by_id = {_field(a, "id"): a for a in want}
    got_list = list(got)
    assert sorted(_field(a, "id") for a in got_list) == sorted(want_by_id), "ids differ"
    clear = 0
    for answer in got_list:
        doc_id = _field(answer, "id")
        ref = want_by_id[doc_id]
        assert _field(answer, "status") == _field(ref, "status"), doc_id
        ref_score, score = _field(ref, "score"), _field(answer, "score")
        if ref_score is None:
            assert _field(answer, "category") == _field(ref, "category"), doc_id
        elif tol < 0.01 or ref_score >= 0.5 + tol:
            clear += 1
            assert _field(answer, "category") == _field(ref, "category"), (doc_id, ref_score, score)
            assert score == pytest.approx(ref_score, abs=tol), (doc_id, ref_score, score)
        elif _field(answer, "category") == _field(ref, "category"):
            assert score == pytest.approx(ref_score, abs=tol), (doc_id, ref_score, score)
    assert clear >= min_clear, f"only {clear} clear answers to compare (need {min_clear})"
    return clear
