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
    assert out["fit_s"] >= 0 and out["docs_per_s"] > 0 and "wrong_ids" not in out
    named = baseline._fit_score(train, labels, ["market shares", "match goal", "profit team goal"],
                                ["business", "sport", "business"], CATS, {"sublinear_tf": True}, ids=["a", "b", "c"])
    assert named["wrong_ids"] == ["c"]


def test_mcnemar_p_counts_only_the_discordant_documents():
    # exact two-sided binomial on the discordant pairs: 0 vs 6 -> 2 / 2**6, 0 vs 5 -> 2 / 2**5
    assert baseline.mcnemar_p(set(), {"a", "b", "c", "d", "e", "f"}) == pytest.approx(0.0312, abs=1e-4)
    assert baseline.mcnemar_p({"x"}, {"x", "a", "b", "c", "d", "e"}) == pytest.approx(0.0625)
    # one article each way, or shared errors only: no evidence of a difference
    assert baseline.mcnemar_p({"a", "s"}, {"b", "s"}) == 1.0 and baseline.mcnemar_p({"s"}, {"s"}) == 1.0
    assert baseline.mcnemar_p({"a"}, {"b", "c"}) == 1.0  # P[X <= 1 | n=3] = 4/8, doubled, capped


def _sections(adapter_accuracy: float) -> dict:
    fig = {"rows": 334, "accuracy": 0.985, "errors": 5, "per_category": {"business": 0.97, "sport": 1.0},
           "fit_s": 3.0, "docs_per_s": 900.0, "train_rows": 1557}
    return {"baseline": {"figures": {"test": fig, "validation": {**fig, "rows": 200, "accuracy": 0.98}}},
            # no test_same_rows / wrong_ids: a bench result of before 2026-12-06 still compares
            "adapter": {"figures": {"adapter": "bbc-news@9", "n_articles": 334, "adapter_accuracy": adapter_accuracy,
                                    "adapter_per_category": {"business": 0.96, "sport": 1.0}, "adapter_docs_per_s": 4.2}}}


def test_comparison_reads_the_card_and_gives_an_honest_verdict(monkeypatch):
    import adapters.registry.registry

    card = {"metrics": {"wall_s": 890.0, "run_wall_s": 1150.0,
                        "engine": {"accuracy": 0.975, "rows": 200, "per_category": {"business": {"rows": 46, "right": 44}}}},
            "calibration": {"temperature": 1.5, "ece_before": 0.03, "ece_after": 0.01, "fitted_on": "validation split, n=200"}}
    monkeypatch.setattr(adapters.registry.registry, "Registry", lambda: SimpleNamespace(resolve=lambda ref: SimpleNamespace(card=card)))
    lost = baseline.comparison(_sections(0.973))
    assert lost["figures"]["beats_baseline"] is False and "does NOT reach" in lost["markdown"]
    assert lost["figures"]["training_run_wall_s"] == 1150.0 and lost["figures"]["adapter_validation_accuracy"] == 0.975
    assert "T = 1.5" in lost["markdown"] and "44/46" in lost["markdown"] and "(9 errors)" in lost["markdown"]
    won = baseline.comparison(_sections(0.988))
    assert won["figures"]["beats_baseline"] is True and "The adapter beats the" in won["markdown"]
    tie = baseline.comparison(_sections(0.985))  # the same accuracy is a tie, not a win
    assert tie["figures"]["beats_baseline"] is False and "The adapter matches the" in tie["markdown"]
    assert baseline.comparison({"baseline": _sections(0.9)["baseline"]}) is None
    merged = {"adapter": "bbc-news@9", "n_articles": 334, "accuracy": 0.991,
              "per_category_accuracy": {"business": 0.98, "sport": 1.0}, "docs_per_s": 6.1}
    via_merged = baseline.comparison({"baseline": _sections(0.9)["baseline"], "adapter_merged": {"figures": merged}})
    assert via_merged["figures"]["adapter_test_accuracy"] == 0.991 and via_merged["figures"]["beats_baseline"] is True
    assert "adapter bbc-news@9 (merged)" in via_merged["markdown"] and "| test business | 97.0% | 98.0% |" in via_merged["markdown"]
    assert via_merged["figures"]["mcnemar_p_all_rows"] is None and via_merged["figures"]["beats_baseline_same_rows"] is None


def test_comparison_sets_the_adapter_against_both_baseline_fits_with_mcnemar(monkeypatch):
    import adapters.registry.registry

    card = {"training": {"data": {"train_rows": 1357}}, "metrics": {"engine": {"accuracy": 0.98, "rows": 200}}}
    monkeypatch.setattr(adapters.registry.registry, "Registry", lambda: SimpleNamespace(resolve=lambda ref: SimpleNamespace(card=card)))
    ids = [f"bbc-test-{i:04d}" for i in range(334)]
    pc = {"business": 0.97, "sport": 1.0}
    all_rows = {"rows": 334, "accuracy": 0.985, "errors": 5, "per_category": pc, "fit_s": 2.2, "docs_per_s": 1500.0,
                "train_rows": 1557, "wrong_ids": ids[:5]}
    same_rows = {**all_rows, "accuracy": 0.979, "errors": 7, "train_rows": 1357, "wrong_ids": ids[:4] + ids[10:13]}
    merged = {"adapter": "bbc-news@2", "n_articles": 334, "accuracy": 0.982, "per_category_accuracy": pc,
              "docs_per_s": 0.8, "wrong_ids": ids[:3] + ids[20:23]}
    out = baseline.comparison({"baseline": {"figures": {"test": all_rows, "test_same_rows": same_rows,
                                                        "validation": {**all_rows, "rows": 200, "accuracy": 0.98}}},
                               "adapter_merged": {"figures": merged}})
    f = out["figures"]
    assert f["beats_baseline"] is False and f["beats_baseline_same_rows"] is True
    assert (f["adapter_train_rows"], f["baseline_same_rows_train_rows"], f["baseline_train_rows"]) == (1357, 1357, 1557)
    # adapter alone wrong on 3 (ids 20-22), same-rows baseline alone on 4 (id 3, ids 10-12): p = 1.0
    assert f["mcnemar_p_same_rows"] == 1.0 and f["mcnemar_p_all_rows"] == 1.0
    md = out["markdown"]
    assert "beats the TF-IDF + LinearSVC baseline fitted on the same 1357 training rows (98.2% vs 97.9%)" in md
    assert "3 articles wrong for the adapter alone, 4 for the baseline alone, exact McNemar p = 1.00, not a significant" in md
    assert "does NOT reach the TF-IDF + LinearSVC baseline fitted on all 1557 rows of train.csv (98.2% vs 98.5%)" in md
    quick = baseline.comparison({"baseline": {"figures": {"test": all_rows, "validation": all_rows}},
                                 "adapter_merged": {"figures": {**merged, "n_articles": 40, "wrong_ids": ids[:1]}}})
    assert quick["figures"]["mcnemar_p_all_rows"] is None  # 40 articles against 334: not paired
    header = next(line for line in md.splitlines() if line.startswith("| |"))
    assert header.count("|") == 5 and all(line.count("|") == 5 for line in md.splitlines() if line.startswith("| "))


def test_trials_table_marks_the_best_validation_run(tmp_path):
    import json

    from bench import trials

    for name, lr, acc in (("a", 5e-4, 0.97), ("b", 1e-3, 0.985), ("c", 2e-3, None)):
        run = tmp_path / name
        run.mkdir()
        cfg = {"training": {"max_steps": 200, "learning_rate": lr}, "lora": {"rank": 8}}
        (run / "config.json").write_text(json.dumps({"config": cfg}))
        if acc is not None:
            eng = {"accuracy": acc, "rows": 200, "per_category": {"business": {"rows": 46, "right": 44}},
                   "calibration": {"temperature": 1.3}}
            (run / "summary.json").write_text(json.dumps({"checks": {"engine": eng}, "wall_s": 900, "run_wall_s": 1100,
                                                          "cpu_s": 1700}))
    md = trials.table([trials.load_trial(tmp_path / n) for n in "abc"])
    assert "`training.learning_rate`" in md and "`lora.rank`" not in md  # only the settings that differ
    assert "| b (chosen) | 0.001 | 98.5% (n=200) | business 44/46 | 1.3 | 900 | 1100 | 1700 |" in md
    assert "| c | 0.002 | not finished |" in md and "a (chosen)" not in md
