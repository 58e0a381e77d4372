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

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from batch.corpus.labels import has_labels, iter_labels
from batch.layout import RESULTS_PARQUET, streaming_parquet
from batch.report.plots import write_pictures
from batch.rows import read_rows

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
        self.outside = 0  # rows whose label is outside the categories (every kind, where odd_labels keeps 20)
        self.unlabelled = 0
        self.side = {True: [0, 0], False: [0, 0]}  # below threshold? -> [labelled accepted, correct]

    def add(self, row: Mapping[str, Any], label: str | None = None) -> None:
        """Count one result row and its label (:meth:`add_rows` of one row)."""
        self.add_rows([row], [label])

    def add_rows(self, rows: Iterable[Mapping[str, Any]], labels: Iterable[str | None] | None = None) -> None:
        """Count result rows held in memory (the pilot's; ``status``, ``category``, ``score``, optional ``review``)
        and their labels: :meth:`add_table` over a table of those columns (a score that is not a number counts
        as no score)."""
        import pyarrow as pa

        rows = list(rows)

        def number(v: Any) -> float | None:
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        table = pa.table({"status": pa.array([r.get("status") for r in rows], pa.string()),
                          "category": pa.array([r.get("category") for r in rows], pa.string()),
                          "score": pa.array([number(r.get("score")) for r in rows], pa.float64()),
                          "review": pa.array([r.get("review") for r in rows], pa.bool_())})
        self.add_table(table, None if labels is None else list(labels))

    def add_table(self, table: Any, labels: list[str | None] | None = None) -> None:
        """Count the rows of an Arrow table or record batch of results and their labels, with Arrow kernels.

        ``label`` ``None`` or ``""`` is an unlabelled document; a label outside the categories (and not
        ``reject``) is counted apart (``labels_outside_categories``, at most :data:`MAX_ODD_LABELS` kinds),
        not scored. A score outside [0, 1] falls in the first or last bin; a NaN score is no score.

        Args:
            table: a ``pyarrow.Table`` or ``pyarrow.RecordBatch`` with ``status`` and optionally ``category``,
                ``score`` (a numeric column; any other type counts as no score) and ``review``.
            labels: one label per row, in order, or ``None`` (every row unlabelled).
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        names = table.schema.names
        column = dict(zip(names, table.columns, strict=True))
        score = column.get("score", pa.nulls(n, pa.float64()))
        if not (pa.types.is_floating(score.type) or pa.types.is_integer(score.type)):
            score = pa.nulls(n, pa.float64())
        score = pc.cast(score, pa.float64())
        category = column.get("category", pa.nulls(n, pa.string()))
        accepted = pc.fill_null(pc.equal(column["status"], "accepted"), False)
        known = pc.and_(accepted, pc.fill_null(pc.is_in(category, value_set=pa.array(self.categories, pa.string())), False))
        predicted = pc.if_else(known, category, REJECTED)
        self._count(self.distribution, predicted)
        binned = pc.and_(accepted, pc.fill_null(pc.invert(pc.is_nan(score)), False))
        bins = pc.if_else(binned, pc.max_element_wise(pc.min_element_wise(
            pc.cast(pc.floor(pc.multiply(score, float(SCORE_BINS))), pa.int64(), safe=False), SCORE_BINS - 1), 0), None)
        self._bin(self.hist, bins)
        flagged = column.get("review", pa.nulls(n, pa.bool_()))
        if self.threshold is not None:  # an accepted row without a flag: needs_review(score, threshold)
            flagged = pc.coalesce(flagged, pc.fill_null(pc.less(score, self.threshold), True))
        flagged = pc.and_(accepted, pc.fill_null(flagged, False))
        self._count(self.review, pc.filter(predicted, flagged))
        self.total += n
        label = pa.array(labels if labels is not None else [None] * n, pa.string())
        unlabelled = pc.fill_null(pc.equal(label, ""), True)
        self.unlabelled += pc.sum(unlabelled).as_py() or 0
        allowed = pc.fill_null(pc.is_in(label, value_set=pa.array([*self.categories, REJECT_LABEL], pa.string())), False)
        outside = pc.and_(pc.invert(unlabelled), pc.invert(allowed))
        self.outside += pc.sum(outside).as_py() or 0
        for item in pc.value_counts(pc.filter(label, outside)).to_pylist():
            if len(self.odd_labels) < MAX_ODD_LABELS or item["values"] in self.odd_labels:
                self.odd_labels[item["values"]] += item["counts"]
        for item in pc.value_counts(pc.filter(pc.binary_join_element_wise(label, predicted, "\x00"), allowed)).to_pylist():
            lab, pred = item["values"].split("\x00")
            self.confusion[(lab, pred)] += item["counts"]
        scored = pc.and_(pc.and_(allowed, pc.fill_null(pc.not_equal(label, REJECT_LABEL), False)), accepted)
        correct = pc.and_(scored, pc.fill_null(pc.equal(predicted, label), False))
        self._bin(self.hist_labelled, pc.filter(bins, scored))
        self._bin(self.hist_correct, pc.filter(bins, correct))
        if self.threshold is not None:
            for side, rows in ((True, flagged), (False, pc.invert(flagged))):
                self.side[side][0] += pc.sum(pc.and_(scored, rows)).as_py() or 0
                self.side[side][1] += pc.sum(pc.and_(correct, rows)).as_py() or 0

    @staticmethod
    def _count(counter: Counter[str], values: Any) -> None:
        for item in pc_value_counts(values):
            counter[item["values"]] += item["counts"]

    @staticmethod
    def _bin(hist: list[int], bins: Any) -> None:
        for item in pc_value_counts(bins.drop_null()):
            hist[item["values"]] += item["counts"]

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
            ``"labels_outside_categories": {"rows", "labels"}`` when some rows carry a label that is none
            of the categories (and not ``reject``): not scored, and counted, whether or not others are.
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
        if self.outside:
            out["labels_outside_categories"] = {"rows": self.outside, "labels": dict(self.odd_labels)}
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


def pc_value_counts(values: Any) -> list[dict[str, Any]]:
    """``pyarrow.compute.value_counts`` as ``[{"values", "counts"}]``, in order of first appearance."""
    import pyarrow.compute as pc

    return pc.value_counts(values).to_pylist()


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def tally_rows(rows: Iterable[Mapping[str, Any]], labels: Mapping[str, str] | None, categories: Iterable[str],
               review_below_score: float | None = None) -> QualityTally:
    """A :class:`QualityTally` over in-memory rows (the pilot), labels looked up by id."""
    tally = QualityTally(categories, review_below_score)
    rows = list(rows)
    tally.add_rows(rows, [(labels or {}).get(str(row.get("id"))) for row in rows])
    return tally


def tally_results_file(results: Path, labels: Iterator[tuple[str, str | None]] | None, categories: Iterable[str],
                       review_below_score: float | None = None) -> tuple[QualityTally, str | None]:
    """Stream the merged results (``results.parquet`` beside ``results.jsonl``, the same rows) beside the corpus
    labels, which come in the same order.

    Args:
        results: the merged ``results.jsonl`` (one row per distinct id, corpus order).
        labels: ``(id, label or None)`` per result row in the same order (:func:`batch.corpus.labels.iter_labels`),
            or ``None`` for an unlabelled corpus.
        categories: the allowed categories.
        review_below_score: ``classify.review_below_score`` or ``None``.

    Returns:
        ``(tally, problem)``: ``problem`` says why the labels were dropped (an id out of step, or a
        count that differs), else ``None``; the tally then holds the rows without labels (the results
        are read a second time, without labels).
    """
    tally = QualityTally(categories, review_below_score)
    n = 0
    for batch in _result_batches(results):
        if labels is None:
            tally.add_table(batch)
            continue
        ids = batch.column("id").to_pylist()
        pairs = [pair for _, pair in zip(ids, labels, strict=False)]
        for i, rid in enumerate(ids):
            pair = pairs[i] if i < len(pairs) else None
            if pair is None or pair[0] != rid:
                problem = f"corpus labels out of step with results at row {n + i}: {pair and pair[0]!r} != {rid!r}"
                return tally_results_file(results, None, categories, review_below_score)[0], problem
        tally.add_table(batch, [label for _, label in pairs])
        n += len(ids)
    if labels is not None and next(labels, None) is not None:
        problem = "the corpus yields more labelled rows than results.jsonl holds"
        return tally_results_file(results, None, categories, review_below_score)[0], problem
    return tally, None


def _result_batches(results: Path) -> Iterator[Any]:
    """The rows of the merged results in order, as Arrow record batches of ``id``, ``status``, ``category``,
    ``score`` (and ``review``): read from the ``results.parquet`` merged beside ``results.jsonl``
    (:func:`batch.run.merge.merge_results`), or from ``results.jsonl`` itself (:func:`batch.rows.read_rows`,
    64k lines at a time) when there is none."""
    parquet = results.with_name(RESULTS_PARQUET)
    if parquet.is_file():
        pf = streaming_parquet(parquet)
        names = [c for c in ("id", "status", "category", "score", "review") if c in pf.schema_arrow.names]
        yield from pf.iter_batches(batch_size=65_536, columns=names)
        return
    with results.open("rb") as fh:
        first_line = 1
        while chunk := b"".join(line for _, line in zip(range(65_536), fh, strict=False)):
            yield read_rows(chunk, b'"review"' in chunk, str(results), first_line)[1]
            first_line += 65_536


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
    outside = report.get("labels_outside_categories")
    if outside:
        kinds = ", ".join(f"{k!r}: {n}" for k, n in outside["labels"].items())
        text += (f"{outside['rows']} rows with a label outside the categories, not scored ({kinds}"
                 f"{', ...' if sum(outside['labels'].values()) < outside['rows'] else ''})\n")
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
