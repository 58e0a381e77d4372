"""Atomic training checkpoints: LoRA weights, optimizer, scheduler, RNG and loss history.

``<run>/checkpoints/step-000020/`` is written as ``.step-000020.tmp`` and renamed into
place, so a process killed mid-write leaves only a hidden temporary folder that
:func:`latest_checkpoint` ignores (and the next save removes).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from classify.errors import ConfigError

WEIGHTS = "adapter_model.safetensors"
STATE = "trainer_state.pt"
META = "meta.json"
PREFIX = "step-"


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / META).is_file()]
    return sorted(done, key=_step_of)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint, or ``None``."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, state: dict[str, Any],
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
    """
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".{final.name}.tmp"
    tmp.mkdir()
    weights = {k: v.detach().contiguous().clone() for k, v in get_peft_model_state_dict(model).items()}
    save_file(weights, str(tmp / WEIGHTS))
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
         "state": state},
        tmp / STATE,
    )
    (tmp / META).write_text(json.dumps({"step": step, "config_sha256": config_sha256}, indent=2) + "\n")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # a re-run of the same step after a resume: replace the old copy
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, config_sha256: str) -> tuple[int, dict[str, Any]]:
    """Restore LoRA weights, optimizer, scheduler and the torch RNG from ``path``.

    Returns:
        ``(step, state)``.

    Raises:
        ConfigError: the checkpoint was written with another train config.
    """
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    meta = json.loads((path / META).read_text())
    if meta["config_sha256"] != config_sha256:
        raise ConfigError(
            f"checkpoint {path} was written with train config sha256 {meta['config_sha256'][:12]}..., "
            f"not the current {config_sha256[:12]}...; resume with the same config or start a new run"
        )
    set_peft_model_state_dict(model, load_file(str(path / WEIGHTS)))
    saved = torch.load(path / STATE, weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    return int(meta["step"]), saved["state"]
