"""adapters/train/calibration.py: ECE, temperature scaling, reliability diagram."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.train import calibration as cal


def _overconfident(n: int = 2000, k: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits whose softmax at T=1 is far too sure: true calibrated logits scaled by 4."""
    rng = np.random.default_rng(seed)
    true_logits = rng.normal(0.0, 1.0, size=(n, k))
    probs = np.exp(true_logits) / np.exp(true_logits).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(k, p=p) for p in probs])
    return 4.0 * true_logits, labels


def test_ece_known_values():
    # all in one bin: mean score 0.9, accuracy 0.5 -> ECE 0.4
    assert cal.expected_calibration_error([0.9, 0.9], [True, False]) == pytest.approx(0.4)
    # perfectly calibrated bins -> 0
    assert cal.expected_calibration_error([1.0, 1.0, 0.5, 0.5], [True, True, True, False]) == pytest.approx(0.0)
    # two bins weighted by count: |1-0.95|*2/3 + |0-0.2|*1/3
    assert cal.expected_calibration_error([0.95, 0.95, 0.2], [True, True, False]) == pytest.approx(0.05 * 2 / 3 + 0.2 / 3)
    assert cal.expected_calibration_error([], []) == 0.0
    with pytest.raises(ValueError):
        cal.expected_calibration_error([1.2], [True])
    with pytest.raises(ValueError):
        cal.expected_calibration_error([0.5, 0.5], [True])


def test_bins_put_score_one_in_last_bin():
    bins = cal.calibration_bins([1.0, 0.0, 0.5], [True, False, True], n_bins=15)
    assert len(bins) == 15
    assert bins[-1]["count"] == 1 and bins[0]["count"] == 1 and bins[7]["count"] == 1


def test_apply_temperature_rows_sum_to_one_and_keep_argmax():
    lp = np.log(np.array([[0.7, 0.2, 0.1], [0.05, 0.9, 0.05]]))
    for t in (0.5, 1.0, 3.0):
        p = cal.apply_temperature(lp, t)
        assert np.allclose(p.sum(axis=1), 1.0)
        assert (p.argmax(axis=1) == lp.argmax(axis=1)).all()
    assert np.allclose(cal.apply_temperature(lp, 1.0), np.exp(lp))
    assert cal.apply_temperature(lp, 3.0)[0, 0] < 0.7 < cal.apply_temperature(lp, 0.5)[0, 0]
    with pytest.raises(ValueError):
        cal.apply_temperature(lp, 0.0)
    with pytest.raises(ValueError):
        cal.apply_temperature(np.zeros(3), 1.0)


def test_fit_temperature_lowers_ece_on_overconfident_set():
    lp, labels = _overconfident()
    t = cal.fit_temperature(lp, labels)
    assert 3.0 < t < 5.5  # the logits were scaled by 4
    before = cal.apply_temperature(lp, 1.0)
    after = cal.apply_temperature(lp, t)
    rows = np.arange(len(labels))
    ece_before = cal.expected_calibration_error(before.max(axis=1), before.argmax(axis=1) == labels)
    ece_after = cal.expected_calibration_error(after.max(axis=1), after.argmax(axis=1) == labels)
    assert ece_before > 0.2
    assert ece_after < ece_before / 3
    assert cal.negative_log_likelihood(lp, labels, t) < cal.negative_log_likelihood(lp, labels, 1.0)
    assert (after.argmax(axis=1) == before.argmax(axis=1)).all()
    assert after[rows, labels].mean() != before[rows, labels].mean()


def test_fit_temperature_without_scipy_finds_same_optimum(monkeypatch):
    lp, labels = _overconfident(n=500, seed=1)
    with_scipy = cal.fit_temperature(lp, labels)
    import builtins

    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    assert cal.fit_temperature(lp, labels) == pytest.approx(with_scipy, rel=1e-3)


def test_fit_temperature_refuses_bad_input():
    with pytest.raises(ValueError):
        cal.fit_temperature(np.zeros((3, 2)), np.array([0, 1]))
    with pytest.raises(ValueError):
        cal.fit_temperature(np.zeros((2, 2)), np.array([0, 2]))
    with pytest.raises(ValueError):
        cal.fit_temperature(np.array([[0.0, -math.inf]]), np.array([0]))


def test_reliability_diagram_writes_png(tmp_path):
    lp, labels = _overconfident(n=300)
    p = cal.apply_temperature(lp, 1.0)
    out = cal.reliability_diagram(p.max(axis=1), p.argmax(axis=1) == labels, tmp_path / "sub" / "rel.png", "synthetic")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _error_free(n: int, k: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows all answered right by a sure model: the true category's log-prob about -0.05, the rest -4 to -8."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=n)
    lp = rng.uniform(-8.0, -4.0, size=(n, k))
    lp[np.arange(n), labels] = rng.uniform(-0.1, -0.01, size=n)
    return lp, labels


@pytest.mark.parametrize("n", [5, 10, 40])
def test_an_error_free_tiny_split_keeps_the_scores_below_one(n):
    """Few validation rows, all right (the few-label regime of issue 56): the plain NLL runs T to its floor and
    every score to 1.0; the rule-of-succession smoothing keeps a finite T and scores near 1 - 1/(n + 2)."""
    lp, labels = _error_free(n)
    plain = cal.fit_temperature(lp, labels, smoothing=0.0)
    assert plain < 2 * cal.T_MIN  # what the old fit gave: T at its floor (within the search tolerance)
    assert cal.apply_temperature(lp, plain).max(axis=1).min() > 1 - 1e-12
    t = cal.fit_temperature(lp, labels)
    assert t > 4 * cal.T_MIN
    scores = cal.apply_temperature(lp, t).max(axis=1)
    assert scores.max() < 1 - 1e-4 and len(np.unique(np.round(scores, 6))) > n // 2  # scores still rank documents
    assert abs(scores.mean() - (1 - 1 / (n + 2))) < 0.05
    threshold = np.quantile(scores, 0.2)  # a review threshold still sends some documents to review, not none
    assert 0 < (scores < threshold).sum() < n


def test_the_smoothing_moves_a_fit_with_errors_only_a_little():
    lp, labels = _overconfident()
    assert cal.fit_temperature(lp, labels) == pytest.approx(cal.fit_temperature(lp, labels, smoothing=0.0), rel=0.05)
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 0.5\], got 0.7"):
        cal.fit_temperature(lp, labels, smoothing=0.7)
