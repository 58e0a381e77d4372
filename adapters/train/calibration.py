"""Score calibration: expected calibration error, temperature scaling and a reliability diagram.

Definitions follow Guo et al. 2017, "On Calibration of Modern Neural Networks":

* ECE with ``n_bins`` equal-width confidence bins over [0, 1]:
  ``sum_b |B_b| / n * |acc(B_b) - conf(B_b)|`` where a score ``s`` falls in bin
  ``min(floor(s * n_bins), n_bins - 1)`` (so 1.0 is in the last bin).
* Temperature scaling: probabilities ``softmax(logprobs / T)`` over the ``k`` categories, ``T > 0``
  fitted by minimising the negative log-likelihood of the true labels on a held-out split.
  ``T > 1`` softens over-confident scores, ``T < 1`` sharpens; the argmax (the answer) never changes.
* Few rows without an error: the plain NLL then falls all the way to ``T -> 0`` (every score 1.0), so
  :func:`fit_temperature` fits to label-smoothed targets (Szegedy et al. 2016, "Rethinking the Inception
  Architecture", section 7) with the smoothing of Laplace's rule of succession: after ``n`` rows the chance of
  an error is taken as at least ``1 / (n + 2)``, spread over the other ``k - 1`` categories. The fitted
  scores then stay near ``1 - 1/(n + 2)`` on an error-free split (0.917 on 10 rows, 0.995 on 200) instead
  of 1.0, and on a split with errors the optimum moves only by that share.

Only numpy is needed at import time; :func:`fit_temperature` uses scipy's bounded scalar
minimiser when scipy is installed, else a golden-section search on ``log T`` (same optimum);
:func:`reliability_diagram` imports matplotlib when called.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from classify.runs.plots import pyplot, save_png

T_MIN = 0.05
"""Smallest temperature :func:`fit_temperature` returns."""

T_MAX = 20.0
"""Largest temperature :func:`fit_temperature` returns."""


def _as_scores(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float).reshape(-1)
    c = np.asarray(correct, dtype=bool).reshape(-1)
    if s.shape != c.shape:
        raise ValueError(f"scores and correct must have the same length, got {s.shape[0]} and {c.shape[0]}")
    if s.size and (not np.all(np.isfinite(s)) or s.min() < 0.0 or s.max() > 1.0):
        raise ValueError("scores must be finite probabilities in [0, 1]")
    return s, c


def calibration_bins(scores: Any, correct: Any, n_bins: int = 15) -> list[dict[str, float]]:
    """Per-bin counts, mean confidence and accuracy for ``n_bins`` equal-width bins over [0, 1].

    Args:
        scores: ``n`` confidences (the answer's probability), each in [0, 1].
        correct: ``n`` booleans, whether each answer was right.
        n_bins: number of bins (>= 1).

    Returns:
        ``n_bins`` dicts ``{"lo", "hi", "count", "confidence", "accuracy"}``; ``confidence`` and
        ``accuracy`` are ``nan`` for an empty bin.

    Raises:
        ValueError: lengths differ, a score is outside [0, 1] or not finite, or ``n_bins < 1``.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    s, c = _as_scores(scores, correct)
    idx = np.minimum((s * n_bins).astype(int), n_bins - 1)
    out = []
    for b in range(n_bins):
        mask = idx == b
        n = int(mask.sum())
        out.append({"lo": b / n_bins, "hi": (b + 1) / n_bins, "count": n,
                    "confidence": float(s[mask].mean()) if n else math.nan,
                    "accuracy": float(c[mask].mean()) if n else math.nan})
    return out


def expected_calibration_error(scores: Any, correct: Any, n_bins: int = 15) -> float:
    """Expected calibration error (Guo et al. 2017) with ``n_bins`` equal-width bins.

    Args:
        scores: ``n`` confidences in [0, 1] (array-like of floats).
        correct: ``n`` booleans (array-like), whether each answer was right.
        n_bins: number of equal-width bins over [0, 1] (default 15).

    Returns:
        ECE in [0, 1] (0.0 for no rows): the count-weighted mean of ``|accuracy - confidence|`` per bin.

    Raises:
        ValueError: lengths differ, a score is outside [0, 1] or not finite, or ``n_bins < 1``.
    """
    bins = calibration_bins(scores, correct, n_bins)
    n = sum(b["count"] for b in bins)
    if n == 0:
        return 0.0
    return float(sum(b["count"] / n * abs(b["accuracy"] - b["confidence"]) for b in bins if b["count"]))


def _check_logprobs(logprobs: Any) -> np.ndarray:
    lp = np.asarray(logprobs, dtype=float)
    if lp.ndim != 2 or lp.shape[1] < 2:
        raise ValueError(f"logprobs must be an (n, k) array with k >= 2 categories, got shape {lp.shape}")
    if not np.all(np.isfinite(lp)):
        raise ValueError("logprobs must be finite (use a large negative number for a category with no mass)")
    return lp


def apply_temperature(logprobs: Any, temperature: float) -> np.ndarray:
    """Category probabilities ``softmax(logprobs / T)``, renormalised over the ``k`` categories.

    Args:
        logprobs: ``(n, k)`` log-probabilities (or any logits) of the ``k`` categories per row.
        temperature: ``T > 0``; 1.0 gives the renormalised raw probabilities.

    Returns:
        ``(n, k)`` float array, each row sums to 1.

    Raises:
        ValueError: ``T`` is not a positive finite number, or ``logprobs`` is not a finite ``(n, k)`` array.
    """
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    z = _check_logprobs(logprobs) / float(temperature)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _nll(lp: np.ndarray, labels: np.ndarray, temperature: float, smoothing: float = 0.0) -> float:
    z = lp / temperature
    m = z.max(axis=1)
    log_p = z - (m + np.log(np.exp(z - m[:, None]).sum(axis=1)))[:, None]
    rows = np.arange(len(labels))
    true = log_p[rows, labels]
    if not smoothing:
        return float(-np.mean(true))
    other = (log_p.sum(axis=1) - true) / (lp.shape[1] - 1)
    return float(-np.mean((1 - smoothing) * true + smoothing * other))


def succession_smoothing(n: int) -> float:
    """Laplace's rule of succession: the least error chance ``1 / (n + 2)`` credited after ``n`` labelled rows."""
    return 1.0 / (n + 2)


def negative_log_likelihood(logprobs: Any, labels: Any, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood (nats per row) of ``labels`` under ``softmax(logprobs / T)``.

    Raises:
        ValueError: as :func:`fit_temperature`.
    """
    lp, lab = _check_fit_inputs(logprobs, labels)
    return _nll(lp, lab, temperature)


def _check_fit_inputs(logprobs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    lp = _check_logprobs(logprobs)
    lab = np.asarray(labels).reshape(-1)
    if lab.shape[0] != lp.shape[0] or lp.shape[0] == 0:
        raise ValueError(f"need one label per row and at least one row, got {lab.shape[0]} labels for {lp.shape[0]} rows")
    if not np.issubdtype(lab.dtype, np.integer) or lab.min() < 0 or lab.max() >= lp.shape[1]:
        raise ValueError(f"labels must be integer category indices in [0, {lp.shape[1] - 1}]")
    return lp, lab.astype(int)


def fit_temperature(logprobs: Any, labels: Any, smoothing: float | None = None) -> float:
    """The temperature minimising the cross-entropy of label-smoothed targets under ``softmax(logprobs / T)``.

    The target of a row puts ``1 - smoothing`` on its label and ``smoothing / (k - 1)`` on each other category.
    With ``smoothing = 0`` this is the plain NLL of ``labels``, whose minimum on a split without errors lies at
    ``T -> 0`` (the search then ends at :data:`T_MIN` and every score is 1.0: no review threshold can work);
    any ``smoothing > 0`` gives a finite optimum, where the mean score is about ``1 - smoothing``.

    Args:
        logprobs: ``(n, k)`` per-category log-probabilities (float array) of the held-out rows.
        labels: ``(n,)`` integer index of each row's true category (column of ``logprobs``).
        smoothing: the error share credited to the other categories, in [0, 0.5]; ``None`` (default):
            :func:`succession_smoothing` of ``n``, ``1 / (n + 2)``.

    Returns:
        ``T`` in [:data:`T_MIN`, :data:`T_MAX`] (bounded 1-D search on ``log T``).

    Raises:
        ValueError: shapes disagree, no rows, a label is outside ``[0, k)``, a log-prob is not finite, or
            ``smoothing`` is outside [0, 0.5].
    """
    lp, lab = _check_fit_inputs(logprobs, labels)
    eps = succession_smoothing(len(lab)) if smoothing is None else float(smoothing)
    if not 0.0 <= eps <= 0.5:
        raise ValueError(f"smoothing must be in [0, 0.5], got {smoothing!r}")
    lo, hi = math.log(T_MIN), math.log(T_MAX)

    def loss(u: float) -> float:
        return _nll(lp, lab, math.exp(u), eps)

    try:
        from scipy.optimize import minimize_scalar
    except ImportError:
        minimize_scalar = None
    if minimize_scalar is not None:
        u = float(minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-5}).x)
    else:
        g = (math.sqrt(5) - 1) / 2
        a, b = lo, hi
        c, d = b - g * (b - a), a + g * (b - a)
        fc, fd = loss(c), loss(d)
        while b - a > 1e-5:
            if fc < fd:
                b, d, fd = d, c, fc
                c = b - g * (b - a)
                fc = loss(c)
            else:
                a, c, fc = c, d, fd
                d = a + g * (b - a)
                fd = loss(d)
        u = (a + b) / 2
    for edge in (lo, hi):  # a monotone loss ends at a bound
        if loss(edge) < loss(u):
            u = edge
    return float(math.exp(u))


def reliability_diagram(scores: Any, correct: Any, path: str | Path, title: str, n_bins: int = 15) -> Path:
    """Write a reliability diagram PNG: accuracy per confidence bin against the diagonal, with counts.

    Args:
        scores: ``n`` confidences in [0, 1].
        correct: ``n`` booleans.
        path: PNG file to write (parent folders are created).
        title: figure title (the ECE and ``n`` are appended).
        n_bins: equal-width bins (default 15, as :func:`expected_calibration_error`).

    Returns:
        The written path.

    Raises:
        ValueError: as :func:`calibration_bins`.
    """
    plt = pyplot()

    bins = calibration_bins(scores, correct, n_bins)
    ece = expected_calibration_error(scores, correct, n_bins)
    n = sum(b["count"] for b in bins)
    width = 1.0 / n_bins
    lefts = [b["lo"] for b in bins]
    acc = [0.0 if b["count"] == 0 else b["accuracy"] for b in bins]
    fig, (ax, axc) = plt.subplots(2, 1, figsize=(6.4, 7.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.bar(lefts, acc, width=width, align="edge", edgecolor="black", color="#4C72B0", label="accuracy in bin")
    for b in bins:
        if b["count"]:
            ax.bar(b["lo"], b["confidence"] - b["accuracy"], bottom=b["accuracy"], width=width, align="edge",
                   color="#DD8452", alpha=0.45, edgecolor="#DD8452", hatch="//")
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    from matplotlib.patches import Patch

    handles = ax.get_legend_handles_labels()[0] + [
        Patch(facecolor="#DD8452", alpha=0.45, hatch="//", edgecolor="#DD8452", label="gap to the bin's mean score")]
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (fraction right)")
    ax.set_title(f"{title}\nECE {ece * 100:.2f}% ({n_bins} bins), n = {n}")
    ax.legend(handles=handles, loc="upper left")
    counts = [b["count"] for b in bins]
    axc.bar(lefts, counts, width=width, align="edge", edgecolor="black", color="#8C8C8C")
    for b in bins:
        if b["count"]:
            axc.text(b["lo"] + width / 2, b["count"], str(b["count"]), ha="center", va="bottom", fontsize=7)
    axc.set_ylabel("documents")
    axc.set_xlabel("score (probability of the chosen category)")
    return save_png(fig, path)
