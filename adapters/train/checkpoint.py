"""Atomic training checkpoints: LoRA weights, optimizer, scheduler, RNG and loss history.

``<run>/checkpoints/step-000020/`` is written as ``.step-000020.tmp`` and renamed into
place, so a process killed mid-write leaves only a hidden temporary folder that
:func:`latest_checkpoint` ignores (and the next save removes). A write that fails (full disk,
exceeded quota, I/O error) removes the temporary folder and raises
:class:`~classify.errors.EnvironmentCheckError`; the checkpoints already there stay intact.

On resume, :func:`resume_latest` reads the newest checkpoint whole before applying any of it;
one that is cut short, invalid or missing a file is moved aside (``.step-NNNNNN.corrupt``) with a
warning and the previous one is tried; with none usable the run starts from step 0.

What the checkpoints were trained on is recorded in the run's ``config.json`` (``inputs``: the training
data's sha256, the tokenizer files' and the base model's fingerprints); :func:`check_inputs` refuses a
resume where any of them changed (the config itself is checked by its hash, in ``meta.json``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.train.support import is_write_failure
from classify.errors import ConfigError, EnvironmentCheckError
from classify.model.model import ModelRef, tokenizer_sha256
from classify.runs.disk import free_mib, is_disk_full
from classify.runs.files import atomic_dir, file_sha256
from classify.runs.records import write_json_atomic

log = logging.getLogger("adapters.train")

WEIGHTS = "adapter_model.safetensors"
STATE = "trainer_state.pt"
META = "meta.json"
PREFIX = "step-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


class CorruptCheckpoint(Exception):
    """A checkpoint folder that cannot be used (cut short, invalid, a file missing); internal to resume."""


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint folders (``step-NNNNNN``) under ``root``, oldest first.

    A folder is only listed once it was renamed into place, which happens after all its files were
    written and synced; whether its files are still readable is checked by :func:`resume_latest`.

    Args:
        root: the run's ``checkpoints`` folder.

    Returns:
        The folders, by step.
    """
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir()]
    return sorted(done, key=_step_of)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint folder, or ``None``."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, *, state: dict[str, Any],
                    config_sha256: str, keep: int) -> Path:
    """Write one checkpoint atomically and keep only the ``keep`` newest.

    Args:
        root: the run's ``checkpoints`` folder.
        step: optimizer steps done.
        model: the peft model (only its LoRA weights are saved).
        optimizer: the torch optimizer.
        scheduler: the LR scheduler.
        state: extra picklable-free state (loss history, token counts...).
        config_sha256: hash of the resolved train config; resume refuses another config.
        keep: checkpoints to keep.

    Returns:
        The checkpoint folder.

    Raises:
        EnvironmentCheckError: a file could not be written (full disk, exceeded quota, I/O error); the
            message names the folder, the file and the free space, and the partial checkpoint is removed.
    """
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    writing = "the folder"
    free: float | None = None
    try:
        # written in a hidden .<name>-*.tmp folder, renamed into place (a re-run of the same step after a
        # resume replaces the old copy)
        with atomic_dir(final, suffix=".tmp", if_exists="replace") as staged:
            tmp = staged.path
            try:
                weights = {k: v.detach().contiguous().clone() for k, v in get_peft_model_state_dict(model).items()}
                writing = WEIGHTS
                save_file(weights, str(tmp / WEIGHTS))
                writing = STATE
                torch.save(
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                     **({"cuda_rng": torch.cuda.get_rng_state_all()} if torch.cuda.is_initialized() else {}),
                     "state": state},
                    tmp / STATE,
                )
                writing = META
                (tmp / META).write_text(json.dumps({"step": step, "config_sha256": config_sha256}, indent=2) + "\n")
                for f in tmp.iterdir():
                    writing = f"{f.name} (fsync)"
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
                writing = "the rename into place"
            except Exception:
                free = free_mib(root)  # before the partial files are removed: what the write ran into
                raise
    except Exception as err:
        free = free_mib(root) if free is None else free
        if not is_write_failure(err):
            raise
        raise _write_error(root, final.name, writing, err, free) from err
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


FULL_MIB = 1.0
"""Free space (MiB) under which a write failure without an errno (torch's zip writer) counts as a full disk."""


def _write_error(root: Path, name: str, writing: str, err: BaseException, free: float) -> EnvironmentCheckError:
    newest = latest_checkpoint(root)
    what = "disk full" if is_disk_full(err) or 0 <= free < FULL_MIB else "write failed"
    kept = (f"the checkpoints already there are intact (newest: {newest.name}); free space (or set DOCPILOT_RUNS "
            f"elsewhere for a new run) and continue with the same `docpilot train` command plus "
            f"`--resume {root.parent}`"
            if newest else "no checkpoint was written yet; free space (or set DOCPILOT_RUNS elsewhere) and start again")
    return EnvironmentCheckError(
        f"{what}: could not write checkpoint {name} ({writing}) in {root}: {free:.1f} MiB free on that "
        f"file system when it failed ({type(err).__name__}: {err}); the partial checkpoint was removed; {kept}"
    )


def _read(path: Path, model: Any, config_sha256: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Read and check every file of one checkpoint without applying anything.

    Raises:
        CorruptCheckpoint: a file is missing, cut short or invalid.
        ConfigError: the checkpoint was written with another train config.
    """
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    for name in (META, WEIGHTS, STATE):
        if not (path / name).is_file():
            raise CorruptCheckpoint(f"{name} is missing")
    try:
        meta = json.loads((path / META).read_text())
        step, sha = int(meta["step"]), str(meta["config_sha256"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CorruptCheckpoint(f"{META} is invalid ({type(err).__name__}: {err})") from err
    if step != _step_of(path):
        raise CorruptCheckpoint(f"{META} says step {step}")
    if sha != config_sha256:
        raise ConfigError(
            f"checkpoint {path} was written with train config sha256 {sha[:12]}..., "
            f"not the current {config_sha256[:12]}...; resume with the same config or start a new run"
        )
    try:
        weights = load_file(str(path / WEIGHTS))
    except Exception as err:  # SafetensorError (cut short, bad header) or OSError
        raise CorruptCheckpoint(f"{WEIGHTS} is unreadable ({type(err).__name__}: {err})") from err
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != expected:
        diff = sorted(set(found.items()) ^ set(expected.items()))[:3]
        raise CorruptCheckpoint(f"{WEIGHTS} does not hold this model's LoRA weights (first differences: {diff})")
    try:
        saved = torch.load(path / STATE, weights_only=True)
        saved = {**{k: saved[k] for k in ("optimizer", "scheduler", "torch_rng", "state")},
                 "cuda_rng": saved.get("cuda_rng")}  # dropout's generator on a card (absent: a CPU run)
    except Exception as err:  # RuntimeError (zip cut short), EOFError, UnpicklingError, KeyError, TypeError
        raise CorruptCheckpoint(f"{STATE} is unreadable ({type(err).__name__}: {err})") from err
    return step, weights, saved


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, config_sha256: str) -> tuple[int, dict[str, Any]]:
    """Restore LoRA weights, optimizer, scheduler and the torch RNG from ``path``.

    Every file is read and checked before anything is applied, so a checkpoint that turns out
    unusable leaves the model and optimizer as they were.

    Args:
        path: a ``step-NNNNNN`` folder.
        model: the peft model.
        optimizer: the torch optimizer built for ``model``.
        scheduler: the LR scheduler.
        config_sha256: hash of the current train config.

    Returns:
        ``(step, state)``.

    Raises:
        CorruptCheckpoint: a file is missing, cut short or invalid.
        ConfigError: the checkpoint was written with another train config.
    """
    import torch
    from peft import set_peft_model_state_dict

    step, weights, saved = _read(path, model, config_sha256)
    try:
        optimizer.load_state_dict(saved["optimizer"])  # checks the parameter groups before changing anything
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"])
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise CorruptCheckpoint(f"{STATE} does not fit this run ({type(err).__name__}: {err})") from err
    set_peft_model_state_dict(model, weights)
    return step, saved["state"]


@dataclass
class Resumed:
    """Where a resumed run starts.

    Attributes:
        path: the checkpoint loaded, or ``None`` when none was usable (start from step 0).
        step: optimizer steps already done.
        state: the loop state saved with it (``None`` when starting fresh).
        skipped: names of unusable checkpoints that were moved aside, newest first.
    """

    path: Path | None
    step: int = 0
    state: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)


def resume_latest(root: Path, model: Any, optimizer: Any, scheduler: Any, config_sha256: str) -> Resumed:
    """Load the newest usable checkpoint under ``root``, skipping (and moving aside) unusable ones.

    A checkpoint whose weights or trainer state are cut short, whose ``meta.json`` is invalid, or
    that misses a file is renamed to ``.step-NNNNNN.corrupt`` (kept for inspection, never taken
    again) with a warning naming it and the checkpoint used instead. With none usable the run starts
    from step 0, which ends where an uninterrupted run ends (the data order and the seeds are fixed).

    Args:
        root: the run's ``checkpoints`` folder.
        model: the peft model.
        optimizer: the torch optimizer built for ``model``.
        scheduler: the LR scheduler.
        config_sha256: hash of the current train config.

    Returns:
        The :class:`Resumed` position.

    Raises:
        ConfigError: a readable checkpoint was written with another train config.
    """
    skipped: list[str] = []
    reasons: list[str] = []
    for path in reversed(list_checkpoints(root)):
        try:
            step, state = load_checkpoint(path, model, optimizer, scheduler, config_sha256)
        except CorruptCheckpoint as err:
            aside = root / f".{path.name}.corrupt"
            try:
                shutil.rmtree(aside, ignore_errors=True)
                os.rename(path, aside)
                where = f"moved aside to {aside.name}"
            except OSError as move_err:
                where = f"left in place: {move_err}"
            skipped.append(path.name)
            reasons.append(f"checkpoint {path.name} is unusable ({err}; {where})")
            continue
        if skipped:
            log.warning("%s; resuming from %s", "; ".join(reasons), path.name)
        return Resumed(path, step, state, skipped)
    if skipped:
        log.warning("%s; no usable checkpoint in %s: starting from step 0", "; ".join(reasons), root)
    return Resumed(None, 0, None, skipped)


INPUTS = "inputs"
"""Key of a run's ``config.json`` recording what its checkpoints were trained on (:func:`run_inputs`)."""


def run_inputs(data_path: Path, data_sha256: str | None, model: ModelRef) -> dict[str, Any]:
    """What a run trains on, beside its config: the data file, the tokenizer and the base model.

    Args:
        data_path: the training data file (``train.data.path`` expanded).
        data_sha256: its sha256, or ``None`` to hash it here (``None`` stays when the file is missing).
        model: the resolved base model.

    Returns:
        ``{"data": {"path", "sha256"}, "tokenizer": {"path", "sha256"}, "base_model": {"name", "fingerprint"}}``
        (a hub id has no local tokenizer files: its ``sha256`` is ``None``, its fingerprint ``""``).
    """
    if data_sha256 is None and data_path.is_file():
        data_sha256 = file_sha256(data_path)
    return {"data": {"path": str(data_path), "sha256": data_sha256},
            "tokenizer": {"path": model.path, "sha256": tokenizer_sha256(model.path)},
            "base_model": {"name": model.name, "fingerprint": model.fingerprint}}


def check_inputs(run_dir: Path, inputs: dict[str, Any]) -> None:
    """Refuse to resume a run whose training data, tokenizer or base model changed since it started.

    The run's ``config.json`` keeps the :func:`run_inputs` its checkpoints were trained on. While the run has
    no checkpoint (a new run, or one stopped before its first), nothing was trained yet: ``inputs`` is
    recorded (replacing an earlier record) and the run goes on. A data file that is missing now is left to
    the data reader's own message.

    Args:
        run_dir: the run folder (``config.json``, ``checkpoints/``).
        inputs: this invocation's :func:`run_inputs`.

    Raises:
        ConfigError: a checkpoint exists and the data's sha256, the tokenizer's or the base model's
            fingerprint differs from the record; the message names the run, each value recorded and
            found, and what to do (restore it, or start a new run).
    """
    path = run_dir / "config.json"
    record = json.loads(path.read_text())
    recorded = record.get(INPUTS)
    newest = latest_checkpoint(run_dir / "checkpoints")
    if recorded is None or newest is None:
        if recorded is None and newest is not None:
            log.warning("run %s was started before docpilot recorded its training data, tokenizer and base model: "
                        "they cannot be compared on this resume; recorded now", run_dir.name)
        if recorded != inputs:
            write_json_atomic(path, {**record, INPUTS: inputs})
        return
    was, now = recorded.get("data", {}), inputs["data"]
    changed = []
    if now["sha256"] is not None and was.get("sha256") != now["sha256"]:
        moved = f" (then read from {was.get('path')})" if was.get("path") != now["path"] else ""
        changed.append(f"the training data {now['path']}{moved} has sha256 {now['sha256']}, the run started with "
                       f"{was.get('sha256')}: restore that file")
    was, now = recorded.get("tokenizer", {}), inputs["tokenizer"]
    if was.get("sha256") != now["sha256"]:
        changed.append(f"the tokenizer files in {now['path']} have sha256 {now['sha256']}, the run started with "
                       f"{was.get('sha256')} (in {was.get('path')}): restore those files")
    was, now = recorded.get("base_model", {}), inputs["base_model"]
    if was.get("fingerprint") != now["fingerprint"]:
        changed.append(f"the base model {now['name']!r} has fingerprint {now['fingerprint'] or '(none: a hub id)'}, "
                       f"the run started with {was.get('fingerprint') or '(none: a hub id)'}: restore that model")
    if changed:
        raise ConfigError(
            f"cannot resume training run {run_dir.name} ({run_dir}): its checkpoints (newest: {newest.name}) were "
            f"trained on other inputs than these: " + "; ".join(changed) + " and resume again, or start a new run "
            "(the same `docpilot train` command without `--resume`)"
        )
