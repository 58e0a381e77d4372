"""The engine's dtype and the vLLM engine arguments, chosen for the device (:mod:`classify.machine.device`).

:func:`engine_kwargs` is the one place vLLM's arguments are decided: the offline engine
(:func:`classify.engine.build.build_engine`) and the server's async engine (``serve/engine.py``) both
build from it.
"""

from __future__ import annotations

import platform
from typing import Any

from classify.config.engine import COMPILE_MIN_DOCS_PER_ENGINE
from classify.config.sections import EngineConfig, ModelConfig
from classify.errors import EnvironmentCheckError
from classify.machine.device import auto_dtype, cpp_compiler, detect_device
from classify.model.model import ModelRef
from classify.paths import verbose_logs


def compute_dtype(model_cfg: ModelConfig) -> str:
    """Resolve ``model.dtype``: ``auto`` is bfloat16 on accelerators and bf16-capable CPUs, else float32.

    Returns:
        ``"bfloat16"``, ``"float16"`` or ``"float32"``.
    """
    if model_cfg.dtype != "auto":
        return model_cfg.dtype
    return auto_dtype()


def engine_kwargs(
    model: ModelRef,
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    enable_lora: bool,
    device: str | None = None,
) -> dict[str, Any]:
    """vLLM ``EngineArgs`` keyword arguments for docpilot's classifier, chosen for the device.

    ``"auto"`` engine fields are resolved for ``device`` (:meth:`EngineConfig.resolve`): eager mode,
    64 sequences and vLLM's token budget on CPU; CUDA graphs, 256 sequences, 16384 batched tokens and
    ``gpu_memory_utilization`` on CUDA/ROCm. Values the user set are passed as given. The process
    environment is not touched: what vLLM reads from it comes from :func:`engine_env`, which the caller
    that starts the engine applies.

    Args:
        model: the resolved base model.
        model_cfg: dtype (``auto`` resolved by :func:`compute_dtype`) and ``max_model_len``.
        engine_cfg: engine sizing.
        enable_lora: reserve LoRA slots (``max_loras`` x ``max_lora_rank``).
        device: ``cpu``, ``cuda`` or ``rocm``; ``None`` detects this machine's (:func:`detect_device`).

    Returns:
        Keyword arguments for ``vllm.LLM(...)`` or ``vllm.AsyncEngineArgs(...)``.

    Raises:
        ConfigError: an unknown ``device``.
        EnvironmentCheckError: torch.compile asked for on CPU (``enforce_eager: false``, no LoRA) and no
            C++ compiler runs here (:func:`cpp_compiler`): the message says to install one or set
            ``engine.enforce_eager: true`` (vLLM's own error would come later, from deep in the compile).
    """
    device = device or detect_device()
    eng = engine_cfg.resolve(device)
    if device == "cpu" and eng.enforce_eager is False and not enable_lora and cpp_compiler() is None:
        raise EnvironmentCheckError(
            f"torch.compile (`engine.enforce_eager: false`, or `auto` in a batch of {COMPILE_MIN_DOCS_PER_ENGINE:,} or more "
            "documents per engine) "
            f"needs a C++ compiler on CPU ($CXX or g++): none runs on {platform.node() or 'this machine'}; install one (Debian/Ubuntu: "
            "`apt-get install g++`) or set `engine.enforce_eager: true`")
    dtype = model_cfg.dtype if model_cfg.dtype != "auto" else auto_dtype(device)  # for the device asked for
    kwargs: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.path,
        "dtype": dtype,
        "max_model_len": model_cfg.max_model_len,
        "max_num_seqs": eng.max_num_seqs,
        "enforce_eager": eng.enforce_eager,
        "seed": eng.seed,
        "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True,
        "use_tqdm_on_load": verbose_logs(),  # the "Loading safetensors checkpoint shards" bar only with --verbose
    }
    if eng.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = eng.max_num_batched_tokens
    kwargs.update(eng.parallel_kwargs())  # tensor parallel over the GPUs this process holds (none on CPU)
    if device != "cpu":
        kwargs["gpu_memory_utilization"] = eng.gpu_memory_utilization
    if enable_lora:
        kwargs.update(enable_lora=True, max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank)
    return kwargs


def engine_env(engine_cfg: EngineConfig, device: str | None = None) -> dict[str, str]:
    """The environment variables vLLM reads at engine start for ``engine_cfg`` on ``device``.

    On CPU, vLLM sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) rather than from
    ``gpu_memory_utilization``; on a GPU nothing is needed. The caller that starts the engine sets them
    (``os.environ.update``) just before it does.

    Args:
        engine_cfg: engine sizing.
        device: ``cpu``, ``cuda`` or ``rocm``; ``None`` detects this machine's (:func:`detect_device`).

    Returns:
        Variable name -> value (empty off the CPU).
    """
    device = device or detect_device()
    if device != "cpu":
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": str(engine_cfg.resolve(device).kv_cache_space_gib)}
