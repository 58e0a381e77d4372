"""LoRA training: config, data checks, smoke run through the real engine, kill-and-resume in a new process.

Split by tier: this file holds the slow tests; the others of the same subject are in ``tests/unit/adapters/train/test_train.py``, ``tests/engine/test_train_engine.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.train.train import train
from classify.config.file import file_data
from tests.support.training import quick_config
from tests.support.training import train_config as train_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(3600)  # long tests: an hour each at most

ROOT = Path(__file__).resolve().parents[2]


def _run_train(config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "docpilot", "train", "--config", str(config), "--smoke", "--no-publish", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # three training processes: about 1-2 min on the shared 2-core CPU
def test_kill_and_resume_in_a_new_process_ends_where_an_uninterrupted_run_ends(train_config, tmp_path):
    from safetensors.torch import load_file

    cfg = quick_config(train_config, max_steps=6, checkpoint_every_steps=2, train_rows=12, validation_rows=2, max_doc_tokens=16)
    config = tmp_path / "docpilot.json"
    config.write_text(json.dumps(file_data(cfg)))
    reference = train(cfg, smoke=True, publish=False)
    runs = Path(os.environ["DOCPILOT_RUNS"])
    before = set(runs.glob("*-train-*"))
    proc = _run_train(config)
    run_dir = _stop_at_first_checkpoint(proc, runs, before, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    assert run_dir is not None and not (run_dir / "summary.json").exists()
    resumed = _run_train(config, "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and len(summary["resumed_from"]) == 1 and 2 <= summary["resumed_from"][0] < 6
    history = [json.loads(x) for x in (run_dir / "adapter" / "loss.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == list(range(1, 7))
    ref_w = load_file(str(reference.run_dir / "adapter" / "adapter_model.safetensors"))
    got_w = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    assert ref_w.keys() == got_w.keys()
    for key in ref_w:
        assert (ref_w[key] - got_w[key]).abs().max().item() <= 1e-5, key
    ref_loss = [json.loads(x)["loss"] for x in (reference.run_dir / "adapter" / "loss.jsonl").read_text().splitlines()]
    assert [h["loss"] for h in history] == pytest.approx(ref_loss, abs=1e-4)


def _stop_at_first_checkpoint(proc: subprocess.Popen, runs: Path, before: set[Path], signum: int) -> Path | None:
    """Send ``signum`` to ``proc`` once its new run folder holds a checkpoint; returns that folder."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        new = set(runs.glob("*-train-*")) - before
        if new and list((run_dir := new.pop()).glob("checkpoints/step-*/meta.json")):
            os.kill(proc.pid, signum)
            return run_dir
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("signum", [
    signal.SIGTERM,  # a lease ending, `docker stop`, `kill`
    pytest.param(signal.SIGINT, marks=pytest.mark.slow),  # Ctrl-C
])
def test_sigterm_or_ctrl_c_stops_training_with_exit_130_and_a_resume_command(train_config, tmp_path, signum):
    cfg = quick_config(train_config, max_steps=4, checkpoint_every_steps=1, train_rows=8, validation_rows=2, max_doc_tokens=16)
    config = tmp_path / "docpilot.json"
    config.write_text(json.dumps(file_data(cfg)))
    runs = Path(os.environ["DOCPILOT_RUNS"])
    before = set(runs.glob("*-train-*"))
    proc = _run_train(config)
    run_dir = _stop_at_first_checkpoint(proc, runs, before, signum)
    time.sleep(0.3)  # a second signal while the process stops (its teardown takes a second or more) changes nothing
    if proc.poll() is None:
        os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=120)
    assert run_dir is not None, out
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error [interrupted]:")]
    assert errors == [f"error [interrupted]: stopped by {signal.Signals(signum).name}: training run {run_dir.name} stopped "
                      f"at stage train; continue it with `docpilot train --config {config} --smoke --no-publish "
                      f"--resume {run_dir}`"], out
    assert not (run_dir / "support_note.md").exists() and not (run_dir / "summary.json").exists()
    assert list(run_dir.glob("checkpoints/step-*/meta.json"))
    (run_dir / "support_note.md").write_text("# an earlier invocation of this run failed\n")
    # as if the run had started on the other kind of CPU (`training.dtype: auto` resolved otherwise there)
    record = json.loads((run_dir / "config.json").read_text())
    here = record["compute_dtypes"][0]
    other = "float32" if here == "bfloat16" else "bfloat16"
    (run_dir / "config.json").write_text(json.dumps({**record, "compute_dtypes": [other]}))
    resumed = _run_train(config, "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and len(summary["resumed_from"]) == 1
    # a float32 run stays float32 on a bf16 CPU; a bf16 run goes on in float32 on a CPU without native bf16, and says so
    assert summary["dtype"] == "float32" and summary["dtypes"] == (["float32"] if here == "bfloat16" else ["bfloat16", "float32"])
    assert not (run_dir / "support_note.md").exists(), "a finished run keeps no support note of an earlier invocation"


@pytest.mark.slow  # a smoke run and a second vLLM engine (merged weights): about 2 min on the 2-core CPU
@pytest.mark.engine
def test_end_check_in_merged_mode_matches_the_lora_path(train_config, engine):
    from adapters.train.data import load_rows, split_rows
    from adapters.train.validate import through_engine

    cfg = quick_config(train_config)
    run = train(cfg, smoke=True, publish=False).run_dir
    smoke = cfg.for_smoke()
    rows, _ = load_rows(smoke.data, smoke.classify.categories)
    val = split_rows(rows, smoke.data, smoke.training.seed)[1][:6]
    assert smoke.model.adapter_mode == "merged"  # the shipped default: pilot and batch merge one adapter
    merged = through_engine(smoke, run / "adapter", val, engine.model, label="merged-check")
    lora = through_engine(smoke, run / "adapter", val, engine.model, classifier=engine, label="lora-check")
    assert not (run / ".check-merged").exists()  # the temporary merged weights are removed
    assert merged["rows"] == merged["accepted"] == merged["allowed"] == 6
    assert merged["per_category"] == lora["per_category"] and merged["accuracy"] == lora["accuracy"]
    assert merged["calibration"]["temperature"] == pytest.approx(lora["calibration"]["temperature"], rel=0.05)
