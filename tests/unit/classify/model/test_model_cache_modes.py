"""The model cache is readable by other users (an image's uid 10001 reading a root-provisioned cache)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from classify.config.sections import DEFAULT_BASE_MODEL
from classify.model.model import CACHE_DTYPE, FINGERPRINT_FILE, provision_default_model, share_readable


def _modes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in [folder, *folder.iterdir()]}


@pytest.fixture()
def private_copy(tmp_path: Path) -> Path:
    """A copy of the provisioned cache with the modes older provisioning left (folder 0700, weights 0600)."""
    source = provision_default_model(CACHE_DTYPE)  # the shared cache of `make model` (built once)
    cache = tmp_path / "models"
    target = cache / Path(source.path).name
    shutil.copytree(source.path, target)
    target.chmod(0o700)
    for p in target.iterdir():
        p.chmod(0o600)
    return cache


def test_reuse_of_an_old_private_cache_makes_it_readable(private_copy: Path):
    ref = provision_default_model(CACHE_DTYPE, private_copy)
    folder = private_copy / f"{DEFAULT_BASE_MODEL}-{CACHE_DTYPE}"
    assert Path(ref.path) == folder and (folder / FINGERPRINT_FILE).is_file()
    modes = _modes(folder)
    assert modes.pop(folder.name) == 0o755
    assert modes and set(modes.values()) == {0o644}, modes


def test_share_readable_reports_what_it_cannot_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "m"
    folder.mkdir(mode=0o700)
    (folder / "w.safetensors").write_bytes(b"x")
    (folder / "w.safetensors").chmod(0o600)

    def refuse(path, mode):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "chmod", refuse)
    assert share_readable(folder) is False
    monkeypatch.undo()
    assert share_readable(folder) is True
    assert _modes(folder) == {"m": 0o755, "w.safetensors": 0o644}
