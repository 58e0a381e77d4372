"""What the pilot measures of its engine (peak memory, throughput) beside ``make plan``'s estimate.

Measured where (issue 10 item 8):

* CPU: the peak resident set (``VmHWM`` of ``/proc/<pid>/status``, the kernel's high-water mark of
  RSS) of the pilot process and of its ``VLLM::`` descendants (engine core, workers), summed. Shared
  library pages count once per process, so the sum is an upper bound of the host RAM taken.
* CUDA / ROCm: vLLM's own account from its worker (weights, KV cache, peak activations, torch's
  ``max_memory_allocated``), reached with ``LLM.collective_rpc`` when the engine may run a callable
  (``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), else the device memory NVML reports for the engine's
  processes; the front end's own ``torch.cuda.max_memory_allocated`` is recorded too (zero unless
  the engine runs in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Not exercised on hardware by
  the test suite (the test machine is a CPU).
* Throughput: documents and prompt tokens of the classify stage over its wall time.

The estimate is :mod:`classify.memory`'s for the same model and engine section:
:func:`~classify.memory.cpu_serving_estimate` on CPU; on an accelerator vLLM claims the whole
``gpu_memory_utilization`` share of the card (KV blocks fill what weights and activations leave), so
the plan's figure for what the engine occupies is ``usable`` = card x ``gpu_memory_utilization``.
"""

from __future__ import annotations

import logging
from typing import Any

from classify.config import PilotConfig
from classify.engine import Classifier
from classify.memory import DTYPE_BYTES, GIB, cpu_serving_estimate, serving_estimate
from classify.modelshape import shape_from_folder

log = logging.getLogger(__name__)

TOLERANCE = {"cpu": 0.5, "cuda": 0.15, "rocm": 0.15}
"""Largest ``|measured / estimate - 1|`` that is not named as a gap, by device.

CPU 0.5: the runtime part (Python, torch, vLLM, oneDNN scratch) is a measured constant that moves with
the torch build, thread count and libraries; on the dev machine it was 2.87 GB of a 4.48 GB peak, and the
estimate came within 7% (ratio 0.93). Accelerators 0.15: vLLM sizes its KV cache to fill the requested
share, so the engine's use should sit at card x ``gpu_memory_utilization`` give or take its 150 MiB
buffer and the CUDA context."""

GPU_OVERHEAD_BYTES = 2 * GIB
"""``make plan``'s default ``overhead_gib_per_card`` (``config/lots.json``)."""


def vmhwm_bytes(pid: int) -> int | None:
    """Peak resident set of ``pid`` (``VmHWM`` in ``/proc/<pid>/status``), or ``None`` if unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def engine_process_peaks() -> dict[str, int]:
    """Peak RSS of this process and its ``VLLM::`` descendants, by ``"<pid> <title>"``.

    vLLM names its processes ``VLLM::<name>`` (``vllm/utils/system_utils.py``, ``set_process_title``).
    """
    import psutil

    me = psutil.Process()
    peaks: dict[str, int] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            title = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        if proc.pid != me.pid and "VLLM::" not in title:
            continue
        peak = vmhwm_bytes(proc.pid)
        if peak is not None:
            peaks[f"{proc.pid} {'pilot' if proc.pid == me.pid else title.split()[0]}"] = peak
    return peaks


def _worker_memory(worker: Any) -> dict[str, int | None]:
    """Run inside a vLLM GPU worker (``collective_rpc``): its own account of the card's memory."""
    import torch

    runner = getattr(worker, "model_runner", None)
    return {
        "weights_bytes": int(getattr(runner, "model_memory_usage", 0) or 0) or None,
        "kv_cache_bytes": int(getattr(worker, "available_kv_cache_memory_bytes", 0) or 0) or None,
        "peak_activation_bytes": int(getattr(worker, "peak_activation_memory", 0) or 0) or None,
        "torch_max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "torch_max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def accelerator_memory(llm: Any) -> dict[str, Any]:
    """What the engine on an accelerator says it holds, and what the device says the engine's processes use.

    Returns:
        ``{"peak_bytes", "source", "vllm": {...} | None, "nvml_bytes": int | None,
        "front_end_torch_max_allocated_bytes": int}``: ``peak_bytes`` is vLLM's total (weights + KV cache +
        peak activations) when reachable, else NVML's, else the front end's torch peak.
    """
    import os

    import torch

    out: dict[str, Any] = {"vllm": None, "nvml_bytes": None,
                           "front_end_torch_max_allocated_bytes": int(torch.cuda.max_memory_allocated())}
    if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1":
        try:
            out["vllm"] = llm.collective_rpc(_worker_memory)[0]
        except Exception as err:  # the account is optional; record why it is missing
            out["vllm_error"] = f"{type(err).__name__}: {err}"
    try:
        import psutil
        import pynvml

        pynvml.nvmlInit()
        pids = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
        used = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            used += sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids)
        out["nvml_bytes"] = used or None
    except Exception as err:  # pynvml absent (ROCm) or no permission
        out["nvml_error"] = f"{type(err).__name__}: {err}"
    acct = out["vllm"] or {}
    parts = [acct.get(k) for k in ("weights_bytes", "kv_cache_bytes", "peak_activation_bytes")]
    if all(parts):
        out.update(peak_bytes=sum(parts), source="vllm worker account (weights + KV cache + peak activations)")
    elif out["nvml_bytes"]:
        out.update(peak_bytes=out["nvml_bytes"], source="NVML device memory of the engine processes")
    else:
        out.update(peak_bytes=out["front_end_torch_max_allocated_bytes"], source="front end torch.cuda.max_memory_allocated")
    return out


def plan_estimate(model_path: str, dtype: str, max_model_len: int, engine: Any, enable_lora: bool) -> dict[str, Any]:
    """``make plan``'s memory estimate for the engine the pilot ran.

    Args:
        model_path: the model folder (its ``config.json`` gives the shape).
        dtype: the engine's compute dtype (``bfloat16``, ``float16`` or ``float32``).
        max_model_len: the engine's context length.
        engine: the engine section resolved for the device (:class:`classify.config.EngineSettings`).
        enable_lora: whether LoRA slots were reserved.

    Returns:
        ``{"bytes", "parts", "formula", "usable"}``: on CPU :func:`cpu_serving_estimate`'s ``needed``; on an
        accelerator the card share vLLM claims (``usable``), with the plan's worst-case ``needed`` in ``parts``.
    """
    import psutil

    shape = shape_from_folder(model_path)
    nbytes = DTYPE_BYTES[dtype]
    if engine.device == "cpu":
        est = cpu_serving_estimate(shape, nbytes, engine.kv_cache_space_gib, engine.max_loras, engine.max_lora_rank,
                                   enable_lora, psutil.virtual_memory().total)
        return {"bytes": est.needed, "parts": est.parts, "usable": est.usable,
                "formula": "weights + kv_cache_space_gib + LoRA slots + 3 processes x 1 GiB runtime"}
    import torch

    card = int(torch.cuda.get_device_properties(0).total_memory)
    est = serving_estimate(shape, nbytes, max_model_len, engine.max_num_seqs,
                           engine.max_loras if enable_lora else 0, engine.max_lora_rank, GPU_OVERHEAD_BYTES,
                           int(card * engine.gpu_memory_utilization))
    return {"bytes": est.usable, "parts": {**est.parts, "worst_case_needed": est.needed}, "usable": est.usable,
            "formula": "card x gpu_memory_utilization (vLLM fills the share with KV blocks)"}


def measured_block(device: str, peak_bytes: int, docs: int, tokens: int, seconds: float,
                   estimate: dict[str, Any] | None, machine_bytes: int, detail: dict[str, Any]) -> dict[str, Any]:
    """The ``measured`` block of ``summary.json``.

    Args:
        device: ``cpu``, ``cuda`` or ``rocm``.
        peak_bytes: the engine's measured peak memory.
        docs: documents through the classify stage.
        tokens: prompt tokens of those documents.
        seconds: the classify stage's wall time.
        estimate: :func:`plan_estimate`'s answer (``None`` when it could not be made).
        machine_bytes: the memory the engine may not exceed (host RAM on CPU, the card on an accelerator).
        detail: what was measured where (per process, vLLM's account...).

    Returns:
        ``{peak_rss_bytes, docs_per_s, tokens_per_s, plan_estimate_bytes, ratio, tolerance, gap,
        exceeds_machine, machine_bytes, device, classify_s, docs, tokens, estimate, detail}``.
    """
    est = estimate["bytes"] if estimate else None
    ratio = round(peak_bytes / est, 3) if est else None
    tolerance = TOLERANCE[device]
    return {
        "device": device,
        "peak_rss_bytes": int(peak_bytes),
        "peak_gib": round(peak_bytes / GIB, 3),
        "docs_per_s": round(docs / seconds, 3) if seconds > 0 else None,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "classify_s": round(seconds, 3),
        "docs": docs,
        "tokens": tokens,
        "plan_estimate_bytes": est,
        "plan_estimate_gib": round(est / GIB, 3) if est else None,
        "ratio": ratio,
        "tolerance": tolerance,
        "gap": ratio is not None and abs(ratio - 1) > tolerance,
        "machine_bytes": int(machine_bytes),
        "exceeds_machine": peak_bytes > machine_bytes,
        "estimate": estimate,
        "detail": detail,
    }


def measure_engine(engine: Any, model_cfg: Any, engine_cfg: Any, device: str, docs: int, tokens: int,
                   seconds: float) -> dict[str, Any]:
    """Measure the pilot's engine after its classify stage and put the plan's estimate beside it.

    Args:
        engine: the :class:`classify.engine.Classifier` that classified.
        model_cfg: the model section.
        engine_cfg: the engine section (``"auto"`` resolved here for ``device``).
        device: ``cpu``, ``cuda`` or ``rocm``.
        docs: documents through the classify stage.
        tokens: their prompt tokens.
        seconds: the stage's wall time.

    Returns:
        :func:`measured_block`'s dict. An estimate that cannot be made (a hub id without a local
        ``config.json``) is ``None`` with the reason in ``detail``; nothing here raises.
    """
    import psutil

    detail: dict[str, Any] = {}
    settings = engine_cfg.resolve(device)
    vc = getattr(getattr(engine.llm, "llm_engine", None), "vllm_config", None)
    dtype = str(getattr(getattr(vc, "model_config", None), "dtype", "")).removeprefix("torch.") or "float32"
    estimate = None
    try:
        estimate = plan_estimate(engine.model.path, dtype if dtype in DTYPE_BYTES else "float32",
                                 model_cfg.max_model_len, settings, engine.lora_enabled)
    except Exception as err:  # the measurement is a record, never a reason to fail the pilot
        detail["estimate_error"] = f"{type(err).__name__}: {err}"
    if device == "cpu":
        procs = engine_process_peaks()
        detail.update(source="sum of VmHWM over the pilot process and its VLLM:: processes", processes=procs)
        peak, machine = sum(procs.values()), psutil.virtual_memory().total
    else:
        acc = accelerator_memory(engine.llm)
        detail.update(acc)
        import torch

        peak, machine = int(acc["peak_bytes"]), int(torch.cuda.get_device_properties(0).total_memory)
    return measured_block(device, peak, docs, tokens, seconds, estimate, machine, detail)


def measure_pilot(engine: Classifier, cfg: PilotConfig, results: list[Any], seconds: float) -> dict[str, Any]:
    """The engine's peak memory and the classify stage's throughput beside make plan's estimate.

    See :mod:`batch._pilot_measure` for what is measured where; a failed measurement is recorded, never raised.
    """
    from classify.device import detect_device

    try:
        return measure_engine(engine, cfg.model, cfg.engine, detect_device(), len(results),
                              sum(r.n_tokens or 0 for r in results), seconds)
    except Exception as err:
        log.warning("pilot: could not measure the engine: %s: %s", type(err).__name__, err)
        return {"error": f"{type(err).__name__}: {err}"}
