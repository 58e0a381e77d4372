"""The doctor and the pilot's card figures count the cards this process can use (``CUDA_VISIBLE_DEVICES``).

The host is a fake ``nvidia-smi`` on PATH (:mod:`tests.support.fake_smi`, 8 x H100), torch's answers and a fake
``pynvml`` module that, like the real NVML, lists every card of the host whatever ``CUDA_VISIBLE_DEVICES`` says.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from batch.pilot import doctor
from tests.support import fake_smi


@pytest.fixture
def eight(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_smi.install(tmp_path / "bin", fake_smi.eight_h100())


def _fake_pynvml(monkeypatch, used_by_card: list[int]) -> None:
    """NVML over 8 cards: card ``i`` has ``used_by_card[i]`` bytes used, by processes of the host's PIDs."""
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(used_by_card)
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: [fake_smi.h100_uuid(i).encode() for i in range(8)].index(uuid)
    fake.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=40000 + h, usedGpuMemory=used_by_card[h])]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used_by_card[h], total=80 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_the_pilots_device_figure_counts_only_the_visible_cards(eight, monkeypatch):
    from batch.pilot.measure import nvml_usage

    used = [5 * 2**30] + [60 * 2**30] * 7  # our engine on card 2; other jobs fill the other seven
    used[0], used[2] = used[2], used[0]
    _fake_pynvml(monkeypatch, used)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert nvml_usage([101]) == (5 * 2**30, "nvml device used (no PID matched: container)")
    assert nvml_usage([40002]) == (5 * 2**30, "nvml processes")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{fake_smi.h100_uuid(2)},0")
    assert nvml_usage([101]) == (65 * 2**30, "nvml device used (no PID matched: container)")


def test_the_doctor_names_the_cards_this_process_can_use(eight, tmp_path, monkeypatch):
    import torch

    prefix = tmp_path / "venv"
    prefix.mkdir()
    (prefix / "docpilot-profile.json").write_text(json.dumps({"profile": "cuda", "forced": False}))
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(doctor, "_version", lambda dist: {"vllm": "0.32.0", "ray": "2.60.0"}.get(dist))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    checks = {c.name: c for c in doctor.run_checks(None, check_model=False)}
    machine, device = checks["machine"], checks["device"]
    assert machine.detail.startswith("8 x NVIDIA H100 80GB HBM3")
    assert machine.detail.endswith("; this process can use 0: none (CUDA_VISIBLE_DEVICES='')")
    assert device.status == "blocker" and "CUDA_VISIBLE_DEVICES='' names none of them: unset it" in device.detail
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    machine = {c.name: c for c in doctor.run_checks(None, check_model=False)}["machine"]
    assert "; this process can use 1: NVIDIA H100 80GB HBM3 (81559 MiB, compute 9.0) (CUDA_VISIBLE_DEVICES='3')" in machine.detail
    assert [g["index"] for g in machine.data["visible"]] == [3]
