"""bench.coverage: the coverage-accuracy curve and the figures at a review threshold."""

import numpy as np
import pytest

from bench.coverage import at_threshold, coverage_accuracy, coverage_accuracy_plot


def test_curve_takes_highest_scores_first():
    cov, acc, thr = coverage_accuracy([0.2, 0.9, 0.6, 0.95], [False, True, False, True])
    assert cov.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert thr.tolist() == [0.95, 0.9, 0.6, 0.2]
    assert acc.tolist() == [1.0, 1.0, pytest.approx(2 / 3), 0.5]


def test_threshold_splits_accepted_and_review():
    p = at_threshold([0.2, 0.9, 0.6, 0.95], [False, True, True, True], 0.7)
    assert (p["accepted"], p["review"], p["coverage"]) == (2, 2, 0.5)
    assert p["accuracy_accepted"] == 1.0 and p["accuracy_review"] == 0.5
    assert at_threshold([0.5], [True], 0.9)["accuracy_accepted"] is None


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one length"):
        coverage_accuracy([0.1, 0.2], [True])


def test_plot_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    s = rng.uniform(0.3, 1, 200)
    ok = rng.uniform(size=200) < s
    out = coverage_accuracy_plot({"raw": (s, ok)}, tmp_path / "c.png", "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
