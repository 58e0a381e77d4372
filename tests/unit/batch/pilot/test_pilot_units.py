"""The pilot end to end: a 12-document run of the batch pipeline (real Ray, real vLLM engine actor), plus its failure paths.

One real pilot (module fixture, the README's first command) runs through real Ray and the real vLLM
engine actor; the bookkeeping variants (each batch-only part broken in turn, a Parquet pilot set, the
trace of the shared functions) run the same pipeline over real Ray with a stand-in engine actor
(:mod:`stand_in_actors`), and the parts broken before classification fail before any engine starts.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_pilot.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch.pilot.run import main, run_pilot
from classify.config.sections import PilotConfig, parse_config
from classify.records import Result

ROOT = Path(__file__).resolve().parents[4]
PILOT = ROOT / "data" / "pilot"
"""What every batch run folder holds (docs/batch.md): a pilot's holds them too."""


def test_broken_model_path_stops_at_load_model(pilot_config, tmp_path):
    cfg = parse_config(PilotConfig, {**pilot_config.model_dump(mode="json"), "model": {"base_model": str(tmp_path / "no-model")}})
    outcome = run_pilot(cfg, PILOT)
    assert outcome.stage == "load-model" and outcome.verdict == "fail"
    first = outcome.summary["first_error"]
    assert first["stage"] == "load-model" and first["type"] == "EngineError"
    assert "does not exist" in first["message"]
    decision = json.loads((outcome.run_dir / "decision.json").read_text())
    assert decision["decision"] == "fix-environment"
    assert "load-model" in (outcome.run_dir / "decision.md").read_text()
    assert not (outcome.run_dir / "results.jsonl").exists() and outcome.exit_code == 5


@pytest.mark.parametrize(
    ("make_input", "message"),
    [
        (lambda d: d / "missing", r"pilot input .*missing does not exist"),
        (lambda d: (d / "empty").mkdir() or (d / "empty"), r"holds no documents"),
        (lambda d: _jsonl(d, 3), r"holds 3 documents; the pilot needs exactly 12"),
        (lambda d: _jsonl(d, 12, dup=True), r"duplicate ids in pilot input .*'d0' at"),
    ],
    ids=["missing-path", "empty-folder", "wrong-count", "duplicate-id"],
)
def test_bad_pilot_input_stops_at_read_inputs(pilot_config, tmp_path, make_input, message):
    outcome = run_pilot(pilot_config, make_input(tmp_path))
    assert outcome.stage == "read-inputs" and outcome.exit_code == 3
    assert outcome.summary["first_error"]["type"] == "InputError" and outcome.summary["first_error"]["kind"] == "input"
    import re

    assert re.search(message, outcome.summary["first_error"]["message"])
    assert json.loads((outcome.run_dir / "decision.json").read_text())["decision"] == "revisit-configuration"
    assert (f"Piloted: base {pilot_config.model.base_model} (no adapter); not loaded: the run stopped before load-model"
            in (outcome.run_dir / "decision.md").read_text())  # was "base ?"


def _jsonl(folder: Path, n: int, dup: bool = False) -> Path:
    path = folder / "pilot.jsonl"
    lines = [json.dumps({"id": f"d{0 if dup and i == 1 else i}", "text": f"text {i}", "label": "business"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_reports_the_first_error_and_exit_code(tmp_path, capsys):
    code = main(["--input", str(tmp_path / "nowhere")])
    assert code == 3
    assert "error [input] at stage read-inputs: InputError" in capsys.readouterr().err


def test_a_pilot_set_without_a_planned_reject_fails_its_check(pilot_config):
    from batch.pilot.decision import build_summary

    rows = [Result(id=f"d{i}", status="accepted", category="sport") for i in range(12)]
    summary = build_summary(rows, [r.id for r in rows], {r.id: "sport" for r in rows}, pilot_config)
    check = next(c for c in summary["checks"] if c["name"] == "expected_rejects")
    assert not check["ok"] and "needs at least one planned reject" in check["detail"]
    assert summary["failed_checks"] == ["expected_rejects"] and summary["verdict"] == "fail"


def test_an_adapter_that_never_loads_leaves_the_base_models_gate_alone(pilot_config):
    from classify.paths import pilots_dir

    outcome = run_pilot(pilot_config, PILOT, adapter_ref="nope@1")  # a typo in the adapter name
    assert outcome.stage == "load-adapter" and outcome.exit_code == 4
    assert outcome.summary["first_error"]["type"] == "AdapterNotFound"
    # no verdict recorded: not for the base model alone (it was not what was piloted), nor for the adapter
    records = list(pilots_dir().glob("*.json")) if pilots_dir().exists() else []
    assert not [p.name for p in records if outcome.run_id in p.read_text()]


def test_prompt_mismatch_names_each_prompt_field_the_adapter_was_trained_without(pilot_config):
    from batch.run.adapter import prompt_mismatch

    trained = pilot_config.classify.model_dump(mode="json")
    assert prompt_mismatch({"classify": trained}, pilot_config.classify) == []
    smoke = {**trained, "max_doc_tokens": 48, "max_doc_bytes": 1}  # max_doc_bytes does not shape the prompt
    assert prompt_mismatch({"classify": smoke}, pilot_config.classify) == [
        f"max_doc_tokens: trained 48, piloted {pilot_config.classify.max_doc_tokens}"]
    assert prompt_mismatch({}, pilot_config.classify) == []
    described = {**trained, "descriptions": {"sport": "games and results"}}  # issue 56
    assert prompt_mismatch({"classify": described}, pilot_config.classify) == [
        "descriptions: trained {'sport': 'games and results'}, piloted None"]
    assert prompt_mismatch({"classify": {**trained, "descriptions": {}}}, pilot_config.classify) == []


def _measured(peak_gib: float, est_gib: float | None, machine_gib: float = 16.0, device: str = "cpu") -> dict:
    from batch.pilot.measure import measured_block

    estimate = {"bytes": int(est_gib * 2**30), "parts": {}} if est_gib else None
    return measured_block(device, int(peak_gib * 2**30), docs=12, tokens=2400, seconds=10.0, estimate=estimate,
                          machine_bytes=int(machine_gib * 2**30), detail={})


@pytest.mark.parametrize(
    ("peak", "est", "machine", "gap", "decision", "note"),
    [
        (4.5, 4.8, 16, False, "proceed", None),
        (7.3, 4.8, 16, True, "proceed", "memory gap: the engine's measured peak 7.30 GiB is 1.52x"),
        (2.3, 4.8, 16, True, "proceed", "below it by more than the tolerance 50%"),
        (17.0, 16.5, 16, False, "revisit-configuration", "exceeds the machine's 16.00 GiB"),
        (4.5, None, 16, False, "proceed", "CPU could not be made for this model"),
    ],
    ids=["within", "above", "below", "over-machine", "no-estimate"],
)
def test_memory_gap_is_a_note_unless_the_engine_exceeds_the_machine(pilot_config, peak, est, machine, gap, decision, note):
    from batch.pilot.decision import build_summary, decide, decision_markdown

    labels = json.loads((PILOT / "labels.json").read_text())
    rows = [Result(id=i, status="rejected" if v == "reject" else "accepted", category=None if v == "reject" else v,
                   reason="binary content" if v == "reject" else None) for i, v in labels.items()]
    summary = build_summary(rows, list(labels), labels, pilot_config)
    summary["measured"] = m = _measured(peak, est, machine)
    assert m["gap"] is gap and m["docs_per_s"] == 1.2 and m["tokens_per_s"] == 240.0
    out = decide(summary, "write", None)
    assert out["decision"] == decision
    if note:
        assert any(note in r for r in out["reasons"]), out["reasons"]
    else:
        assert len(out["reasons"]) == 1
    md = decision_markdown("r", out, summary, "base")
    assert "## Measured" in md
    # issue 42 item 2: the CPU figure is the doctor's (one engine on this machine), not `make plan`'s for the lot
    assert "make doctor's estimate for one engine on this machine's CPU" in md + " ".join(out["reasons"])
    assert "make plan's estimate" not in md + " ".join(out["reasons"])


def test_a_failed_measurement_is_recorded_not_raised(pilot_config):
    from batch.pilot.decision import measurement_notes

    assert measurement_notes({"error": "NoSuchProcess: gone"}) == (["memory: not measured (NoSuchProcess: gone)"], False)
    assert measurement_notes(None) == ([], False)


# --- the batch-only parts, each broken in turn (real Ray, stand-in engine actor) ---------------------------------


def test_pipeline_differences_name_each_setting_and_an_old_record():
    from classify.config.batch import RunConfig
    from classify.config.sections import EngineConfig
    from classify.runs.gate import pipeline_differences, pipeline_settings

    piloted = pipeline_settings(EngineConfig(), RunConfig(), None)
    assert pipeline_differences(piloted, piloted) == []
    now = pipeline_settings(EngineConfig(max_num_seqs=4), RunConfig(cpu_actors=2, cpu_bind="auto"), None)
    assert pipeline_differences(piloted, now) == [
        "engine.max_num_seqs: piloted 'auto', now 4", "cpu_actors: piloted 1, now 2", "cpu_bind: piloted 'split', now 'auto'"]
    assert "recorded no pipeline settings" in pipeline_differences(None, now)[0]
