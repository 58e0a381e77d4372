"""What :func:`classify.engine.args.engine_kwargs` hands vLLM on each device (no engine, no accelerator needed).

The shipped config files leave the device-dependent fields on ``"auto"``; the same file must give
vLLM's CPU settings here and its throughput settings (CUDA graphs, ``gpu_memory_utilization``,
more sequences and batched tokens) on a CUDA or ROCm lot.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from classify.config.sections import (
    EngineConfig,
    ModelConfig,
    PilotConfig,
    classification_sha256,
    load_config,
    parse_config,
)
from classify.engine.args import engine_env, engine_kwargs
from classify.errors import ConfigError
from classify.model.model import ModelRef
from classify.paths import verbose_logs

ROOT = Path(__file__).resolve().parents[4]
MODEL = ModelRef(name="m", path="/models/m", fingerprint="sha256:0", source="local")
BASE = {"model": MODEL.path, "tokenizer": MODEL.path, "max_model_len": 1024, "seed": 0,
        "logprobs_mode": "processed_logprobs", "enable_prefix_caching": True, "use_tqdm_on_load": verbose_logs()}


@pytest.fixture(autouse=True)
def _keep_kv_env(monkeypatch):
    """No VLLM_CPU_KVCACHE_SPACE from the outside: the tests see that engine_kwargs never writes it."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)


@pytest.mark.parametrize(
    ("device", "engine", "lora", "expected", "kv_env"),
    [
        # the shipped engine section ("auto" fields) on each device
        ("cpu", {}, False, {"enforce_eager": True, "max_num_seqs": 64}, "1"),
        ("cuda", {}, False, {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384,
                             "gpu_memory_utilization": 0.85}, None),
        ("rocm", {}, False, {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384,
                             "gpu_memory_utilization": 0.85}, None),
        # values the user set are kept on every device
        ("cpu", {"enforce_eager": False, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "kv_cache_space_gib": 3},
         False, {"enforce_eager": False, "max_num_seqs": 8, "max_num_batched_tokens": 2048}, "3"),
        ("cuda", {"enforce_eager": True, "max_num_seqs": 32, "max_num_batched_tokens": None,
                  "gpu_memory_utilization": 0.5}, False,
         {"enforce_eager": True, "max_num_seqs": 32, "gpu_memory_utilization": 0.5}, None),
        # LoRA slots, same on every device
        ("cpu", {"max_loras": 3, "max_lora_rank": 8}, True,
         {"enforce_eager": True, "max_num_seqs": 64, "enable_lora": True, "max_loras": 3, "max_lora_rank": 8}, "1"),
        ("cuda", {"max_loras": 3, "max_lora_rank": 8}, True,
         {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384, "gpu_memory_utilization": 0.85,
          "enable_lora": True, "max_loras": 3, "max_lora_rank": 8}, None),
    ],
    ids=["cpu-auto", "cuda-auto", "rocm-auto", "cpu-user", "cuda-user", "cpu-lora", "cuda-lora"],
)
def test_engine_kwargs_per_device(device, engine, lora, expected, kv_env):
    model_cfg = ModelConfig(dtype="bfloat16")
    kwargs = engine_kwargs(MODEL, model_cfg, parse_config(EngineConfig, engine), lora, device=device)
    assert kwargs == {**BASE, "dtype": "bfloat16", **expected}
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # computed, never written: the engine's starter applies it
    env = engine_env(parse_config(EngineConfig, engine), device=device)
    assert env == ({"VLLM_CPU_KVCACHE_SPACE": kv_env} if kv_env else {})


@pytest.mark.parametrize("device", ["cpu", "cuda", "rocm"])
def test_shipped_configs_resolve_without_editing(device):
    """config/docpilot.json's one engine section gives each device its settings without editing."""
    import json

    section = json.loads((ROOT / "config" / "docpilot.json").read_text())["engine"]
    eng = parse_config(EngineConfig, section, "docpilot.json").resolve(device)
    assert eng.enforce_eager is (device == "cpu")
    assert eng.max_num_seqs == (64 if device == "cpu" else 256)
    assert (eng.gpu_memory_utilization is None) is (device == "cpu")
    assert (eng.kv_cache_space_gib is None) is (device != "cpu")


def test_auto_dtype_follows_the_device_asked_for():
    kwargs = engine_kwargs(MODEL, ModelConfig(dtype="auto"), EngineConfig(), False, device="cuda")
    assert kwargs["dtype"] == "bfloat16"
    assert engine_kwargs(MODEL, ModelConfig(dtype="float16"), EngineConfig(), False, device="rocm")["dtype"] == "float16"


def test_default_device_is_this_machine():
    from classify.machine.device import detect_device

    assert detect_device() == "cpu"  # the test machine has no accelerator
    assert engine_kwargs(MODEL, ModelConfig(dtype="float32"), EngineConfig(), False) == engine_kwargs(
        MODEL, ModelConfig(dtype="float32"), EngineConfig(), False, device="cpu")


def test_unknown_device_is_refused():
    with pytest.raises(ConfigError, match=r"`device` must be one of \['cpu', 'cuda', 'rocm'\], got 'tpu'"):
        engine_kwargs(MODEL, ModelConfig(), EngineConfig(), False, device="tpu")


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"max_num_seqs": 0}, r"`engine.max_num_seqs` must be greater than or equal to 1, got 0"),
        ({"max_num_seqs": "fast"}, r"`engine.max_num_seqs` must be 'auto', an integer from 1 to 4096, got \"fast\""),
        ({"max_num_batched_tokens": 0}, r"`engine.max_num_batched_tokens` must be greater than or equal to 1, got 0"),
        ({"enforce_eager": "yes"}, r"`engine.enforce_eager` must be 'auto', true or false, got \"yes\""),
    ],
)
def test_engine_field_errors_name_field_value_and_allowed(engine, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(PilotConfig, {"engine": engine}, "pilot.json")


def test_engine_settings_leave_the_pilot_gate_key_alone():
    shipped = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    tuned = parse_config(PilotConfig, {**shipped.model_dump(mode="json"),
                                       "engine": {"enforce_eager": False, "max_num_seqs": 512}})
    assert classification_sha256(shipped.model, shipped.classify) == classification_sha256(tuned.model, tuned.classify)


def test_for_workload_compiles_only_long_runs_and_keeps_what_the_user_set():
    from classify.config.engine import COMPILE_MIN_DOCS_PER_ENGINE

    auto = EngineConfig()
    assert auto.for_workload(COMPILE_MIN_DOCS_PER_ENGINE - 1) is auto
    compiled = auto.for_workload(COMPILE_MIN_DOCS_PER_ENGINE)
    assert compiled.enforce_eager is False and compiled.model_copy(update={"enforce_eager": "auto"}) == auto
    assert compiled.resolve("cpu").enforce_eager is False and compiled.resolve("cuda").enforce_eager is False
    assert auto.resolve("cpu").enforce_eager is True  # the pilot, the server and small batches stay eager on CPU
    for user in (True, False):
        assert EngineConfig(enforce_eager=user).for_workload(10**7).enforce_eager is user


def test_torch_compile_on_cpu_without_a_cpp_compiler_is_refused_before_vllm():
    import torch._inductor.config as inductor_config

    from classify.errors import EnvironmentCheckError
    from classify.machine.device import cpp_compiler

    assert cpp_compiler() is not None  # this machine has g++ (the compiled-engine tests need it)
    with inductor_config.patch({"cpp.cxx": (None, "docpilot-no-such-c++")}):  # what CXX=docpilot-no-such-c++ gives inductor
        assert cpp_compiler() is None
        with pytest.raises(EnvironmentCheckError, match=r"needs a C\+\+ compiler on CPU \(\$CXX or g\+\+\): none runs on .*"
                                                         r"`apt-get install g\+\+`\) or set `engine.enforce_eager: true`"):
            engine_kwargs(MODEL, ModelConfig(), EngineConfig(enforce_eager=False), False, device="cpu")
        assert engine_kwargs(MODEL, ModelConfig(), EngineConfig(), False, device="cpu")["enforce_eager"] is True
        # LoRA on CPU never compiles (vLLM turns it off); accelerators are not checked (their kernels are Triton's)
        assert engine_kwargs(MODEL, ModelConfig(), EngineConfig(enforce_eager=False), True, device="cpu")["enforce_eager"] is False
        assert engine_kwargs(MODEL, ModelConfig(), EngineConfig(enforce_eager=False), False, device="cuda")["enforce_eager"] is False
    assert cpp_compiler() is not None
