"""Weights changed after verification (issue 28, item 3, the model half): what runs is what was verified.

:func:`classify.model.model.verify_model` re-hashes a model folder's weights against the fingerprint it is known by,
before a pilot, a batch and a server start. Altered bytes of the same size, a truncated, missing or extra weight
file are a :class:`~classify.errors.ModelIntegrityError` (exit 5) naming the file; nothing is recorded under the
verified fingerprint.

Split by tier: this file holds the unit tests; the CLI cases (the real ``docpilot batch`` and ``docpilot pilot`` on
a tampered copy of the real default model) are in ``tests/process/test_model_integrity_cli.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from classify.errors import EngineError, ModelIntegrityError
from classify.model.model import (
    FINGERPRINT_FILE,
    ModelRef,
    resolve_model,
    verify_model,
    weight_file_records,
    weights_fingerprint,
)
from tests.support.tamper import flip_byte

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


def _truncate(path: Path, at: int) -> None:
    with path.open("r+b") as fh:
        fh.truncate(at)


TAMPERINGS = [
    ("flip first byte", lambda f: flip_byte(f / "model-00000.safetensors", 0), "model-00000.safetensors", "altered"),
    ("flip last byte", lambda f: flip_byte(f / "model-00001.safetensors", 16383), "model-00001.safetensors", "altered"),
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
