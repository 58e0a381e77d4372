"""A stopped training run refuses to resume on other training data, tokenizer files or base model (issue 40, item 7).

A real smoke run of ``docpilot train`` (the default SmolLM2 from a model cache of the test's own: its small files
copied, its weights linked) is stopped with SIGTERM after its first checkpoint; the data, then the tokenizer, then
the base model's fingerprint are changed, and each resume is refused naming the run, both values and what to do;
with everything restored the run resumes and finishes on the data it started with.

Split by tier: this file holds the process tests; the others of the same subject are in
``tests/unit/adapters/train/test_resume_inputs.py``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.train.train import train
from classify.config.file import file_data
from classify.errors import ConfigError
from classify.model.model import FINGERPRINT_FILE, provision_default_model
from classify.runs.files import file_sha256
from tests.support.training import quick_config
from tests.support.training import train_config as train_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache holding the default model: its weights linked, its other files copied (they get edited)."""
    real = Path(provision_default_model().path)
    folder = tmp_path / "models" / real.name
    folder.mkdir(parents=True)
    for f in real.iterdir():
        if f.suffix == ".safetensors":
            (folder / f.name).symlink_to(f)
        else:
            shutil.copy2(f, folder / f.name)
    monkeypatch.setenv("DOCPILOT_MODEL_CACHE", str(folder.parent))
    return folder


def _rows(source: Path, n: int) -> list[dict[str, str]]:
    with source.open(encoding="utf-8", newline="") as fh:
        return [row for _, row in zip(range(n), csv.DictReader(fh), strict=False)]


def _csv(rows: list[dict[str, str]]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["text", "category"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def _docpilot_train(config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "docpilot", "train", "--config", str(config), "--smoke", "--no-publish",
                             *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop_after_first_checkpoint(proc: subprocess.Popen, runs: Path, before: set[Path]) -> Path:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        new = set(runs.glob("*-train-*")) - before
        if new and list((run_dir := new.pop()).glob("checkpoints/step-*/meta.json")):
            os.kill(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 130, out
            return run_dir
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no checkpoint within 300 s: {proc.communicate()[0]}")


@pytest.mark.slow  # about 50 s: three refused resumes of a real training run (make test-slow)
def test_resume_refuses_changed_data_tokenizer_or_base_model_and_resumes_on_the_same(train_config, tmp_path,
                                                                                      model_cache):
    rows = _rows(train_config.data.resolved_path(), 40)
    data = tmp_path / "train.csv"
    data.write_bytes(original := _csv(rows))
    started_sha = file_sha256(data)
    cfg = quick_config(train_config, max_steps=3, checkpoint_every_steps=1, train_rows=8, validation_rows=2,
                       max_doc_tokens=16)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(data)})})
    config = tmp_path / "docpilot.json"
    config.write_text(json.dumps(file_data(cfg)))
    runs = Path(os.environ["DOCPILOT_RUNS"])
    run_dir = _stop_after_first_checkpoint(_docpilot_train(config), runs, set(runs.glob("*-train-*")))
    assert not (run_dir / "summary.json").exists()

    relabelled = [{**r, "category": "tech" if r["category"] != "tech" else "sport"} if i < 3 else r for i, r in enumerate(rows)]
    edits = {
        "labels changed": _csv(relabelled),
        "rows appended": original + _csv(rows[:4]).split(b"\n", 1)[1],
        "one byte changed": original.replace(b"Sella", b"Sellb", 1),
    }
    for what, content in edits.items():
        data.write_bytes(content)
        out, _ = (proc := _docpilot_train(config, "--resume", str(run_dir))).communicate(timeout=300)
        assert proc.returncode == 2, f"{what}: {out}"
        errors = [line for line in out.splitlines() if line.startswith("error [config]:")]
        assert len(errors) == 1, f"{what}: {out}"
        assert (f"cannot resume training run {run_dir.name}" in errors[0] and f"the training data {data} has sha256 "
                f"{file_sha256(data)}, the run started with {started_sha}: restore that file" in errors[0]
                and "or start a new run (the same `docpilot train` command without `--resume`)" in errors[0]), what
        assert "Traceback" not in out, out
    data.write_bytes(_csv([{**rows[0], "category": "weather"}, *rows[1:]]))  # changed and now invalid: named as changed
    with pytest.raises(ConfigError, match=f"the run started with {started_sha}: restore that file"):
        train(cfg, smoke=True, resume=str(run_dir), publish=False)
    data.write_bytes(original)

    tokenizer_config = model_cache / "tokenizer_config.json"
    kept = tokenizer_config.read_bytes()
    tokenizer_config.write_text(json.dumps({**json.loads(kept), "model_max_length": 1024}))
    with pytest.raises(ConfigError, match=rf"cannot resume training run {run_dir.name} .*: the tokenizer files in "
                                          rf"{model_cache} have sha256 sha256:\w{{64}}, the run started with sha256:\w{{64}}"):
        train(cfg, smoke=True, resume=str(run_dir), publish=False)
    tokenizer_config.write_bytes(kept)

    marker = model_cache / FINGERPRINT_FILE
    kept = marker.read_bytes()
    was = json.loads(kept)["fingerprint"]
    marker.write_text(json.dumps({**json.loads(kept), "fingerprint": "sha256:" + "0" * 64}))
    with pytest.raises(ConfigError, match=f"the base model 'smollm2-135m-instruct' has fingerprint sha256:0{{64}}, "
                                          f"the run started with {was}: restore that model"):
        train(cfg, smoke=True, resume=str(run_dir), publish=False)
    marker.write_bytes(kept)

    out, _ = (proc := _docpilot_train(config, "--resume", str(run_dir))).communicate(timeout=300)
    assert proc.returncode == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data"]["sha256"] == started_sha and summary["steps"] == 3 and len(summary["resumed_from"]) == 1
