"""The accounting check shared by pilot, batch and serve: every input id exactly once, accepted or rejected.

One rule, written once: each input id appears in exactly one :class:`~classify.records.Result`;
an accepted result names one of the allowed categories; a rejected one says why; the status is
``accepted`` or ``rejected``; accepted + rejected = total. :class:`Ledger` counts results one at a
time (a batch streams millions through it); :func:`account` runs it over results held in memory
and adds the id checks (duplicate, unknown, missing). :func:`export_checked` / :func:`recheck_export` are
the one export re-check: the copy's hashes, then the run's accounting recomputed from the copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from classify.errors import VerificationError
from classify.records import Result
from classify.runs.export import export_complete, export_run, verify_export

STATUSES = ("accepted", "rejected")


def duplicates(ids: Iterable[str]) -> list[str]:
    """Ids given more than once, sorted (each named once)."""
    return sorted(i for i, n in Counter(ids).items() if n > 1)


def row_problem(r: Result, categories: Sequence[str]) -> str | None:
    """What is wrong with one result on its own, or ``None``.

    Args:
        r: the result.
        categories: the allowed categories (a list: its repr is part of the message).

    Returns:
        ``"id X: accepted with category 'c' not in [...]"``, ``"id X: rejected without a reason"``,
        ``"id X: status 's' (allowed: accepted, rejected)"`` or ``None``.
    """
    if r.status == "accepted":
        if r.category not in categories:
            return f"id {r.id}: accepted with category {r.category!r} not in {list(categories)}"
    elif r.status == "rejected":
        if not r.reason:
            return f"id {r.id}: rejected without a reason"
    else:
        return f"id {r.id}: status {r.status!r} (allowed: {', '.join(STATUSES)})"
    return None


class Ledger:
    """Counts over results, one at a time, and what is wrong with each (bounded memory).

    Args:
        categories: the allowed categories.
        max_problems: keep at most this many problems and ids per list (``None``: all of them).

    Attributes:
        total, accepted, rejected, n_tokens: counts (``n_tokens``: prompt tokens summed).
        truncated, n_windows: documents with tokens the model did not read (``truncated`` rows), and prompts
            (windows) scored, summed (``classify.long_documents``).
        by_category: ``{category: results naming it}`` over the allowed categories, every status.
        per_category: ``{category: accepted results}`` in order of first appearance.
        reasons: ``{reason up to its first ':': rejected results}``.
        bad_category, no_reason, bad_status: ids of accepted results outside the allowed set,
            rejected without a reason, with another status.
        problems: one :func:`row_problem` line per bad result, in order.
    """

    def __init__(self, categories: Sequence[str], max_problems: int | None = None):
        self.categories = list(categories)
        self.max_problems = max_problems
        self.total = self.accepted = self.rejected = self.n_tokens = 0
        self.truncated = self.n_windows = 0
        self.by_category = dict.fromkeys(self.categories, 0)
        self.per_category: Counter[str | None] = Counter()
        self.reasons: Counter[str] = Counter()
        self.bad_category: list[str] = []
        self.no_reason: list[str] = []
        self.bad_status: list[str] = []
        self.problems: list[str] = []

    def add(self, r: Result) -> None:
        """Count one result and note what is wrong with it."""
        self.total += 1
        status = r.status
        if status == "accepted":
            self.accepted += 1
            self.per_category[r.category] += 1
            if r.category not in self.categories:
                self._note(self.bad_category, r)
        elif status == "rejected":
            self.rejected += 1
            self.reasons[(r.reason or "").split(":")[0]] += 1
            if not r.reason:
                self._note(self.no_reason, r)
        else:
            self._note(self.bad_status, r)
        if r.category in self.by_category:
            self.by_category[r.category] += 1  # type: ignore[index]
        self.n_tokens += int(r.n_tokens or 0)
        self.truncated += r.truncated is True
        self.n_windows += int(r.n_windows or 0)

    def _note(self, ids: list[str], r: Result) -> None:
        if self.max_problems is None or len(self.problems) < self.max_problems:
            ids.append(r.id)
            self.problems.append(row_problem(r, self.categories) or "")

    def counts(self) -> dict[str, Any]:
        """``{total, accepted, rejected, by_category, reject_reasons, n_tokens, truncated, n_windows}`` (reasons sorted)."""
        return {"total": self.total, "accepted": self.accepted, "rejected": self.rejected,
                "by_category": dict(self.by_category), "reject_reasons": dict(sorted(self.reasons.items())),
                "n_tokens": self.n_tokens, "truncated": self.truncated, "n_windows": self.n_windows}


@dataclass
class Accounting:
    """The accounting of results held in memory against the input ids (:func:`account`).

    Attributes:
        ledger: the counts and per-result problems.
        expected: the input ids given (``None``: not checked against an input).
        duplicate_ids: ids with more than one result, sorted.
        unknown_ids: result ids not among the input ids, sorted.
        missing_ids: input ids without a result, in input order.
    """

    ledger: Ledger
    expected: list[str] | None
    duplicate_ids: list[str] = field(default_factory=list)
    unknown_ids: list[str] = field(default_factory=list)
    missing_ids: list[str] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        """accepted + rejected = results = input ids, and no id duplicate, unknown or missing."""
        led = self.ledger
        n_input = led.total if self.expected is None else len(self.expected)
        return (led.accepted + led.rejected == led.total == n_input
                and not (self.duplicate_ids or self.unknown_ids or self.missing_ids))

    @property
    def ok(self) -> bool:
        """:attr:`balanced` and no result is wrong on its own."""
        return self.balanced and not self.ledger.problems

    def problems(self) -> list[str]:
        """Every broken invariant, one line each: duplicate, unknown, missing ids, then each bad result."""
        out = []
        if self.duplicate_ids:
            more = " ..." if len(self.duplicate_ids) > 10 else ""
            out.append(f"duplicate ids in results: {self.duplicate_ids[:10]}{more}")
        if self.unknown_ids:
            out.append(f"unknown ids in results: {self.unknown_ids[:10]}")
        if self.missing_ids:
            missing = sorted(set(self.missing_ids))
            out.append(f"ids missing from results: {missing[:10]} ({len(missing)} in all)")
        return out + self.ledger.problems


def account(results: Iterable[Result], expected_ids: Sequence[str] | None, categories: Sequence[str]) -> Accounting:
    """Check results held in memory: each input id exactly once, accepted or rejected, a reason when rejected.

    Args:
        results: the results (any order).
        expected_ids: the input's ids (``None``: only the checks that need no input).
        categories: the allowed categories.

    Returns:
        The :class:`Accounting` (``.problems()`` empty and ``.ok``: every invariant holds).
    """
    ledger = Ledger(categories)
    seen: Counter[str] = Counter()
    for r in results:
        ledger.add(r)
        seen[r.id] += 1
    acc = Accounting(ledger, None if expected_ids is None else list(expected_ids),
                     duplicate_ids=sorted(i for i, n in seen.items() if n > 1))
    if expected_ids is not None:
        expected = set(expected_ids)
        acc.unknown_ids = sorted(set(seen) - expected)
        acc.missing_ids = [i for i in expected_ids if i not in seen]
    return acc


def recount_mismatches(stored: Mapping[str, Any], recount: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """Where a stored ``summary.json`` disagrees with the counts recomputed from the copied results.

    Returns:
        ``"summary.json `key` is <stored> but the copied results give <recount>"`` per differing key.
    """
    return [f"summary.json `{key}` is {stored.get(key)} but the copied results give {recount[key]}"
            for key in keys if recount[key] != stored.get(key)]


def recheck_export(dest: Any, check: Callable[[Path], list[str]] | None, label: str) -> None:
    """The one export re-check of pilot and batch: every ``SHA256SUMS`` hash, then the run's own accounting.

    Args:
        dest: the copy (a folder or an object-storage URL, :mod:`classify.runs.storage`).
        check: recomputes the run's invariants from a local copy (``None``: hashes only).
        label: names the copy in the error (``"export <dest>"``).

    Raises:
        VerificationError: ``"<label> failed its re-check: <problem>; ..."``.
    """
    problems = verify_export(dest, check)
    if problems:
        raise VerificationError(f"{label} failed its re-check: {'; '.join(problems)}")


def export_checked(run_dir: Path, dest: Any, check: Callable[[Path], list[str]] | None, label: str) -> bool:
    """Copy a finished run folder with ``SHA256SUMS`` and re-check the copy (:func:`recheck_export`).

    A complete copy an earlier attempt made is re-checked, never overwritten.

    Args:
        run_dir: the run folder.
        dest: where the copy goes (folder or URL).
        check: as for :func:`recheck_export`.
        label: as for :func:`recheck_export`.

    Returns:
        ``True`` when the copy was made now, ``False`` when an earlier one was re-checked.

    Raises:
        VerificationError: the copy fails its re-check.
    """
    made = not export_complete(dest)
    if made:
        export_run(run_dir, dest)
    recheck_export(dest, check, label)
    return made
