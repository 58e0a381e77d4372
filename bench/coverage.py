"""Coverage-accuracy curve: what share of documents can be accepted automatically at what accuracy.

Sort the documents by ``score`` (highest first); keeping the top ``k`` of ``n`` gives coverage
``k / n`` and the accuracy of those ``k``. A review threshold t (``classify.review_below_score``)
keeps exactly the documents with ``score >= t``: its point is marked on the curve. This is the
risk-coverage curve of selective classification (Geifman and El-Yaniv 2017, "Selective
Classification for Deep Neural Networks"), drawn as accuracy rather than risk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def coverage_accuracy(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coverage and accuracy of the ``k`` highest-scored documents, for every ``k``.

    Args:
        scores: ``n`` confidences in [0, 1].
        correct: ``n`` booleans (answer right).

    Returns:
        ``(coverage, accuracy, threshold)``, each of shape ``(n,)``: entry ``k - 1`` holds
        ``k / n``, the accuracy of the top ``k`` and the ``k``-th highest score.

    Raises:
        ValueError: empty input or shapes that differ.
    """
    s = np.asarray(scores, dtype=float)
    c = np.asarray(correct, dtype=bool)
    if s.ndim != 1 or s.shape != c.shape or s.size == 0:
        raise ValueError(f"scores and correct must be two non-empty 1-D arrays of one length, got {s.shape} and {c.shape}")
    order = np.argsort(-s, kind="stable")
    k = np.arange(1, s.size + 1)
    return k / s.size, np.cumsum(c[order]) / k, s[order]


def at_threshold(scores: Any, correct: Any, threshold: float) -> dict[str, float | int | None]:
    """Coverage and accuracy above and below one review threshold.

    Args:
        scores: ``n`` confidences in [0, 1].
        correct: ``n`` booleans.
        threshold: documents with ``score < threshold`` go to review.

    Returns:
        ``{"threshold", "coverage", "accepted", "accuracy_accepted", "review", "accuracy_review"}``
        (accuracies are ``None`` for an empty side).
    """
    s = np.asarray(scores, dtype=float)
    c = np.asarray(correct, dtype=bool)
    keep = s >= threshold
    return {
        "threshold": threshold,
        "coverage": round(float(keep.mean()), 4),
        "accepted": int(keep.sum()),
        "accuracy_accepted": round(float(c[keep].mean()), 4) if keep.any() else None,
        "review": int((~keep).sum()),
        "accuracy_review": round(float(c[~keep].mean()), 4) if (~keep).any() else None,
    }


def coverage_accuracy_plot(curves: dict[str, tuple[Any, Any]], path: str | Path, title: str,
                           thresholds: tuple[float, ...] = (0.9,)) -> Path:
    """Write the coverage-accuracy curve PNG of one or more scorings of the same documents.

    Args:
        curves: label -> ``(scores, correct)`` (e.g. raw and calibrated scores; a temperature barely
            changes the order of the documents, so those two curves mostly overlap: later ones are dashed).
        path: PNG file to write (parent folders are created).
        title: figure title.
        thresholds: review thresholds marked on the first curve.

    Returns:
        The written path.
    """
    from classify.runs.plots import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    first = True
    for i, (label, (scores, correct)) in enumerate(curves.items()):
        cov, acc, _ = coverage_accuracy(scores, correct)
        ax.plot(cov * 100, acc * 100, label=label, linestyle=("-", "--", ":")[i % 3], linewidth=2 - 0.5 * (i > 0))
        if first:
            for t in thresholds:
                p = at_threshold(scores, correct, t)
                if p["accuracy_accepted"] is not None:
                    ax.plot(p["coverage"] * 100, p["accuracy_accepted"] * 100, "o", color="black")
                    ax.annotate(f"review below {t:g}: {p['review']} docs", (p["coverage"] * 100, p["accuracy_accepted"] * 100),
                                textcoords="offset points", xytext=(-10, -18), ha="right", fontsize=8)
            first = False
    ax.set_xlabel("coverage (% of documents accepted without review, highest scores first)")
    ax.set_ylabel("accuracy of the accepted documents (%)")
    ax.set_title(title)
    ax.set_xlim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    return save_png(fig, path)
