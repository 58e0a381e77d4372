"""Score calibration, review flags and the quality reports (accuracy, confusion matrix, pictures).

Fast tests: a fake tokenizer and fake vLLM outputs drive the real :class:`classify.engine.scoring.Scorer`
through the offline (pilot, batch) and async (serve) classifiers, and the reports run on
hand-made result rows.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/report/test_quality.py``, ``tests/engine/test_quality_engine.py``.
"""

from __future__ import annotations

import json

from classify.config.sections import ClassifyConfig

# first-token log-probs the fake engine answers with (already normalised over the categories)


# --- review flags and the report --------------------------------------------------------------------------------


# --- corpus labels, streamed in results order -------------------------------------------------------------------


# --- a labelled pilot (stand-in engine: the bookkeeping and the pictures are under test) --------------------------

def test_a_labelled_pilot_writes_the_confusion_matrix_accuracy_and_review_counts(local_ray, pilot_config, tmp_path,
                                                                                monkeypatch):
    """A pilot (a batch run) over real Ray with a stand-in engine answering each label, except doc03 (-> tech, 0.4)."""
    from pathlib import Path

    from batch.pilot.run import run_pilot
    from tests.support.stand_in_actors import answer_actor

    for var in ("DOCPILOT_HOME", "DOCPILOT_RUNS"):  # a stand-in's verdict must not open the real model's gate
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    pilot = Path(__file__).resolve().parents[2] / "data" / "pilot"
    labels = json.loads((pilot / "labels.json").read_text())
    answers = {i: ("tech", 0.4) if i == "doc03.txt" else (lab, 0.9) for i, lab in labels.items() if lab != "reject"}
    cfg = pilot_config.model_copy(update={"classify": pilot_config.classify.model_copy(update={"review_below_score": 0.5})})
    outcome = run_pilot(cfg, pilot, export_root=tmp_path / "exports", _engine_actor=answer_actor(answers))
    summary = json.loads((outcome.run_dir / "summary.json").read_text())
    assert summary["accuracy"] == round(10 / 11, 4)
    quality = summary["quality"]
    assert quality["labelled"]["accuracy"] == summary["accuracy"] and quality["labelled"]["planned_rejects"] == 1
    assert quality["labelled"]["per_category"]["business"] == {"documents": 3, "correct": 2, "accuracy": 0.6667,
                                                               "precision": 1.0, "rejected": 0}
    assert summary["review"] == {"below_score": 0.5, "flagged": 1, "by_category": {
        "business": 0, "entertainment": 0, "politics": 0, "sport": 0, "tech": 1}}
    assert quality["labelled"]["by_review"]["below"] == {"documents": 1, "correct": 0, "accuracy": 0.0}
    for name in ("confusion_matrix.png", "category_distribution.png", "score_histogram.png", "quality.md"):
        assert (outcome.run_dir / name).is_file() and (outcome.export_dir / name).is_file(), name
    rows = [json.loads(line) for line in (outcome.run_dir / "results.jsonl").read_text().splitlines()]
    assert [r.get("review") for r in rows if r["id"] in ("doc03.txt", "doc04.txt", "doc12.png")] == [True, False, None]


# --- batches over a labelled and an unlabelled corpus (real local Ray, the instant bench engine) -------------------

def _batch(tmp_path, monkeypatch, corpus, batch_id, classify=None):
    from pathlib import Path

    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    data = json.loads((Path(__file__).resolve().parents[2] / "config" / "docpilot.json").read_text())
    data["classify"].update(classify or {})
    config = tmp_path / f"{batch_id}.json"
    config.write_text(json.dumps(data))
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", batch_id,
                       "--skip-pilot-gate", "--no-progress"])
    return run_batch(args, _engine_actor=remote_class())


def test_a_labelled_batch_reports_accuracy_and_an_unlabelled_one_does_not(local_ray, tmp_path, monkeypatch, bbc_dir):
    import csv

    with (bbc_dir / "test.csv").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))[:60]
    labelled = tmp_path / "labelled.csv"
    with labelled.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, ["text", "category"])
        w.writeheader()
        w.writerows(rows)
    first = ClassifyConfig().categories[0]  # the instant engine answers the first category, score 1.0
    summary = _batch(tmp_path, monkeypatch, labelled, "lab", {"review_below_score": 0.5})
    n_first = sum(r["category"] == first for r in rows)
    assert summary["accuracy"] == round(n_first / 60, 4)
    assert summary["quality"]["labelled"]["per_category"][first]["correct"] == n_first
    assert summary["review"]["flagged"] == 0 and summary["quality"]["label_column"] == "category"
    run, export = tmp_path / "runs" / "lab", tmp_path / "exports" / "lab"
    stored = json.loads((run / "summary.json").read_text())
    assert stored["accuracy"] == summary["accuracy"]
    for name in ("confusion_matrix.png", "category_distribution.png", "score_histogram.png", "quality.md"):
        assert (run / name).is_file() and (export / name).is_file(), name
    import pyarrow.parquet as pq

    assert pq.read_schema(run / "results.parquet").names[-1] == "review"  # the threshold adds the column

    unlabelled = tmp_path / "plain.jsonl"
    unlabelled.write_text("".join(json.dumps({"id": f"u{i}", "text": r["text"]}) + "\n" for i, r in enumerate(rows[:20])))
    summary = _batch(tmp_path, monkeypatch, unlabelled, "plain")
    run = tmp_path / "runs" / "plain"
    assert "accuracy" not in summary and "labelled" not in summary["quality"] and "review" not in summary
    text = (run / "quality.md").read_text()
    assert not (run / "confusion_matrix.png").exists() and "no labels: no accuracy" in text and "labelled documents" not in text
    assert (run / "category_distribution.png").is_file() and (run / "score_histogram.png").is_file()
    assert all("review" not in json.loads(line) for line in (run / "results.jsonl").read_text().splitlines())
    assert "review" not in pq.read_schema(run / "results.parquet").names  # no threshold: no review column
