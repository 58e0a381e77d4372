"""The pilot end to end: a 12-document run of the batch pipeline (real Ray, real vLLM engine actor), plus its failure paths.

One real pilot (module fixture, the README's first command) runs through real Ray and the real vLLM
engine actor; the bookkeeping variants (each batch-only part broken in turn, a Parquet pilot set, the
trace of the shared functions) run the same pipeline over real Ray with a stand-in engine actor
(:mod:`stand_in_actors`), and the parts broken before classification fail before any engine starts.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/pilot/test_pilot_units.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batch.pilot.run import run_pilot
from batch.run.export import check_export
from classify.runs.export import verify_export
from classify.runs.gate import combo_key, pilot_status
from classify.runs.records import read_jsonl
from tests.support.stand_in_actors import answer_actor

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "data" / "pilot"
RUN_FILES = {"results.jsonl", "summary.json", "params.json", "environment.json", "decision.json", "decision.md", "inputs.json"}
BATCH_FILES = {"manifest.json", "shards", "progress.json", "results.jsonl", "results.parquet", "summary.json", "quality.md"}
"""What every batch run folder holds (docs/batch.md): a pilot's holds them too."""


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Run folders, exports and pilot records of one test in its own folder (a stand-in pilot's verdict
    must not open the real base model's gate for other tests)."""
    for var, sub in (("DOCPILOT_HOME", "home"), ("DOCPILOT_RUNS", "runs"), ("DOCPILOT_EXPORTS", "exports"),
                     ("DOCPILOT_REGISTRY", "registry")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path


@pytest.fixture(scope="module")
def default_trial(pilot_config):
    """`make pilot` as the README's first command: data/pilot, the shipped config, real Ray + real vLLM actor."""
    return run_pilot(pilot_config, PILOT, config_path="config/docpilot.json")


@pytest.mark.engine
def test_default_pilot_accounts_for_every_id_once(default_trial, pilot_config):
    rows = read_jsonl(default_trial.run_dir / "results.jsonl")
    ids = [r["id"] for r in rows]
    expected = sorted(json.loads((PILOT / "labels.json").read_text()))
    assert sorted(ids) == expected and len(set(ids)) == len(ids) == 12
    summary = json.loads((default_trial.run_dir / "summary.json").read_text())
    assert summary["accepted"] + summary["rejected"] == summary["total"] == 12
    assert summary["duplicate_ids"] == [] and summary["unknown_ids"] == [] and summary["missing_ids"] == []
    for row in rows:
        if row["status"] == "accepted":
            assert row["category"] in pilot_config.classify.categories
            assert 0.0 <= row["score"] <= 1.0 and row["n_tokens"] > 0 and row["reason"] is None
        else:
            assert row["reason"]


@pytest.mark.engine
def test_planned_reject_is_rejected_with_reason(default_trial):
    rows = {r["id"]: r for r in read_jsonl(default_trial.run_dir / "results.jsonl")}
    assert rows["doc12.png"]["status"] == "rejected"
    assert rows["doc12.png"]["reason"].startswith("binary content")
    summary = json.loads((default_trial.run_dir / "summary.json").read_text())
    assert summary["expected_rejects_matched"] == 1


@pytest.mark.engine
def test_run_folder_is_a_batch_run_folder_and_decision_follows_accuracy(default_trial, pilot_config):
    assert RUN_FILES | BATCH_FILES <= {p.name for p in default_trial.run_dir.iterdir()}
    summary = json.loads((default_trial.run_dir / "summary.json").read_text())
    decision = json.loads((default_trial.run_dir / "decision.json").read_text())
    params = json.loads((default_trial.run_dir / "params.json").read_text())
    manifest = json.loads((default_trial.run_dir / "manifest.json").read_text())
    assert params["model"]["fingerprint"].startswith("sha256:")
    assert params["config_sha256"] and params["code"]["commit"]
    # the pipeline it ran: the batch config's engine section, actors, binding
    assert params["pipeline"] == {"engine": pilot_config.engine.model_dump(mode="json"), "cpu_actors": 1,
                                  "actor_num_cpus": 1.0, "cpu_bind": "split", "adapter_mode": None}
    assert manifest["corpus"]["format"] == "dir" and manifest["corpus"]["distinct_ids"] == 12
    assert summary["this_attempt"]["actors"] == 1 and summary["this_attempt"]["compiled"] == ["false"]
    assert default_trial.stage == "verify" and summary["stage_reached"] == "verify"
    if summary["accuracy"] < pilot_config.thresholds.min_accuracy:
        assert summary["verdict"] == "fail" and "accuracy" in summary["failed_checks"]
        assert decision["decision"] == "revisit-configuration"  # the README's first result with the base model
        assert any("accuracy" in r for r in decision["reasons"])
    else:
        assert decision["decision"] == "proceed" and summary["verdict"] == "pass"
    # the outcome is recorded for (base model, no adapter, config), with the pipeline it proved
    key = combo_key(params["model"]["fingerprint"], None, params["classification_sha256"])
    assert pilot_status(key)["run_id"] == default_trial.run_id
    assert pilot_status(key)["pipeline"] == params["pipeline"]


@pytest.mark.engine
def test_export_copy_passes_the_batch_recheck_and_tampering_is_caught(default_trial, tmp_path):
    assert default_trial.export_dir is not None
    assert verify_export(default_trial.export_dir, check_export) == []
    assert (Path(default_trial.export_dir) / "results.parquet").is_file()
    copy = tmp_path / "copy"
    shutil.copytree(default_trial.export_dir, copy)
    results = copy / "results.jsonl"
    results.write_text(results.read_text().replace('"accepted"', '"rejected"', 1))
    problems = verify_export(copy, check_export)
    assert any("results.jsonl: sha256" in p for p in problems)


@pytest.mark.engine
def test_docpilot_status_reads_a_pilot_run_folder_like_a_batch(default_trial, capsys):
    from batch.lot.status import batch_status
    from docpilot.cli import main as cli

    status = batch_status(default_trial.run_id)
    assert status["state"] == "done", status
    assert status["done"] == status["total"] == 12
    assert cli(["status", default_trial.run_id]) == 0
    assert default_trial.run_id in capsys.readouterr().out


def _bad_input_folder(root: Path) -> Path:
    docs = root / "documents"
    docs.mkdir(parents=True)
    labels = {}
    good = sorted((PILOT / "documents").glob("doc0[1-8].txt"))
    for path in good:
        shutil.copy(path, docs / path.name)
        labels[path.name] = json.loads((PILOT / "labels.json").read_text())[path.name]
    (docs / "empty.txt").write_bytes(b"")
    (docs / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (docs / "latin1.txt").write_bytes("Caf\xe9 prices rise as the euro falls".encode("latin-1"))
    (docs / "huge.txt").write_bytes(b"word " * 210_000)  # ~1 MB
    labels.update({"empty.txt": "reject", "binary.bin": "reject", "latin1.txt": "reject"})
    # huge.txt deliberately has no labels entry
    (root / "labels.json").write_text(json.dumps(labels))
    return root


def test_bad_inputs_each_get_a_clear_outcome_and_nothing_is_dropped(local_ray, isolated, pilot_config, tmp_path):
    outcome = run_pilot(pilot_config, _bad_input_folder(tmp_path / "bad"), _engine_actor=answer_actor())
    rows = {r["id"]: r for r in read_jsonl(outcome.run_dir / "results.jsonl")}
    assert len(rows) == 12
    assert rows["empty.txt"]["reason"] == "empty document (0 bytes)"
    assert rows["binary.bin"]["reason"].startswith("binary content")
    assert rows["latin1.txt"]["reason"].startswith("not valid UTF-8: byte 0xe9 at offset 3")
    assert rows["huge.txt"]["reason"].startswith("over size limit: 1050000 bytes > classify.max_doc_bytes 200000")
    summary = outcome.summary
    labels_check = next(c for c in summary["checks"] if c["name"] == "labels_complete")
    assert not labels_check["ok"] and "huge.txt" in labels_check["detail"]
    assert outcome.verdict == "fail" and outcome.decision == "revisit-configuration"
    again = run_pilot(pilot_config, _bad_input_folder(tmp_path / "bad2"), _engine_actor=answer_actor())
    assert again.run_dir != outcome.run_dir and outcome.run_dir.is_dir()  # every trial writes a new folder
    assert again.export_dir != outcome.export_dir


@pytest.mark.engine
@pytest.mark.slow  # ~55 s (a pilot's own Ray and engine start); make test stops a batch in its engine start instead
def test_sigterm_during_engine_start_still_records_where_the_pilot_stopped(tmp_path):
    """A real ``docpilot pilot`` process is stopped with SIGTERM while its engine actor's vLLM starts: the run
    folder gets its summary and a decision, the exit status is 130, the pilot gate is untouched, no Ray or
    engine process is left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    env = {**os.environ, "DOCPILOT_HOME": str(tmp_path / "home"), "DOCPILOT_RUNS": str(tmp_path / "runs"),
           "DOCPILOT_EXPORTS": str(tmp_path / "exports")}
    proc = subprocess.Popen([sys.executable, "-m", "docpilot", "pilot"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((tmp_path / "runs").glob("*/inputs.json")):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        def engine_started() -> bool:  # the engine actor's vLLM has spawned its engine core and is starting it
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "VLLM::" in " ".join(child.cmdline()):
                        return True
                except psutil.Error:
                    continue
            return False

        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not engine_started():
            assert proc.poll() is None
            time.sleep(0.2)
        time.sleep(2)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children and not list((tmp_path / "runs").glob("*/results.jsonl"))  # still starting: nothing classified
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stage_reached"] == "load-model" and summary["verdict"] == "fail"
    assert summary["first_error"] == {"stage": "load-model", "kind": "interrupted", "type": "Interrupted", "message": "stopped by SIGTERM"}
    decision = json.loads((run_dir / "decision.json").read_text())
    assert decision["decision"] == "fix-environment" and "run the pilot again" in decision["reasons"][1]
    assert "error [interrupted] at stage load-model: Interrupted: stopped by SIGTERM" in out
    assert not (tmp_path / "home" / "pilots").exists() or not any((tmp_path / "home" / "pilots").iterdir())
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"engine processes left behind: {[p.pid for p in alive]}"


@pytest.mark.engine
def test_summary_holds_measured_peak_memory_and_throughput_beside_the_plan(default_trial, pilot_config):
    """summary.json: the engine's peak RSS, docs/s and tokens/s, next to the doctor's CPU estimate; decision.md says which it is."""
    from classify.model.memory import GIB

    summary = json.loads((default_trial.run_dir / "summary.json").read_text())
    m = summary["measured"]
    assert m["device"] == "cpu"
    assert m["peak_rss_bytes"] > 0 and m["docs_per_s"] > 0 and m["tokens_per_s"] > 0
    assert m["docs"] == 12 and m["tokens"] == summary["prompt_tokens"]
    assert any("VLLM::" in p for p in m["detail"]["processes"])  # the engine core's peak is counted, not just ours
    parts = m["estimate"]["parts"]
    assert parts["kv_cache"] == pilot_config.engine.kv_cache_space_gib * GIB and parts["runtime"] == 3 * GIB
    assert m["plan_estimate_bytes"] == sum(parts.values()) > 0
    assert m["ratio"] == round(m["peak_rss_bytes"] / m["plan_estimate_bytes"], 3)
    assert m["tolerance"] == 0.5 and m["gap"] == (abs(m["ratio"] - 1) > 0.5)
    assert not m["exceeds_machine"]
    md = (default_trial.run_dir / "decision.md").read_text()
    assert "## Measured" in md and "docs/s" in md
    # issue 42 item 2: the figure names its source, and it is the doctor's figure for one engine on this CPU
    assert m["estimate_source"].startswith("make doctor's estimate") and m["estimate_source"] in md
    assert "make plan's estimate" not in md
    from batch.pilot.doctor import engine_memory

    doctors = engine_memory(pilot_config, 0)[0].parts  # the same formula; the doctor also counts the LoRA slots
    assert {k: v for k, v in doctors.items() if k != "lora_slots"} == {k: v for k, v in parts.items() if k != "lora_slots"}
    # issue 42 item 8: a pilot leaves no `<pilot-id>.progress.json` beside its export copy
    assert not list(Path(default_trial.export_dir).parent.glob("*.progress.json"))
    assert summary["decision"] == json.loads((default_trial.run_dir / "decision.json").read_text())["decision"]
    assert "verdict is whether every check" in summary["verdict_vs_decision"]


# --- the batch-only parts, each broken in turn (real Ray, stand-in engine actor) ---------------------------------

def _business_set(folder: Path, fmt: str = "jsonl") -> Path:
    """A pilot set a stand-in engine answering `business` passes: 11 business articles and one planned reject."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"b{i:02d}", "text": f"Shares of company {i} rose after its quarterly results beat forecasts.",
             "label": "business"} for i in range(11)] + [{"id": "r01", "text": "", "label": "reject"}]
    if fmt == "jsonl":
        path = folder / "pilot.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        import csv

        path = folder / "pilot.csv"
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, ["id", "text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "pilot.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _config(tmp_path: Path, **sections: dict) -> str:
    """The shipped config with some `corpus`/`batch` fields changed (what the pilot gates)."""
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    for name, fields in sections.items():
        data[name].update(fields)
    path = tmp_path / "docpilot.json"
    path.write_text(json.dumps(data))
    return str(path)


def _broken_merge(monkeypatch):
    import batch.run.merge

    def full_disk(self):
        raise OSError(28, "No space left on device", str(self.parquet_path))

    monkeypatch.setattr(batch.run.merge._Outputs, "close", full_disk)


def _broken_shard_writer(monkeypatch):
    import batch.run.attempt
    import batch.run.export

    def full_disk(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(batch.run.attempt, "write_bytes_atomic", full_disk)


@pytest.mark.parametrize(
    ("fmt", "sections", "breaks", "stage", "decision", "exit_code", "message"),
    [
        ("jsonl", {}, None, "verify", "proceed", 0, None),  # the control: nothing broken, the same set proceeds
        ("jsonl", {"batch": {"cpu_actors": 64}}, None, "start-pool", "revisit-configuration", 2,
         "`batch.cpu_actors` x `batch.actor_num_cpus` = 64 x 1.0 CPUs, but the Ray cluster has 2 CPUs"),
        ("csv", {"corpus": {"text_column": "body"}}, None, "read-inputs", "revisit-configuration", 3, "body"),
        ("jsonl", {}, _broken_shard_writer, "write", "fix-environment", 6, "No space left on device"),
        ("jsonl", {}, _broken_merge, "merge", "fix-environment", 6, "No space left on device"),
    ],
    ids=["control-proceeds", "impossible-cpu-actors", "corpus-the-batch-reader-refuses", "shard-writer-fails",
         "merge-fails"],
)
def test_each_batch_only_part_broken_fails_the_pilot_at_its_stage(local_ray, isolated, pilot_config, monkeypatch,
                                                                  fmt, sections, breaks, stage, decision, exit_code,
                                                                  message):
    """Main's in-process pilot said `proceed` for every broken case (it never ran these parts)."""
    if breaks:
        breaks(monkeypatch)
    outcome = run_pilot(pilot_config, _business_set(isolated / "set", fmt), config_path=_config(isolated, **sections),
                        _engine_actor=answer_actor())
    assert (outcome.stage, outcome.decision, outcome.exit_code) == (stage, decision, exit_code), outcome.summary
    saved = json.loads((outcome.run_dir / "decision.json").read_text())
    assert saved["decision"] == decision and saved["stage_reached"] == stage
    if message:
        first = outcome.summary["first_error"]
        assert first["stage"] == stage and message in first["message"], first
        assert outcome.verdict == "fail" and f"stage:{stage}" in outcome.summary["failed_checks"]
        assert outcome.export_dir is None
    else:
        assert outcome.verdict == "pass" and outcome.export_dir is not None
    if stage in ("read-inputs", "start-pool"):  # broken before classification: no engine was asked for
        assert not (outcome.run_dir / "shards").exists() or not any((outcome.run_dir / "shards").iterdir())


def test_a_parquet_pilot_set_runs_through_the_batch_reader(local_ray, isolated, pilot_config):
    outcome = run_pilot(pilot_config, _business_set(isolated / "set", "parquet"), _engine_actor=answer_actor())
    assert outcome.decision == "proceed" and outcome.stage == "verify", outcome.summary
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["corpus"]["format"] == "parquet" and manifest["corpus"]["distinct_ids"] == 12
    rows = {r["id"]: r for r in read_jsonl(outcome.run_dir / "results.jsonl")}
    assert len(rows) == 12 and rows["r01"]["status"] == "rejected" and rows["r01"]["reason"]
    assert outcome.summary["expected_rejects_matched"] == 1 and outcome.summary["accuracy"] == 1.0
    assert verify_export(outcome.export_dir, check_export) == []
    # issue 42 item 8: the export location holds the verified copy and nothing else (no `<id>.progress.json`)
    assert [p.name for p in (isolated / "exports").iterdir()] == [outcome.run_id]


def test_pilot_and_batch_call_the_same_reader_shard_writer_merge_and_recheck(local_ray, isolated, pilot_config,
                                                                            monkeypatch, capsys, caplog):
    """A spy on each shared function: one pilot, then one batch (with another actor count, which it says)."""
    import batch.corpus.plan
    import batch.run.attempt
    import batch.run.export
    from batch.run.driver import parse_args, run_batch

    calls: list[str] = []

    def spy(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    spy(batch.corpus.plan, "jsonl_rows")  # the corpus planner's reading pass
    spy(batch.corpus.plan.CorpusPlan, "shard_payload")  # a shard read when dispatched
    spy(batch.run.attempt, "write_bytes_atomic")  # the shard writer
    spy(batch.run.attempt, "merge_results")  # shards -> results.jsonl + results.parquet
    spy(batch.run.export, "check_export")  # the export re-check
    shared = {"jsonl_rows", "shard_payload", "write_bytes_atomic", "merge_results", "check_export"}
    corpus = _business_set(isolated / "set")
    outcome = run_pilot(pilot_config, corpus, config_path="config/docpilot.json", _engine_actor=answer_actor())
    assert outcome.decision == "proceed"
    assert set(calls) == shared, calls
    calls.clear()
    summary = run_batch(parse_args(["--corpus", str(corpus), "--cpu-actors", "2", "--no-progress"]),
                        _engine_actor=answer_actor())
    assert set(calls) == shared, calls
    assert summary["pilot_gate"]["passed"] and summary["pilot_gate"]["pilot_run_id"] == outcome.run_id
    assert summary["pilot_gate"]["pipeline_differences"] == ["cpu_actors: piloted 1, now 2"]
    said = [r.getMessage() for r in caplog.records] + capsys.readouterr().err.splitlines()
    assert len([s for s in said if "this batch runs another pipeline than pilot" in s]) == 1, said  # said once
