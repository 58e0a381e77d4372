"""Checkpoints on a full disk and truncated checkpoints on resume (issue 12, item 8).

The full disk is real where the sandbox allows it: a 1 MiB tmpfs mounted for the test (root only),
filled with a filler file so that exactly the intended checkpoint file runs out of space. Where
mounting is not permitted those tests skip, and the injected-error tests below still run: they make
the write functions raise the errors a full disk or an exceeded quota raises.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/process/test_train_disk_cli.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from adapters.train.checkpoint import META, STATE, WEIGHTS, latest_checkpoint, resume_latest, save_checkpoint
from classify.errors import ConfigError, EnvironmentCheckError

SHA = "a" * 64
PAGE = 4096


def _tiny(seed: int = 0):
    """A real 2-layer Llama with a peft LoRA, its AdamW (one step taken) and scheduler: about 1 s."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler) -> None:
    import torch

    optimizer.zero_grad()
    model(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss.backward()
    optimizer.step()
    scheduler.step()


def _lora(model) -> dict:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def _save(root: Path, step: int, parts, keep: int = 3) -> Path:
    return save_checkpoint(root, step, *parts, state={"history": [{"step": step}]}, config_sha256=SHA, keep=keep)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 1 MiB tmpfs (needs root and mount permission; skips otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the injected-error tests cover the mapping")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(disk).free - leave))
    assert shutil.disk_usage(disk).free == leave
    return filler


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


@pytest.mark.parametrize("failing", [WEIGHTS, STATE, META])
def test_a_real_full_disk_during_any_checkpoint_write_is_an_environment_error(tmp_path, small_disk, failing):
    parts = _tiny()
    sizes = {f.name: f.stat().st_size for f in _save(tmp_path / "measure", 1, parts).iterdir()}
    root = small_disk / "run" / "checkpoints"
    first = _save(root, 1, parts)
    _step(*parts)
    room = {WEIGHTS: _pages(sizes[WEIGHTS]) - PAGE,
            STATE: _pages(sizes[WEIGHTS]) + _pages(sizes[STATE]) - PAGE,
            META: _pages(sizes[WEIGHTS]) + _pages(sizes[STATE])}[failing]
    filler = _fill(small_disk, room)
    with pytest.raises(EnvironmentCheckError, match=(
            rf"^disk full: could not write checkpoint step-000002 \({failing}\) in {root}: "
            r"\d+\.\d MiB free on that file system when it failed .*; the checkpoints already there are intact \(newest: step-000001\)")):
        _save(root, 2, parts)
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]  # no temporary or partial checkpoint left
    assert latest_checkpoint(root) == first
    filler.unlink()  # space freed: the same save now succeeds
    second = _save(root, 2, parts)
    assert latest_checkpoint(root) == second


@pytest.mark.parametrize(
    ("target", "error", "words"),
    [
        ("safetensors.torch.save_file", OSError(errno.ENOSPC, "No space left on device"), "disk full"),
        ("safetensors.torch.save_file", OSError(errno.EDQUOT, "Disk quota exceeded"), "disk full"),
        ("safetensors.torch.save_file", "SafetensorError", "disk full"),
        ("torch.save", RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write failed"), "write failed"),
        ("pathlib.Path.write_text", OSError(errno.EDQUOT, "Disk quota exceeded"), "disk full"),
        ("os.fsync", OSError(errno.ENOSPC, "No space left on device"), "disk full"),
        ("pathlib.Path.write_text", OSError(errno.EIO, "Input/output error"), "write failed"),
    ],
)
def test_injected_write_errors_map_to_an_environment_error(tmp_path, monkeypatch, target, error, words):
    from safetensors import SafetensorError

    if error == "SafetensorError":
        error = SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    parts = _tiny()
    root = tmp_path / "checkpoints"
    _save(root, 1, parts)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(target, fail)
    with pytest.raises(EnvironmentCheckError, match=rf"^{words}: could not write checkpoint step-000002 \(.+\) in {root}: \d+\.\d MiB free"):
        _save(root, 2, parts)
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]


def test_a_bug_while_saving_is_not_reported_as_a_disk_problem(tmp_path, monkeypatch):
    parts = _tiny()

    def bug(*args, **kwargs):
        raise TypeError("cannot pickle 'generator' object")

    monkeypatch.setattr("torch.save", bug)
    with pytest.raises(TypeError):
        _save(tmp_path / "checkpoints", 1, parts)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "weights cut short": lambda c: _truncate(c / WEIGHTS),
    "trainer state cut short": lambda c: _truncate(c / STATE),
    "meta.json invalid": lambda c: (c / META).write_text('{"step": 2, "config_'),
    "meta.json without the step": lambda c: (c / META).write_text(json.dumps({"config_sha256": SHA})),
    "weights missing": lambda c: (c / WEIGHTS).unlink(),
    "trainer state missing": lambda c: (c / STATE).unlink(),
    "meta.json missing": lambda c: (c / META).unlink(),
    "weights of another shape": lambda c: __import__("safetensors.torch").torch.save_file(
        {k: v[:1].contiguous() for k, v in __import__("safetensors.torch").torch.load_file(str(c / WEIGHTS)).items()},
        str(c / WEIGHTS)),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupt_newest_checkpoint_is_skipped_for_the_previous_good_one(tmp_path, caplog, kind):
    parts = _tiny()
    root = tmp_path / "checkpoints"
    _save(root, 1, parts)
    good = _lora(parts[0])
    _step(*parts)
    bad = _save(root, 2, parts)
    CORRUPTIONS[kind](bad)
    fresh = _tiny(seed=1)
    with caplog.at_level(logging.WARNING, logger="adapters.train"):
        got = resume_latest(root, *fresh, SHA)
    assert (got.path.name, got.step, got.state["history"]) == ("step-000001", 1, [{"step": 1}])
    assert got.skipped == ["step-000002"]
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "checkpoint step-000002 is unusable" in warning[0] and "resuming from step-000001" in warning[0]
    loaded = _lora(fresh[0])
    assert all((loaded[k] - good[k]).abs().max().item() == 0 for k in good)
    assert latest_checkpoint(root).name == "step-000001"  # the bad one is moved aside, not taken again
    assert (root / ".step-000002.corrupt").is_dir()


def test_no_good_checkpoint_starts_fresh_with_a_warning(tmp_path, caplog):
    parts = _tiny()
    root = tmp_path / "checkpoints"
    _truncate(_save(root, 1, parts) / WEIGHTS)
    fresh = _tiny(seed=1)
    before = _lora(fresh[0])
    with caplog.at_level(logging.WARNING, logger="adapters.train"):
        got = resume_latest(root, *fresh, SHA)
    assert (got.path, got.step, got.state, got.skipped) == (None, 0, None, ["step-000001"])
    assert any("no usable checkpoint" in r.getMessage() and "starting from step 0" in r.getMessage() for r in caplog.records)
    assert all((_lora(fresh[0])[k] == before[k]).all() for k in before)  # nothing half-loaded


def test_a_checkpoint_of_another_config_is_still_refused(tmp_path):
    parts = _tiny()
    root = tmp_path / "checkpoints"
    _save(root, 1, parts)
    with pytest.raises(ConfigError, match="was written with train config sha256 aaaaaaaaaaaa"):
        resume_latest(root, *_tiny(), "b" * 64)


