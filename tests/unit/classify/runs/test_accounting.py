"""The one accounting check (classify.runs.accounting) and the typed result record at the file boundary."""

from __future__ import annotations

import json

import pytest

from classify.errors import VerificationError
from classify.records import Result
from classify.runs.accounting import Ledger, account, duplicates, recount_mismatches
from classify.runs.records import read_results


def _ok(i: str, category: str = "tech") -> Result:
    return Result(id=i, status="accepted", category=category, score=0.9, n_tokens=5)


def _rej(i: str, reason: str | None = "binary content: 12 NUL bytes") -> Result:
    return Result(id=i, status="rejected", reason=reason, n_tokens=0)


def test_every_input_id_exactly_once_is_balanced_and_counted():
    acc = account([_ok("a"), _rej("b"), _ok("c", "sport")], ["a", "b", "c"], ["tech", "sport"])
    assert acc.ok and acc.balanced and acc.problems() == []
    led = acc.ledger
    assert (led.total, led.accepted, led.rejected, led.n_tokens) == (3, 2, 1, 10)
    assert led.counts()["by_category"] == {"tech": 1, "sport": 1}
    assert led.counts()["reject_reasons"] == {"binary content": 1}
    assert dict(led.per_category) == {"tech": 1, "sport": 1}


def test_each_broken_invariant_is_named_in_order():
    bad_status = Result.model_construct(id="s", status="maybe", category=None, score=None, reason=None,
                                        input_sha256="", n_chars=0, n_tokens=0)
    results = [_ok("a"), _ok("a"), _ok("x", "weather"), _rej("r", None), bad_status]
    acc = account(results, ["a", "m", "r", "s"], ["tech"])
    assert not acc.ok and not acc.balanced
    assert acc.problems() == [
        "duplicate ids in results: ['a']",
        "unknown ids in results: ['x']",
        "ids missing from results: ['m'] (1 in all)",
        "id x: accepted with category 'weather' not in ['tech']",
        "id r: rejected without a reason",
        "id s: status 'maybe' (allowed: accepted, rejected)",
    ]
    assert (acc.ledger.bad_category, acc.ledger.no_reason, acc.ledger.bad_status) == (["x"], ["r"], ["s"])
    assert acc.missing_ids == ["m"] and duplicates(["b", "a", "b", "a", "c"]) == ["a", "b"]


def test_a_count_mismatch_is_not_balanced_even_without_bad_rows():
    acc = account([_ok("a")], ["a", "a"], ["tech"])  # one result for an id given twice
    assert not acc.balanced and acc.problems() == []


def test_ledger_keeps_at_most_max_problems():
    led = Ledger(["tech"], max_problems=3)
    for i in range(10):
        led.add(_rej(str(i), None))
    assert led.rejected == 10 and len(led.problems) == 3 and led.no_reason == ["0", "1", "2"]


def test_recount_mismatches_names_each_key():
    assert recount_mismatches({"total": 3, "accepted": 9}, {"total": 3, "accepted": 8}, ("total", "accepted")) == [
        "summary.json `accepted` is 9 but the copied results give 8"]


def test_result_row_is_the_stored_json_and_reads_back(tmp_path):
    r = _ok("a")
    assert list(r.row()) == ["id", "status", "category", "score", "reason", "input_sha256", "n_chars", "n_tokens",
                             "n_doc_tokens", "n_windows", "truncated"]  # review, dropped: only when set
    line = json.dumps(r.row(), sort_keys=True, ensure_ascii=False)
    assert Result.from_json(line) == r and Result.of(r.row()) == r and Result.of(r) is r
    path = tmp_path / "results.jsonl"
    path.write_text(line + "\n" + '{"id": "b", "status": "maybe", "extra": 1}\n\n')
    back = read_results(path)
    assert back[0] == r and (back[1].id, back[1].status, back[1].reason) == ("b", "maybe", None)
    path.write_text(line + "\n{not json\n")
    with pytest.raises(VerificationError, match=r"results.jsonl:2: not valid JSON"):
        read_results(path)
