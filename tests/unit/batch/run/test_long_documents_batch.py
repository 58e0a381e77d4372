"""Long documents (issue 41) in the batch's bookkeeping: summaries count cut documents and windows, the pilot
reports them, ``make plan`` counts the prompts per document (measured by a pilot, else the bound).

Split by tier: the prompt builder and scorer are tested in ``tests/unit/classify/engine/test_long_documents.py``; pilot and
batch over real Ray in ``tests/ray/test_long_documents_ray.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from batch.pilot.decision import build_summary, decision_markdown, long_documents_line
from batch.plan.lots import JobShape, LotsConfig
from batch.plan.plan import build_plan, prompts_plan
from batch.rows import read_rows
from batch.run.merge import Tally
from classify.config.sections import ClassifyConfig, ModelConfig, PilotConfig, parse_config
from classify.records import Result

ROOT = Path(__file__).resolve().parents[4]
WINDOWS = ClassifyConfig(long_documents="windows")


def _rows() -> list[Result]:
    return [Result(id="a", status="accepted", category="sport", score=0.9, n_tokens=900, n_doc_tokens=700, n_windows=3),
            Result(id="b", status="accepted", category="tech", score=0.8, n_tokens=300, n_doc_tokens=200, n_windows=1),
            Result(id="c", status="accepted", category="tech", score=0.8, n_tokens=2800, n_doc_tokens=2048,
                   n_windows=8, truncated=True),
            Result(id="d", status="rejected", reason="empty document")]


def test_the_batch_tally_counts_truncated_documents_and_windows_from_the_shard_bytes():
    body = b"".join(json.dumps(r.row()).encode() + b"\n" for r in _rows())
    _, table = read_rows(body, review=False)
    assert {"n_doc_tokens", "n_windows", "truncated"} <= set(table.schema.names)
    tally = Tally(list(WINDOWS.categories))
    tally.add_table(table)
    counts = tally.counts()
    assert (counts["truncated"], counts["n_windows"], counts["n_tokens"]) == (1, 12, 4000)


def test_rows_written_before_issue_41_still_read_and_count_as_one_window_none_cut():
    old = b'{"id": "o", "status": "accepted", "category": "tech", "score": 0.5, "reason": null, "input_sha256": "", ' \
          b'"n_chars": 3, "n_tokens": 70}\n'
    _, table = read_rows(old, review=False)
    tally = Tally(list(WINDOWS.categories))
    tally.add_table(table)
    assert tally.total == 1 and tally.counts()["truncated"] == 0


def test_the_pilot_summary_reports_the_share_cut_and_windows_per_document():
    cfg = PilotConfig(classify=WINDOWS)
    summary = build_summary(_rows(), ["a", "b", "c", "d"], {"a": "sport", "b": "tech", "c": "tech", "d": "reject"}, cfg)
    block = summary["long_documents"]
    assert block == {"mode": "windows", "max_doc_tokens": 256, "max_windows": 8, "scored": 3, "truncated": 1,
                     "truncated_share": 0.3333, "windows": 12, "windows_per_doc": 4.0, "doc_tokens_per_doc": 982.7,
                     "longest_prompt_tokens": 350}  # c's windows: 94 template ids + 2048 / 8
    md = decision_markdown("r", {"decision": "proceed", "stage_reached": "verify", "reasons": []}, summary, "x")
    assert "1/3 documents cut (33%), 4.0 windows per document" in md
    cut = build_summary(_rows(), ["a", "b", "c", "d"], {}, PilotConfig())["long_documents"]
    assert "Set `classify.long_documents: windows`" in long_documents_line(cut)


def _lots() -> LotsConfig:
    return parse_config(LotsConfig, json.loads((ROOT / "config" / "lots.json").read_text()), "lots.json")


def test_plan_counts_the_pilots_measured_windows_per_document(tmp_path):
    job = JobShape(model=ModelConfig(base_model="llama-2-7b", max_model_len=4096), classify=WINDOWS)
    bound = build_plan(_lots(), job, runs=tmp_path)["prompts"]
    assert bound["prompts_per_doc"] == 8.0 and bound["source"].startswith("max_windows")
    pilot = tmp_path / "20261205T000000Z-pilot-0000abcd"
    pilot.mkdir()
    block = build_summary(_rows(), ["a", "b", "c", "d"], {}, PilotConfig(classify=WINDOWS))["long_documents"]
    (pilot / "summary.json").write_text(json.dumps({"long_documents": block}))
    other = tmp_path / "20261205T010000Z-pilot-0000ef01"  # newer, but measured with another max_windows
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"long_documents": {**block, "max_windows": 4, "windows_per_doc": 2.0}}))
    plan = build_plan(_lots(), job, runs=tmp_path)
    measured = plan["prompts"]
    assert measured["prompts_per_doc"] == 4.0 and measured["source"] == f"pilot {pilot.name} (3 documents)"
    assert measured["documents_at_once"] == plan["memory"]["max_full_sequences"] // 4
    cut = prompts_plan(ClassifyConfig(), 100, tmp_path)
    assert cut["prompts_per_doc"] == 1.0 and cut["documents_at_once"] == 100  # no cut-mode pilot: nothing measured


def test_an_adapter_trained_on_windows_and_piloted_cut_is_named_a_prompt_mismatch():
    from batch.run.adapter import prompt_mismatch

    trained = WINDOWS.model_dump(mode="json")
    assert prompt_mismatch({"classify": trained}, WINDOWS) == []
    assert prompt_mismatch({"classify": trained}, ClassifyConfig()) == ["long_documents: trained 'windows', piloted 'cut'"]
    before_41 = {k: v for k, v in ClassifyConfig().model_dump(mode="json").items() if k not in ("long_documents", "max_windows")}
    assert prompt_mismatch({"classify": before_41}, WINDOWS) == []  # an older card is not compared on it


def test_a_results_parquet_written_before_the_new_columns_still_rechecks(tmp_path):
    import pyarrow.parquet as pq

    from batch.run.export import DROPPED_COLUMNS, LATER_COLUMNS, _ParquetCheck

    body = b"".join(json.dumps(r.row()).encode() + b"\n" for r in _rows())
    _, table = read_rows(body, review=False)
    earlier = [n for n in table.schema.names if n not in LATER_COLUMNS + DROPPED_COLUMNS]
    pq.write_table(table.select(earlier), tmp_path / "old.parquet")
    pq.write_table(table.select([n for n in table.schema.names if n not in DROPPED_COLUMNS]), tmp_path / "issue41.parquet")
    pq.write_table(table, tmp_path / "new.parquet")
    for name in ("old", "issue41", "new"):
        check = _ParquetCheck(tmp_path / f"{name}.parquet", review=False)
        check.take(table, body)
        assert check.finish() == [], name
    pq.write_table(table.select(earlier[:-1]), tmp_path / "bad.parquet")
    assert "columns" in _ParquetCheck(tmp_path / "bad.parquet", review=False).finish()[0]
