"""The pictures of a quality report (matplotlib, Agg backend: no display needed).

``category_distribution.png`` and ``score_histogram.png`` for any run; ``confusion_matrix.png``
when the run was labelled. Every picture has a title naming the run, axis labels with units and
the category names.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from classify.runs.plots import pyplot, save_png

CONFUSION_PNG = "confusion_matrix.png"
DISTRIBUTION_PNG = "category_distribution.png"
HISTOGRAM_PNG = "score_histogram.png"


def write_pictures(report: Mapping[str, Any], folder: Path, run: str) -> list[str]:
    """Write the report's PNGs into ``folder``.

    Args:
        report: :meth:`batch.report.quality.QualityTally.report`.
        folder: the run folder.
        run: the run or batch id (picture titles).

    Returns:
        The file names written, e.g. ``["category_distribution.png", "score_histogram.png", "confusion_matrix.png"]``.
    """
    plt = pyplot()
    written = [_distribution(plt, report, folder / DISTRIBUTION_PNG, run), _histogram(plt, report, folder / HISTOGRAM_PNG, run)]
    if report.get("labelled"):
        written.append(_confusion(plt, report["labelled"], folder / CONFUSION_PNG, run))
    return written


def _save(plt: Any, fig: Any, path: Path) -> str:
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if not len(ax.images):  # bar charts: document counts are whole numbers
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return save_png(fig, path).name


def _distribution(plt: Any, report: Mapping[str, Any], path: Path, run: str) -> str:
    dist = report["distribution"]
    names, counts = list(dist), list(dist.values())
    review = (report.get("review") or {}).get("by_category") or {}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = ["#4C72B0"] * (len(names) - 1) + ["#999999"]
    bars = ax.bar(names, counts, color=colors, label="answered (rejected in grey)")
    if review:
        ax.bar(names[:-1], [review.get(c, 0) for c in names[:-1]], color="#DD8452", label="of which flagged for review")
        ax.legend(loc="upper right", fontsize=8)
    for bar, n in zip(bars, counts, strict=True):
        ax.annotate(str(n), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    total = report["documents"]
    ax.set_title(f"Answers per category ({total} documents)\n{run}", fontsize=10)
    ax.set_xlabel("category answered")
    ax.set_ylabel("documents (count)")
    ax.set_ylim(0, max(counts + [1]) * 1.15)
    return _save(plt, fig, path)


def _histogram(plt: Any, report: Mapping[str, Any], path: Path, run: str) -> str:
    """The scores of the accepted documents; with labels, the wrong or unlabelled ones again in a panel of their own
    below (its own count axis, each bar numbered): a few wrong answers among hundreds right are one pixel each on
    the shared axis, and they are what a reader looks for."""
    hist = report["score_histogram"]
    edges, counts = hist["bin_edges"], hist["counts"]
    width = edges[1] - edges[0]
    lab = report.get("labelled")
    if lab and any(lab["score_bins_correct"]):
        fig, (ax, low) = plt.subplots(2, 1, figsize=(7.5, 5.6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
        right = lab["score_bins_correct"]
        wrong = [n - r for n, r in zip(counts, right, strict=True)]
        ax.bar(edges[:-1], right, width=width, align="edge", color="#55A868", edgecolor="white", label="correct (labelled)")
        ax.bar(edges[:-1], wrong, width=width, align="edge", bottom=right, color="#C44E52", edgecolor="white",
               label="wrong or unlabelled")
        bars = low.bar(edges[:-1], wrong, width=width, align="edge", color="#C44E52", edgecolor="white")
        low.bar_label(bars, labels=[str(n) if n else "" for n in wrong], fontsize=8)
        low.set_ylim(0, max(wrong + [1]) * 1.3)
        low.set_ylabel("wrong or\nunlabelled")
        low.set_title(f"{sum(wrong)} wrong or unlabelled, on their own scale", fontsize=9)
    else:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        low = ax
        ax.bar(edges[:-1], counts, width=width, align="edge", color="#4C72B0", edgecolor="white", label="accepted documents")
    review = report.get("review")
    if review:
        for axis in dict.fromkeys((ax, low)):
            axis.axvline(review["below_score"], color="black", linestyle="--",
                         label=f"review below {review['below_score']} ({review['flagged']} flagged)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, max(counts + [1]) * 1.15)
    ax.set_title(f"Score of the chosen category ({sum(counts)} accepted documents, bins of {width:.2f})\n{run}", fontsize=10)
    low.set_xlabel("score: probability of the chosen category (0-1)")
    ax.set_ylabel("documents (count)")
    return _save(plt, fig, path)


def _confusion(plt: Any, lab: Mapping[str, Any], path: Path, run: str) -> str:
    conf = lab["confusion"]
    rows, cols, counts = conf["labels"], conf["predicted"], conf["counts"]
    fig, ax = plt.subplots(figsize=(1.3 * len(cols) + 2.5, 0.8 * len(rows) + 2.2))
    shares = [[n / (sum(r) or 1) for n in r] for r in counts]
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i, r in enumerate(counts):
        for j, n in enumerate(r):
            ax.text(j, i, str(n), ha="center", va="center", fontsize=9,
                    color="white" if shares[i][j] > 0.6 else "black")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [f"{r} ({sum(c)})" for r, c in zip(rows, counts, strict=True)])
    ax.set_xlabel("answered category (documents, colour = share of the row)")
    ax.set_ylabel("true category (label, row total)")
    acc = lab["accuracy"]
    ax.set_title(f"Confusion matrix: accuracy {100 * acc:.1f}% ({lab['correct']}/{lab['documents']} labelled)\n{run}",
                 fontsize=10)
    return _save(plt, fig, path)
