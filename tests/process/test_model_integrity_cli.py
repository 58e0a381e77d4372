"""Weights changed after verification (issue 28, item 3), at the command line: the real ``docpilot batch`` and
``docpilot pilot`` on a tampered copy of the real default model exit 5 naming the file and record nothing.

Split by tier: this file holds the process tests; the others of the same subject are in
``tests/unit/classify/model/test_model_integrity.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from classify.config.sections import ModelConfig
from classify.model.model import resolve_model
from tests.support import ROOT
from tests.support.processes import run_docpilot
from tests.support.tamper import flip_byte


@pytest.fixture(scope="module")
def tampered_default(tmp_path_factory):
    """A copy of the real default model with one byte of its weights altered in place (same size)."""
    src = resolve_model(ModelConfig())
    dst = tmp_path_factory.mktemp("tampered") / "smollm2"
    shutil.copytree(src.path, dst)
    weights = dst / "model.safetensors"
    size = weights.stat().st_size
    flip_byte(weights, size // 2)
    assert weights.stat().st_size == size
    return dst


def _config(tmp_path: Path, model: Path) -> Path:
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["model"]["base_model"] = str(model)
    out = tmp_path / "cfg.json"
    out.write_text(json.dumps(data))
    return out


def test_batch_on_altered_weights_exits_5_naming_the_file_before_ray(tmp_path, tampered_default):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": "Shares rose today."}) + "\n" for i in range(5)))
    proc = run_docpilot("batch", "--config", str(_config(tmp_path, tampered_default)), "--corpus", str(corpus),
                        "--batch-id", "tampered", "--skip-pilot-gate", "--no-progress", env=os.environ.copy(), timeout=300)
    assert proc.returncode == 5, proc.stderr[-2000:]
    # a cache provisioned with per-file records names the altered file; an older one (no list) the fingerprint
    assert ("was altered: sha256" in proc.stderr or "weights do not match fingerprint" in proc.stderr), proc.stderr[-2000:]
    assert str(tampered_default / "model.safetensors") in proc.stderr
    assert "Traceback" not in proc.stderr
    from classify.paths import runs_dir

    assert not (runs_dir() / "tampered").exists()  # nothing ran, nothing recorded


def test_pilot_on_altered_weights_exits_5_and_records_no_gate(tmp_path, tampered_default, bbc_dir):
    from classify.paths import pilots_dir

    def records():
        return sorted((p.name, p.read_bytes()) for p in pilots_dir().glob("*.json")) if pilots_dir().is_dir() else []

    before = records()
    proc = run_docpilot("pilot", "--config", str(_config(tmp_path, tampered_default)), env=os.environ.copy(), timeout=300)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert str(tampered_default / "model.safetensors") in proc.stderr and "Traceback" not in proc.stderr
    assert records() == before  # never joined the verified model's gate history
