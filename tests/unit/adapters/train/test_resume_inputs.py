"""What a training run's checkpoints were trained on, recorded and compared on resume (issue 40, item 7).

Split by tier: this file holds the unit tests; the others of the same subject are in
``tests/process/test_train_resume_inputs.py``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from adapters.train.checkpoint import INPUTS, check_inputs, run_inputs
from classify.errors import ConfigError
from classify.model.model import ModelRef, tokenizer_sha256
from classify.runs.files import file_sha256

FP = "sha256:" + "1" * 64


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "20260101T000000Z-train-0123abcd"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"config_sha256": "c" * 64, "compute_dtypes": ["float32"]}))
    return run_dir


@pytest.fixture
def model(tmp_path: Path) -> ModelRef:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (folder / "tokenizer_config.json").write_text("{}")
    return ModelRef("base", str(folder), FP, "local-folder")


def _data(tmp_path: Path, text: str = "text,category\nhello,sport\n") -> Path:
    path = tmp_path / "train.csv"
    path.write_text(text)
    return path


def _checkpoint(run_dir: Path) -> None:
    (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def test_a_run_without_a_checkpoint_records_its_inputs_and_rerecords_them(run, model, tmp_path):
    data = _data(tmp_path)
    first = run_inputs(data, None, model)
    assert first == {"data": {"path": str(data), "sha256": file_sha256(data)},
                     "tokenizer": {"path": model.path, "sha256": tokenizer_sha256(model.path)},
                     "base_model": {"name": "base", "fingerprint": FP}}
    check_inputs(run, first)
    assert _record(run)[INPUTS] == first and _record(run)["compute_dtypes"] == ["float32"]  # the rest is kept
    data.write_text("text,category\nhello,tech\n")  # stopped before its first checkpoint: nothing was trained yet
    check_inputs(run, second := run_inputs(data, None, model))
    assert _record(run)[INPUTS] == second != first


def test_the_same_inputs_resume_and_a_missing_data_file_is_left_to_the_reader(run, model, tmp_path):
    data = _data(tmp_path)
    check_inputs(run, run_inputs(data, None, model))
    _checkpoint(run)
    check_inputs(run, run_inputs(data, file_sha256(data), model))
    data.unlink()
    check_inputs(run, run_inputs(data, None, model))  # load_rows says "training data ... does not exist"


def _changes(tmp_path: Path, model: ModelRef) -> dict:
    folder = Path(model.path)
    return {
        "data": lambda: _data(tmp_path, "text,category\nhello,tech\n") and model,
        "appended": lambda: _data(tmp_path, "text,category\nhello,sport\nmore,tech\n") and model,
        "tokenizer": lambda: (folder / "tokenizer_config.json").write_text('{"model_max_length": 8}') and model,
        "tokenizer.model": lambda: (folder / "tokenizer.model").write_bytes(b"spm") and model,
        "fingerprint": lambda: ModelRef("base", model.path, "sha256:" + "2" * 64, "local-folder"),
        "hub id": lambda: ModelRef("base", "org/base", "", "huggingface-hub"),
    }


@pytest.mark.parametrize(("change", "message"), [
    ("data", r"the training data {data} has sha256 {sha}, the run started with {was}: restore that file"),
    ("appended", r"the training data {data} has sha256 {sha}, the run started with {was}: restore that file"),
    ("tokenizer", r"the tokenizer files in {folder} have sha256 sha256:\w{{64}}, the run started with sha256:\w{{64}} "
                  r"\(in {folder}\): restore those files"),
    ("tokenizer.model", r"the tokenizer files in {folder} have sha256"),
    ("fingerprint", r"the base model 'base' has fingerprint sha256:2{{64}}, the run started with sha256:1{{64}}: "
                    r"restore that model"),
    ("hub id", r"the tokenizer files in org/base have sha256 None, the run started with sha256:\w{{64}} \(in {folder}\).*; "
               r"the base model 'base' has fingerprint \(none: a hub id\), the run started with sha256:1{{64}}"),
])
def test_a_changed_input_after_a_checkpoint_is_refused_naming_run_values_and_what_to_do(run, model, tmp_path, change,
                                                                                          message):
    data = _data(tmp_path)
    was = file_sha256(data)
    check_inputs(run, recorded := run_inputs(data, None, model))
    _checkpoint(run)
    now = _changes(tmp_path, model)[change]()
    expected = message.format(data=re.escape(str(data)), sha=file_sha256(data), was=was, folder=re.escape(model.path))
    with pytest.raises(ConfigError, match=(
            rf"^cannot resume training run {run.name} \({re.escape(str(run))}\): its checkpoints \(newest: step-000002\) "
            rf"were trained on other inputs than these: .*{expected}.* and resume again, or start a new run "
            r"\(the same `docpilot train` command without `--resume`\)$")):
        check_inputs(run, run_inputs(data, None, now))
    assert _record(run)[INPUTS] == recorded  # a refusal keeps what the checkpoints were trained on


def test_data_read_from_another_path_names_both(run, model, tmp_path):
    data = _data(tmp_path)
    check_inputs(run, run_inputs(data, None, model))
    _checkpoint(run)
    moved = tmp_path / "elsewhere.csv"
    moved.write_text("text,category\nother,tech\n")
    with pytest.raises(ConfigError, match=rf"the training data {re.escape(str(moved))} \(then read from "
                                          rf"{re.escape(str(data))}\) has sha256"):
        check_inputs(run, run_inputs(moved, None, model))


def test_a_run_recorded_before_inputs_were_recorded_resumes_with_a_warning(run, model, tmp_path, caplog):
    _checkpoint(run)
    inputs = run_inputs(_data(tmp_path), None, model)
    with caplog.at_level(logging.WARNING, logger="adapters.train"):
        check_inputs(run, inputs)
    assert f"run {run.name} was started before docpilot recorded its training data" in caplog.text
    assert _record(run)[INPUTS] == inputs


def test_tokenizer_sha256_covers_the_tokenizer_files_only(model, tmp_path):
    folder = Path(model.path)
    first = tokenizer_sha256(folder)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first)
    (folder / "model.safetensors").write_bytes(b"weights")  # the weights have their own fingerprint
    assert tokenizer_sha256(folder) == first
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert tokenizer_sha256(folder) != first
    assert tokenizer_sha256("org/base") is None and tokenizer_sha256(tmp_path / "nothing") is None
