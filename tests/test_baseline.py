"""bench/baseline.py: the TF-IDF + LinearSVC baseline's scoring and the baseline-vs-adapter comparison."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sklearn")

from bench import baseline  # noqa: E402

CATS = ("business", "sport")


def test_fit_score_counts_errors_and_per_category():
    train = ["shares profit market bank", "bank profit shares", "goal match team", "team win goal"] * 3
    labels = ["business", "business", "sport", "sport"] * 3
    out = baseline._fit_score(train, labels, ["market shares", "match goal", "profit team goal"],
                              ["business", "sport", "business"], CATS, {"sublinear_tf": True})
    assert out["rows"] == 3 and out["train_rows"] == 12 and out["variant"] == {"sublinear_tf": True}
    assert out["errors"] == 1 and out["accuracy"] == pytest.approx(0.6667)
    assert out["per_category"] == {"business": 0.5, "sport": 1.0}
    assert out["fit_s"] >= 0 and out["docs_per_s"] > 0


def _sections(adapter_accuracy: float) -> dict:
    fig = {"rows": 334, "accuracy": 0.985, "errors": 5, "per_category": {"business": 0.97, "sport": 1.0},
           "fit_s": 3.0, "docs_per_s": 900.0, "train_rows": 1557}
    return {"baseline": {"figures": {"test": fig, "validation": {**fig, "rows": 200, "accuracy": 0.98}}},
            "adapter": {"figures": {"adapter": "bbc-news@9", "n_articles": 334, "adapter_accuracy": adapter_accuracy,
                                    "adapter_per_category": {"business": 0.96, "sport": 1.0}, "adapter_docs_per_s": 4.2}}}


def test_comparison_reads_the_card_and_gives_an_honest_verdict(monkeypatch):
    import adapters.registry

    card = {"metrics": {"wall_s": 890.0, "run_wall_s": 1150.0,
                        "engine": {"accuracy": 0.975, "rows": 200, "per_category": {"business": {"rows": 46, "right": 44}}}},
            "calibration": {"temperature": 1.5, "ece_before": 0.03, "ece_after": 0.01, "fitted_on": "validation split, n=200"}}
    monkeypatch.setattr(adapters.registry, "Registry", lambda: SimpleNamespace(resolve=lambda ref: SimpleNamespace(card=card)))
    lost = baseline.comparison(_sections(0.973))
    assert lost["figures"]["beats_baseline"] is False and "does NOT reach" in lost["markdown"]
    assert lost["figures"]["training_run_wall_s"] == 1150.0 and lost["figures"]["adapter_validation_accuracy"] == 0.975
    assert "T = 1.5" in lost["markdown"] and "44/46" in lost["markdown"] and "(9 errors)" in lost["markdown"]
    won = baseline.comparison(_sections(0.988))
    assert won["figures"]["beats_baseline"] is True and "beats or matches" in won["markdown"]
    assert baseline.comparison({"baseline": _sections(0.9)["baseline"]}) is None
