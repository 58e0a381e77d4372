"""Long documents (issue 41) through pilot and batch: real Ray, real run folders, the real tokenizer, prompt builder,
scorer and :class:`classify.engine.build.Classifier` in the actor (:class:`bench.instant_engine.HostEngineActor`: only the
model's forward pass is stood in). A document of 10 x ``max_doc_tokens`` tokens gives ONE row with its windows
counted, the run's summary counts windows and cut documents, and ``results.parquet`` carries the new columns.

The real engine's answers over windows are in ``tests/engine/test_long_documents_engine.py``.
Split by tier: this file holds the ray tests; the others of the same subject are in
``tests/unit/classify/engine/test_long_documents.py`` and ``tests/unit/batch/run/test_long_documents_batch.py``.
"""

from __future__ import annotations

import json

import pytest

from classify.config.sections import PilotConfig
from classify.runs.records import read_jsonl
from tests.support.corpora import long_document

MAX_DOC_TOKENS = 256


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, pilot_config, bbc_dir):
    """A 12-document pilot set: 10 short business notes, one 10x document (label business), one planned reject."""
    from transformers import AutoTokenizer

    from classify.model.model import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(pilot_config.model).path)
    rows = [{"id": f"b{i:02d}", "text": f"Shares of company {i} rose after its quarterly results beat forecasts.",
             "label": "business"} for i in range(10)]
    rows += [{"id": "long", "text": long_document(tok, bbc_dir, 10 * MAX_DOC_TOKENS), "label": "business"},
             {"id": "r01", "text": "", "label": "reject"}]
    path = tmp_path_factory.mktemp("long-set") / "pilot.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _windows_config(pilot_config, max_windows: int) -> PilotConfig:
    classify = pilot_config.classify.model_copy(update={"long_documents": "windows", "max_windows": max_windows})
    return pilot_config.model_copy(update={"classify": classify})


def test_pilot_gives_one_row_for_a_ten_x_document_and_reports_its_windows(local_ray, tmp_path, monkeypatch,
                                                                          pilot_config, corpus):
    from batch.pilot.run import run_pilot
    from bench.instant_engine import remote_class

    for var in ("DOCPILOT_HOME", "DOCPILOT_RUNS", "DOCPILOT_EXPORTS"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    outcome = run_pilot(_windows_config(pilot_config, 16), corpus, _engine_actor=remote_class(host=True))
    assert outcome.stage == "verify", outcome.summary
    rows = {r["id"]: r for r in read_jsonl(outcome.run_dir / "results.jsonl")}
    assert len(rows) == 12
    long = rows["long"]
    assert (long["status"], long["n_windows"], long["n_doc_tokens"], long["truncated"]) == ("accepted", 10, 2560, False)
    assert all(rows[f"b{i:02d}"]["n_windows"] == 1 for i in range(10)) and rows["r01"]["n_windows"] == 0
    block = outcome.summary["long_documents"]
    assert (block["mode"], block["scored"], block["windows"], block["truncated"]) == ("windows", 11, 20, 0)
    assert block["windows_per_doc"] == round(20 / 11, 3)
    assert outcome.summary["n_windows"] == 20 and outcome.summary["truncated"] == 0
    assert "Long documents (windows): 0/11 documents cut" in (outcome.run_dir / "decision.md").read_text()


@pytest.mark.slow  # about 14 s (make test-slow); the pilot's twin (the same pipeline) stays in make test
def test_batch_gives_one_row_for_a_ten_x_document_and_its_summary_counts_windows(local_ray, tmp_path, monkeypatch,
                                                                                pilot_config, corpus):
    import pyarrow.parquet as pq

    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from tests.support.corpora import write_config

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    config = write_config(tmp_path / "windows.json")
    data = json.loads(config.read_text())
    data["classify"].update(long_documents="windows", max_windows=4)  # the 10x document is cut after 4 windows
    data["corpus"].update(id_column="id")
    config.write_text(json.dumps(data))
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", "w", "--skip-pilot-gate",
                       "--no-progress"])
    summary = run_batch(args, _engine_actor=remote_class(host=True))
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "runs" / "w" / "results.jsonl")}
    long = rows["long"]
    assert (long["n_windows"], long["n_doc_tokens"], long["truncated"]) == (4, 4 * MAX_DOC_TOKENS, True)
    assert summary["total"] == 12 and summary["n_windows"] == 14 and summary["truncated"] == 1
    table = pq.read_table(tmp_path / "runs" / "w" / "results.parquet").to_pylist()
    assert {r["id"]: (r["n_windows"], r["truncated"]) for r in table}["long"] == (4, True)
