"""Weights changed after verification (issue 28, item 3, the model half): what runs is what was verified.

:func:`classify.engine.model.verify_model` re-hashes a model folder's weights against the fingerprint it is known by,
before a pilot, a batch and a server start. Altered bytes of the same size, a truncated, missing or extra weight
file are a :class:`~classify.errors.ModelIntegrityError` (exit 5) naming the file; nothing is recorded under the
verified fingerprint. The CLI cases run the real ``docpilot batch`` and ``docpilot pilot`` on a tampered copy of
the real default model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from classify.engine.model import (
    FINGERPRINT_FILE,
    ModelRef,
    resolve_model,
    verify_model,
    weight_file_records,
    weights_fingerprint,
)
from classify.errors import EngineError, ModelIntegrityError

ROOT = Path(__file__).resolve().parents[4]


def _model(tmp_path: Path, listed: bool = True, n_files: int = 2) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for i in range(n_files):
        (folder / f"model-{i:05d}.safetensors").write_bytes(os.urandom(4096) * 4)
    info = {"fingerprint": weights_fingerprint(folder), "source": "test"}
    if listed:
        info["files"] = weight_file_records(folder)
    (folder / FINGERPRINT_FILE).write_text(json.dumps(info))
    return folder


def _flip(path: Path, at: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path: Path, at: int) -> None:
    with path.open("r+b") as fh:
        fh.truncate(at)


TAMPERINGS = [
    ("flip first byte", lambda f: _flip(f / "model-00000.safetensors", 0), "model-00000.safetensors", "altered"),
    ("flip last byte", lambda f: _flip(f / "model-00001.safetensors", 16383), "model-00001.safetensors", "altered"),
    ("truncated", lambda f: _truncate(f / "model-00001.safetensors", 100), "model-00001.safetensors", "truncated"),
    ("emptied", lambda f: _truncate(f / "model-00000.safetensors", 0), "model-00000.safetensors", "truncated"),
    ("grown", lambda f: (f / "model-00000.safetensors").open("ab").write(b"x"), "model-00000.safetensors", "changed in size"),
    ("missing", lambda f: (f / "model-00001.safetensors").unlink(), "model-00001.safetensors", "missing"),
    ("extra", lambda f: (f / "model-00009.safetensors").write_bytes(b"x"), "model-00009.safetensors", "not in"),
]


@pytest.mark.parametrize("listed", [True, False], ids=["files-listed", "old-fingerprint-json"])
@pytest.mark.parametrize(("what", "tamper", "name", "words"), TAMPERINGS, ids=[t[0] for t in TAMPERINGS])
def test_tampered_weights_are_a_model_integrity_error_naming_the_file(tmp_path, listed, what, tamper, name, words):
    folder = _model(tmp_path, listed)
    from classify.config.sections import ModelConfig

    ref = resolve_model(ModelConfig(base_model=str(folder)))
    assert verify_model(ref) is ref  # the genuine folder passes
    tamper(folder)
    ref = resolve_model(ModelConfig(base_model=str(folder)))  # fingerprint.json still says the verified hash
    with pytest.raises(ModelIntegrityError) as err:
        verify_model(ref)
    assert isinstance(err.value, EngineError) and err.value.exit_code == 5 and err.value.kind == "model_integrity"
    message = str(err.value)
    if listed:
        assert str(folder / name) in message and words in message, message
    else:  # an older fingerprint.json lists no files: every weight file is named with its size
        assert "do not match fingerprint" in message and str(folder) in message
        if what != "missing":
            assert str(folder / name) in message, message
    assert "nothing ran on these weights" in message


def test_hub_id_and_unreadable_marker(tmp_path):
    hub = ModelRef("org/model", "org/model", "", "huggingface-hub")
    assert verify_model(hub) is hub  # nothing local to hash
    folder = _model(tmp_path)
    ref = ModelRef("m", str(folder), weights_fingerprint(folder), "local-folder")
    (folder / FINGERPRINT_FILE).write_text("{not json")
    with pytest.raises(ModelIntegrityError, match="fingerprint.json is unreadable"):
        verify_model(ref)


@pytest.fixture(scope="module")
def tampered_default(tmp_path_factory):
    """A copy of the real default model with one byte of its weights altered in place (same size)."""
    src = resolve_model(__import__("classify.config.sections", fromlist=["ModelConfig"]).ModelConfig())
    dst = tmp_path_factory.mktemp("tampered") / "smollm2"
    shutil.copytree(src.path, dst)
    weights = dst / "model.safetensors"
    size = weights.stat().st_size
    _flip(weights, size // 2)
    assert weights.stat().st_size == size
    return dst


def _config(tmp_path: Path, model: Path) -> Path:
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["model"]["base_model"] = str(model)
    out = tmp_path / "cfg.json"
    out.write_text(json.dumps(data))
    return out


def _docpilot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "docpilot", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=os.environ.copy())


def test_batch_on_altered_weights_exits_5_naming_the_file_before_ray(tmp_path, tampered_default):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": "Shares rose today."}) + "\n" for i in range(5)))
    proc = _docpilot("batch", "--config", str(_config(tmp_path, tampered_default)), "--corpus", str(corpus),
                     "--batch-id", "tampered", "--skip-pilot-gate", "--no-progress")
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
    proc = _docpilot("pilot", "--config", str(_config(tmp_path, tampered_default)))
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert str(tampered_default / "model.safetensors") in proc.stderr and "Traceback" not in proc.stderr
    assert records() == before  # never joined the verified model's gate history
