"""Quality reports of a pilot or a batch: what was answered, how sure, and (on labelled data) how right.

Counts are kept one result row at a time (:class:`QualityTally`), so a batch of millions of rows
needs memory for the counts only: ``(categories + 1)^2`` confusion cells and 20 score bins.

Any run gets the category distribution and the score histogram (``category_distribution.png``,
``score_histogram.png``). With labels (the pilot's labels; a batch corpus with
``corpus.label_column``) it also gets accuracy, a per-category table and ``confusion_matrix.png``.
With ``classify.review_below_score`` set, accepted rows under it carry ``review: true``; the report
counts them per category and, on labelled data, gives the accuracy above and below the threshold.

Definitions (the pilot's own ``accuracy`` check uses the same ones):

* labelled document: its label is one of the allowed categories (a pilot's ``reject`` label
  counts as a planned reject, not as a labelled document);
* correct: accepted with ``category == label``; a rejected labelled document is not correct;
* accuracy = correct / labelled documents.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from classify.scoring import needs_review

REJECT_LABEL = "reject"
"""A pilot label meaning "this document must be rejected"."""
REJECTED = "rejected"
"""The confusion matrix's column of rejected rows."""
SCORE_BINS = 20
"""Equal-width score bins of the histogram over [0, 1] (0.05 wide)."""
MAX_ODD_LABELS = 20


class QualityTally:
    """Counts over result rows and their labels, one row at a time.

    Args:
        categories: the allowed categories (table and picture order).
        review_below_score: ``classify.review_below_score`` or ``None``.

    Example:
        >>> t = QualityTally(["sport", "tech"])
        >>> t.add({"status": "accepted", "category": "tech", "score": 0.9}, label="tech")
        >>> t.report()["labelled"]["accuracy"]
        1.0
    """

    def __init__(self, categories: Iterable[str], review_below_score: float | None = None):
        self.categories = list(categories)
        self.threshold = review_below_score
        self.total = 0
        self.distribution: Counter[str] = Counter()
        self.hist = [0] * SCORE_BINS
        self.hist_correct = [0] * SCORE_BINS
        self.hist_labelled = [0] * SCORE_BINS
        self.review: Counter[str] = Counter()
        self.confusion: Counter[tuple[str, str]] = Counter()
        self.odd_labels: Counter[str] = Counter()
        self.unlabelled = 0
        self.side = {True: [0, 0], False: [0, 0]}  # below threshold? -> [labelled accepted, correct]

    def add(self, row: Mapping[str, Any], label: str | None = None) -> None:
        """Count one result row (``status``, ``category``, ``score``, optional ``review``) and its label.

        ``label`` is ``None`` for an unlabelled document; a label outside the categories (and not
        ``reject``) is counted apart (``labels_outside_categories``), not scored.
        """
        self.total += 1
        accepted = row.get("status") == "accepted"
        predicted = row.get("category") if accepted and row.get("category") in self.categories else REJECTED
        self.distribution[predicted] += 1
        score = row.get("score")
        b = None
        if accepted and isinstance(score, int | float):
            b = min(int(score * SCORE_BINS), SCORE_BINS - 1)
            self.hist[b] += 1
        flagged = row.get("review")
        if flagged is None and accepted:
            flagged = needs_review(score, self.threshold)
        if accepted and flagged:
            self.review[predicted] += 1
        if label is None or label == "":
            self.unlabelled += 1
            return
        if label not in self.categories and label != REJECT_LABEL:
            if len(self.odd_labels) < MAX_ODD_LABELS or label in self.odd_labels:
                self.odd_labels[label] += 1
            return
        self.confusion[(label, predicted)] += 1
        if label == REJECT_LABEL or not accepted:
            return
        correct = predicted == label
        if b is not None:
            self.hist_labelled[b] += 1
            self.hist_correct[b] += correct
        if self.threshold is not None:
            side = self.side[bool(flagged)]
            side[0] += 1
            side[1] += correct

    def add_unlabelled_table(self, table: Any) -> None:
        """Count the rows of an Arrow table or record batch of results (``status``, ``category``, ``score``,
        optional ``review``) as unlabelled documents: the counts :meth:`add` gives row by row, with Arrow
        kernels (a batch of millions of rows is tallied in seconds). Rows of unusual values (a score that is
        not a number in [0, 1]) are counted by :meth:`add` instead.

        Args:
            table: a ``pyarrow.Table`` or ``pyarrow.RecordBatch`` with at least ``status``.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        names = table.schema.names
        score = table.column("score") if "score" in names else pa.nulls(n, pa.float64())
        if not (pa.types.is_floating(score.type) or pa.types.is_integer(score.type) or pa.types.is_null(score.type)):
            score = None
        else:
            score = pc.cast(score, pa.float64())
            lo_hi = pc.min_max(score).as_py()
            if pc.sum(pc.is_nan(score)).as_py() or (lo_hi["min"] is not None and (lo_hi["min"] < 0 or lo_hi["max"] > 1)):
                score = None
        if score is None:
            for row in table.to_pylist():
                self.add(row)
            return
        category = table.column("category") if "category" in names else pa.nulls(n, pa.string())
        accepted = pc.fill_null(pc.equal(table.column("status"), "accepted"), False)
        known = pc.and_(accepted, pc.fill_null(pc.is_in(category, value_set=pa.array(self.categories, pa.string())), False))
        predicted = pc.if_else(known, category, REJECTED)
        for item in pc.value_counts(predicted).to_pylist():
            self.distribution[item["values"]] += item["counts"]
        scored = pc.and_(accepted, pc.is_valid(score))
        bins = np.minimum((pc.filter(score, scored).to_numpy(zero_copy_only=False) * SCORE_BINS).astype(np.int64),
                          SCORE_BINS - 1)
        for b, count in enumerate(np.bincount(bins, minlength=SCORE_BINS).tolist()):
            self.hist[b] += count
        flagged = table.column("review") if "review" in names else pa.nulls(n, pa.bool_())
        if self.threshold is not None:  # an accepted row without a flag: needs_review(score, threshold)
            flagged = pc.coalesce(flagged, pc.fill_null(pc.less(score, self.threshold), True))
        flagged = pc.and_(accepted, pc.fill_null(flagged, False))
        for item in pc.value_counts(pc.filter(predicted, flagged)).to_pylist():
            self.review[item["values"]] += item["counts"]
        self.total += n
        self.unlabelled += n

    @property
    def labelled(self) -> int:
        """Documents whose label is an allowed category."""
        return sum(n for (lab, _), n in self.confusion.items() if lab != REJECT_LABEL)

    def report(self) -> dict[str, Any]:
        """The JSON-able report.

        Returns:
            ``{"documents", "distribution", "score_histogram": {"bin_edges", "counts"}}``, plus
            ``"review": {"below_score", "flagged", "by_category"}`` when the threshold is set, and
            ``"labelled": {...}`` (accuracy, ``per_category``, ``confusion``, ``by_review``) only when
            at least one document has a label among the categories; an unlabelled run has no accuracy.
        """
        order = [*self.categories, REJECTED]
        out: dict[str, Any] = {
            "documents": self.total,
            "distribution": {c: self.distribution.get(c, 0) for c in order},
            "score_histogram": {"bin_edges": [round(i / SCORE_BINS, 4) for i in range(SCORE_BINS + 1)],
                                "counts": list(self.hist)},
        }
        if self.threshold is not None:
            out["review"] = {"below_score": self.threshold, "flagged": sum(self.review.values()),
                             "by_category": {c: self.review.get(c, 0) for c in self.categories}}
        if self.labelled:
            out["labelled"] = self._labelled_report(order)
        return out

    def _labelled_report(self, order: list[str]) -> dict[str, Any]:
        rows = [*self.categories] + ([REJECT_LABEL] if any(lab == REJECT_LABEL for lab, _ in self.confusion) else [])
        per: dict[str, Any] = {}
        for c in self.categories:
            n = sum(self.confusion.get((c, p), 0) for p in order)
            hit = self.confusion.get((c, c), 0)
            answered = sum(self.confusion.get((lab, c), 0) for lab in self.categories)
            per[c] = {"documents": n, "correct": hit, "accuracy": _ratio(hit, n),
                      "precision": _ratio(hit, answered), "rejected": self.confusion.get((c, REJECTED), 0)}
        correct = sum(p["correct"] for p in per.values())
        rep: dict[str, Any] = {
            "documents": self.labelled, "correct": correct, "accuracy": _ratio(correct, self.labelled),
            "rejected": sum(p["rejected"] for p in per.values()), "unlabelled": self.unlabelled,
            "labels_outside_categories": dict(self.odd_labels),
            "per_category": per,
            "confusion": {"labels": rows, "predicted": order,
                          "counts": [[self.confusion.get((r, p), 0) for p in order] for r in rows]},
            "score_bins_correct": list(self.hist_correct),
            "score_bins_accuracy": [_ratio(c, n) for c, n in zip(self.hist_correct, self.hist_labelled, strict=True)],
        }
        if REJECT_LABEL in rows:
            rep["planned_rejects"] = sum(self.confusion.get((REJECT_LABEL, p), 0) for p in order)
        if self.threshold is not None:
            (n_above, ok_above), (n_below, ok_below) = self.side[False], self.side[True]
            rep["by_review"] = {
                "below_score": self.threshold,
                "above": {"documents": n_above, "correct": ok_above, "accuracy": _ratio(ok_above, n_above)},
                "below": {"documents": n_below, "correct": ok_below, "accuracy": _ratio(ok_below, n_below)},
            }
        return rep


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def tally_rows(rows: Iterable[Mapping[str, Any]], labels: Mapping[str, str] | None, categories: Iterable[str],
               review_below_score: float | None = None) -> QualityTally:
    """A :class:`QualityTally` over in-memory rows (the pilot), labels looked up by id."""
    tally = QualityTally(categories, review_below_score)
    for row in rows:
        tally.add(row, (labels or {}).get(str(row.get("id"))))
    return tally


def tally_results_file(results: Path, labels: Iterator[tuple[str, str | None]] | None, categories: Iterable[str],
                       review_below_score: float | None = None) -> tuple[QualityTally, str | None]:
    """Stream ``results.jsonl`` (read from the ``results.parquet`` beside it when there is one) beside the
    corpus labels, which come in the same order.

    Args:
        results: the merged ``results.jsonl`` (one row per distinct id, corpus order).
        labels: ``(id, label or None)`` per result row in the same order (:func:`batch.corpus.labels.iter_labels`),
            or ``None`` for an unlabelled corpus.
        categories: the allowed categories.
        review_below_score: ``classify.review_below_score`` or ``None``.

    Returns:
        ``(tally, problem)``: ``problem`` says why the labels were dropped (an id out of step, or a
        count that differs), else ``None``; the tally then holds the rows without labels.
    """
    tally = QualityTally(categories, review_below_score)
    plain = QualityTally(categories, review_below_score)
    problem = None
    n = 0
    for batch in _result_batches(results):
        if isinstance(batch, list):
            for row in batch:
                plain.add(row)
        else:
            plain.add_unlabelled_table(batch)
        if labels is not None and problem is None:
            for row in batch if isinstance(batch, list) else batch.to_pylist():
                pair = next(labels, None)
                if pair is None or pair[0] != row.get("id"):
                    problem = f"corpus labels out of step with results at row {n}: {pair and pair[0]!r} != {row.get('id')!r}"
                    break
                tally.add(row, pair[1])
                n += 1
    if labels is not None and problem is None and next(labels, None) is not None:
        problem = "the corpus yields more labelled rows than results.jsonl holds"
    return (plain if labels is None or problem else tally), problem


def _result_batches(results: Path) -> Iterator[Any]:
    """The rows of ``results.jsonl`` in order: Arrow record batches of ``id``, ``status``, ``category``,
    ``score`` (and ``review``) read from the ``results.parquet`` merged beside it when there is one (the same
    rows in the same order, :func:`batch.run.merge.merge_results`; Arrow decodes it far faster), else lists of
    row dicts read from the JSON lines."""
    from batch.layout import RESULTS_PARQUET, streaming_parquet

    parquet = results.with_name(RESULTS_PARQUET)
    if parquet.is_file():
        pf = streaming_parquet(parquet)
        names = [c for c in ("id", "status", "category", "score", "review") if c in pf.schema_arrow.names]
        yield from pf.iter_batches(batch_size=65_536, columns=names)
        return
    rows: list[Mapping[str, Any]] = []
    with results.open("rb") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) >= 65_536:
                yield rows
                rows = []
    if rows:
        yield rows


def quality_table(report: Mapping[str, Any]) -> str:
    """A short plain-text (Markdown) table of a report: per category documents, answers, review flags, accuracy.

    Returns:
        Lines ending in ``\\n``; the accuracy columns only when the run was labelled.
    """
    lab = report.get("labelled")
    review = (report.get("review") or {}).get("by_category")
    head = ["category", "answered"] + (["review"] if review is not None else [])
    if lab:
        head += ["labelled", "correct", "accuracy", "precision"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c, n in report["distribution"].items():
        cells = [c, str(n)] + ([str(review.get(c, "")) if c != REJECTED else ""] if review is not None else [])
        if lab:
            p = lab["per_category"].get(c)
            cells += [str(p["documents"]), str(p["correct"]), _pct(p["accuracy"]), _pct(p["precision"])] if p else ["", "", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if lab:
        text += (f"\naccuracy {_pct(lab['accuracy'])} ({lab['correct']}/{lab['documents']} labelled documents; "
                 f"{lab['rejected']} of them rejected, {lab['unlabelled']} rows without a label)\n")
        by = lab.get("by_review")
        if by:
            text += (f"score >= {by['below_score']}: {_pct(by['above']['accuracy'])} of {by['above']['documents']}; "
                     f"below (review): {_pct(by['below']['accuracy'])} of {by['below']['documents']}\n")
    if review is not None:
        text += f"review flags (score < {report['review']['below_score']}): {report['review']['flagged']}\n"
    return text


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


QUALITY_MD = "quality.md"
"""The run folder's plain-text quality report (the table of :func:`quality_table`)."""


def write_report(folder: Path, tally: QualityTally, run: str, note: str | None = None) -> dict[str, Any]:
    """Write the pictures and ``quality.md`` into a run folder and return the report.

    Args:
        folder: the run folder.
        tally: the counts of the run.
        run: the run or batch id (titles).
        note: a line for ``quality.md`` (e.g. why labels were not used), or ``None``.

    Returns:
        :meth:`QualityTally.report` plus ``files``: the names written (PNGs, then ``quality.md``).
    """
    from batch.report.plots import write_pictures

    report = tally.report()
    report["files"] = [*write_pictures(report, folder, run), QUALITY_MD]
    text = f"# Quality of {run}\n\n" + quality_table(report)
    if note:
        text += f"\n{note}\n"
    text += "\nPictures: " + ", ".join(report["files"][:-1]) + "\n"
    (folder / QUALITY_MD).write_text(text, encoding="utf-8")
    return report


def batch_report(run_dir: Path, plan: Any, *, label_column: str | None, categories: Iterable[str],
                 review_below_score: float | None, run: str) -> dict[str, Any]:
    """The quality report of a merged batch: ``results.jsonl`` streamed beside the corpus labels.

    Args:
        run_dir: the run folder (holds ``results.jsonl``; the PNGs and ``quality.md`` go there).
        plan: the batch's :class:`batch.corpus.plan.CorpusPlan`.
        label_column: ``corpus.label_column`` (``None``: labels off).
        categories: the allowed categories.
        review_below_score: ``classify.review_below_score`` or ``None``.
        run: the batch id (titles).

    Returns:
        The report (:func:`write_report`) plus ``label_column`` (``None`` when the corpus has no
        labels) and ``label_problem`` (why the labels were dropped, else ``None``).
    """
    from batch.corpus.labels import has_labels, iter_labels

    column = label_column if has_labels(plan, label_column) else None
    labels = iter_labels(plan, column) if column else None
    tally, problem = tally_results_file(run_dir / "results.jsonl", labels, categories, review_below_score)
    note = f"Labels from corpus column `{column}`." if column else "The corpus has no labels: no accuracy."
    if problem:
        note = f"Labels NOT used: {problem}."
    report = write_report(run_dir, tally, run, note)
    report["label_column"] = column
    report["label_problem"] = problem
    return report
