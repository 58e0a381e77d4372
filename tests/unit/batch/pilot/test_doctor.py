"""The doctor: a real compute check against a float64 reference, JSON findings, blocker exit code."""

from __future__ import annotations

import json

import pytest

from batch.pilot import doctor


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_check_is_real(dtype):
    check = doctor.compute_check("cpu", dtype, n=128)
    assert check.status == "ok"
    assert 0 < check.data["relative_error"] < doctor.MAX_RELATIVE_ERROR[dtype]
    assert check.data["seconds"] > 0 and check.data["finite"]
    if dtype == "bfloat16":  # bf16 really rounds: the error is far above float32's
        assert check.data["relative_error"] > 1e-4


def test_findings_and_json(tmp_path, capsys):
    out = tmp_path / "env.json"
    code = doctor.main(["--json", str(out)])
    doc = json.loads(out.read_text())
    printed = capsys.readouterr()
    assert f"findings as JSON: {out}" in printed.err and '"checks"' not in printed.out + printed.err  # the table only
    actors = next(c for c in doc["checks"] if c["name"] == "actors")
    assert f"choose {actors['data']['recommended_cpu_actors']} CPU actor(s) here" in actors["detail"]
    names = [c["name"] for c in doc["checks"]]
    for expected in ("python", "virtualenv", "torch", "accelerators", "compute cpu float32", "vllm", "c++ compiler", "ray", "disk",
                     "memory", "config"):
        assert expected in names
    cxx = next(c for c in doc["checks"] if c["name"] == "c++ compiler")
    assert cxx["status"] == "ok" and cxx["data"]["command"] == "g++"  # this machine compiles long CPU batches
    torch_check = next(c for c in doc["checks"] if c["name"] == "torch")
    assert torch_check["data"]["build"] in ("cpu", "cuda", "rocm")
    assert code == (6 if not doc["ok"] else 0)


def test_the_doctor_prints_its_table_and_where_the_json_is_not_the_json(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCPILOT_HOME", str(tmp_path))
    doctor.main([])
    printed = capsys.readouterr()
    assert "docpilot doctor" in printed.err and f"findings as JSON: {tmp_path / 'doctor.json'}" in printed.err
    assert '"checks"' not in printed.out + printed.err
    assert json.loads((tmp_path / "doctor.json").read_text())["checks"]
    doctor.main(["--json", "-"])
    assert json.loads(capsys.readouterr().out)["checks"]


@pytest.mark.parametrize(("cores", "available_gib", "need_gib", "actors"), [
    (2, 15.0, 4.25, 2),  # the 2-core CI machine: the README's 2-actor figure
    (16, 15.0, 4.25, 3),  # memory bounds it
    (1, 64.0, 4.25, 1),  # one core: one engine
    (8, 2.0, 4.25, 1),  # not even one fits: still 1 (the memory row is the blocker)
    (4, None, 4.25, 4),  # memory unknown
])
def test_the_actor_count_to_choose_is_the_smaller_of_cores_and_engines_that_fit(cores, available_gib, need_gib, actors):
    avail = None if available_gib is None else int(available_gib * 2**30)
    assert doctor.actor_count_for(cores, avail, int(need_gib * 2**30)) == actors


def test_wrong_results_are_a_blocker(monkeypatch, tmp_path):
    # a device whose products are off by more than the tolerance must block the run
    monkeypatch.setitem(doctor.MAX_RELATIVE_ERROR, "float32", 0.0)
    assert doctor.compute_check("cpu", "float32", n=64).status == "blocker"
    assert doctor.main(["--json", str(tmp_path / "e.json")]) == 6
    assert not json.loads((tmp_path / "e.json").read_text())["ok"]


def test_a_missing_cpp_compiler_is_a_warning_not_a_blocker(monkeypatch):
    # long CPU batches then stay eager (batch.run.attempt) and enforce_eager false is refused (classify.engine.args)
    monkeypatch.setattr(doctor, "cpp_compiler", lambda: None)
    checks = {c.name: c for c in doctor.run_checks(check_model=False)}
    assert checks["c++ compiler"].status == "warn" and "apt-get install g++" in checks["c++ compiler"].detail
    assert checks["c++ compiler"] not in doctor.blockers(list(checks.values()))


def test_memory_need_is_the_plans_estimate(monkeypatch):
    # one formula for the doctor, `make plan` and the pilot's measured-vs-estimate check (classify.model.memory);
    # the doctor's own figure (weights + KV + 1 GiB, ~2.3 GiB) passed machines the engine (4.3 GiB measured) did not fit
    from classify.config.sections import PilotConfig
    from classify.engine.args import compute_dtype
    from classify.model.memory import (
        CPU_ENGINE_PROCESSES,
        CPU_RUNTIME_BYTES_PER_PROCESS,
        DTYPE_BYTES,
        GIB,
        cpu_serving_estimate,
    )
    from classify.model.model import resolve_model
    from classify.model.shape import shape_from_folder

    cfg = PilotConfig()
    eng = cfg.engine.resolve("cpu")
    expected = cpu_serving_estimate(shape_from_folder(resolve_model(cfg.model).path), DTYPE_BYTES[compute_dtype(cfg.model)],
                                    kv_cache_space_gib=eng.kv_cache_space_gib, max_loras=eng.max_loras,
                                    max_lora_rank=eng.max_lora_rank, enable_lora=True, usable_bytes=0).needed
    assert expected > eng.kv_cache_space_gib * GIB + CPU_ENGINE_PROCESSES * CPU_RUNTIME_BYTES_PER_PROCESS  # weights counted
    monkeypatch.setattr(doctor, "_mem_available_bytes", lambda: expected - 1)  # one byte short: a blocker
    mem = next(c for c in doctor.run_checks(cfg) if c.name == "memory")
    assert mem.status == "blocker" and mem.data["need_bytes"] == expected
    assert set(mem.data["parts"]) == {"weights", "kv_cache", "lora_slots", "runtime"} and "measured peak" in mem.detail
    monkeypatch.setattr(doctor, "_mem_available_bytes", lambda: expected)
    assert next(c for c in doctor.run_checks(cfg) if c.name == "memory").status == "ok"


def test_memory_of_a_hub_model_id_is_sized_without_its_weights(monkeypatch):
    # vLLM fetches a hub id itself: not a blocker here, and the line says the weights are not counted
    from classify.config.sections import ModelConfig, PilotConfig

    cfg = PilotConfig(model=ModelConfig(base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    est, formula = doctor.engine_memory(cfg, 64 * 2**30)
    assert est.parts["weights"] == 0 and est.parts["kv_cache"] == cfg.engine.kv_cache_space_gib * 2**30 and est.fits
    assert "not counted: not a local folder" in formula
    monkeypatch.setattr(doctor, "_mem_available_bytes", lambda: 64 * 2**30)
    assert next(c for c in doctor.run_checks(cfg) if c.name == "memory").status == "ok"


def test_the_config_finding_names_a_train_section_make_train_would_refuse(tmp_path):
    from tests.support import ROOT

    assert doctor.config_check(ROOT / "config" / "docpilot.json").status == "ok"
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["train"]["training"]["max_steps"] = 400  # beside the shipped `epochs`: train refuses, the pilot reads on
    bad = tmp_path / "docpilot.json"
    bad.write_text(json.dumps(data))
    check = doctor.config_check(bad)
    assert check.status == "warn" and check.data["batch"] == "ok"
    assert "`make train` would refuse it" in check.detail and "exactly one of `max_steps` and `epochs`" in check.detail
    assert "max_steps=400, epochs=2" in check.data["train"]
