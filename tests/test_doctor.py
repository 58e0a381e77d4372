"""The doctor: a real compute check against a float64 reference, JSON findings, blocker exit code."""

from __future__ import annotations

import json

import pytest

from classify import doctor


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_check_is_real(dtype):
    check = doctor.compute_check("cpu", dtype, n=128)
    assert check.status == "ok"
    assert 0 < check.data["relative_error"] < doctor.MAX_RELATIVE_ERROR[dtype]
    assert check.data["seconds"] > 0 and check.data["finite"]
    if dtype == "bfloat16":  # bf16 really rounds: the error is far above float32's
        assert check.data["relative_error"] > 1e-4


def test_findings_and_json(tmp_path):
    out = tmp_path / "env.json"
    code = doctor.main(["--json", str(out)])
    doc = json.loads(out.read_text())
    names = [c["name"] for c in doc["checks"]]
    for expected in ("python", "virtualenv", "torch", "accelerators", "compute cpu float32", "vllm", "ray", "disk", "memory"):
        assert expected in names
    torch_check = next(c for c in doc["checks"] if c["name"] == "torch")
    assert torch_check["data"]["build"] in ("cpu", "cuda", "rocm")
    assert code == (6 if not doc["ok"] else 0)


def test_wrong_results_are_a_blocker(monkeypatch, tmp_path):
    # a device whose products are off by more than the tolerance must block the run
    monkeypatch.setitem(doctor.MAX_RELATIVE_ERROR, "float32", 0.0)
    assert doctor.compute_check("cpu", "float32", n=64).status == "blocker"
    assert doctor.main(["--json", str(tmp_path / "e.json")]) == 6
    assert not json.loads((tmp_path / "e.json").read_text())["ok"]
