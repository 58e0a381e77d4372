"""What the pilot measures of its engine (peak memory, throughput) beside its estimate (the doctor's on CPU, the card's on an accelerator).

Measured where (issue 10 item 8):

The engines run in the batch's Ray actors (the pilot is a 12-document batch), so what is measured is
the processes each actor reported when it started (:meth:`batch.pool.actor.EngineActor.info`: the actor
and its ``VLLM::`` engine processes), sampled after every shard while they still run:

* CPU: the peak resident set (``VmHWM`` of ``/proc/<pid>/status``, the kernel's high-water mark of
  RSS) of those processes, summed. Shared library pages count once per process, so the sum is an
  upper bound of the host RAM taken.
* CUDA / ROCm: the device memory NVML reports for those processes. Not exercised on hardware by the
  test suite (the test machine is a CPU).
* Throughput: documents, prompts (windows: ``classify.long_documents``) and prompt tokens of the classify
  stage over its wall time; ``windows_per_doc`` is what a batch of such documents costs in prompts.

The estimate is :mod:`classify.model.memory`'s for the same model and engine section:
:func:`~classify.model.memory.cpu_serving_estimate` on CPU; on an accelerator vLLM claims the whole
``gpu_memory_utilization`` share of the card (KV blocks fill what weights and activations leave), so
the plan's figure for what the engine occupies is ``usable`` = card x ``gpu_memory_utilization``.
"""

from __future__ import annotations

import logging
from typing import Any

from classify.engine.args import compute_dtype
from classify.machine.device import detect_device
from classify.machine.probe import probe
from classify.model.memory import DTYPE_BYTES, GIB, cpu_serving_estimate, serving_estimate
from classify.model.shape import shape_from_folder

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


def pool_peaks(procs: dict[int, str]) -> dict[str, int]:
    """Peak RSS of the engine actors' processes (the actor and its ``VLLM::`` engine processes), by ``"<pid> <title>"``.

    Args:
        procs: pid -> process title, as the actors reported them (:meth:`batch.pool.actor.EngineActor.info`).

    Returns:
        ``VmHWM`` of each process still readable.
    """
    peaks = {}
    for pid, title in procs.items():
        peak = vmhwm_bytes(pid)
        if peak is not None:
            peaks[f"{pid} {title}"] = peak
    return peaks


def process_titles(pids: list[int]) -> dict[int, str]:
    """pid -> the process title (vLLM names its processes ``VLLM::<name>``, Ray its workers ``ray::<name>``)."""
    import psutil

    out = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out[pid] = (" ".join(proc.cmdline()) or proc.name()).split()[0]
        except (psutil.Error, IndexError):
            continue
    return out


def nvml_bytes(pids: list[int]) -> int | None:
    """Device memory NVML reports for ``pids`` on the cards this process can use, or ``None`` (no NVML, no permission,
    none used)."""
    return nvml_usage(pids)[0]


def nvml_usage(pids: list[int]) -> tuple[int | None, str]:
    """The engines' device memory from NVML, and where the figure comes from.

    NVML lists each card's compute processes by PID. On a VM the PIDs are this machine's (seen on an H200,
    ``bench/results/2026-12-04-h200-gpu-path.md``), but inside a container they are the host's
    (NVIDIA/nvidia-docker #1483), so none match. Then the cards' used memory (``nvmlDeviceGetMemoryInfo``) is
    taken instead: a device total, every process on the cards included, and said so.

    NVML sees every card of the host whatever ``CUDA_VISIBLE_DEVICES`` says, so only the devices this process can
    use are read (:meth:`classify.machine.probe.Machine.visible`: by UUID, a MIG slice as itself); where
    ``nvidia-smi`` names none (no UUIDs), every card.

    Args:
        pids: the engine actors' processes (actor and ``VLLM::`` engine processes).

    Returns:
        ``(bytes or None, source)``; source ``"nvml processes"``, ``"nvml device used (no PID matched: container)"``
        or why there is no figure.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        by_pid = device_used = 0
        uuids = [g.uuid for g in probe().visible() if g.uuid]
        handles = ([pynvml.nvmlDeviceGetHandleByUUID(u.encode()) for u in uuids] if uuids else
                   [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())])
        for handle in handles:
            by_pid += sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids)
            device_used += int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception as err:  # pynvml absent (ROCm) or no permission
        return None, f"no NVML ({type(err).__name__})"
    if by_pid:
        return by_pid, "nvml processes"
    if device_used:
        return device_used, "nvml device used (no PID matched: container)"
    return None, "NVML reported no memory in use"


CPU_ESTIMATE_SOURCE = "make doctor's estimate for one engine on this machine's CPU"
"""Where the CPU figure comes from: the doctor's row, not ``make plan``, which sizes the configured lot's cards."""
CARD_ESTIMATE_SOURCE = "the estimate for this card (card x engine.gpu_memory_utilization, make plan's formula)"
"""Where the accelerator figure comes from: this card's memory, not necessarily the lot ``make plan`` sizes."""


def plan_estimate(model_path: str, dtype: str, *, max_model_len: int, engine: Any, enable_lora: bool) -> dict[str, Any]:
    """``make plan``'s memory estimate for the engine the pilot ran.

    Args:
        model_path: the model folder (its ``config.json`` gives the shape).
        dtype: the engine's compute dtype (``bfloat16``, ``float16`` or ``float32``).
        max_model_len: the engine's context length.
        engine: the engine section resolved for the device (:class:`classify.config.sections.EngineSettings`).
        enable_lora: whether LoRA slots were reserved.

    Returns:
        ``{"bytes", "parts", "formula", "usable"}``: on CPU :func:`cpu_serving_estimate`'s ``needed``; on an
        accelerator the card share vLLM claims (``usable``), with the plan's worst-case ``needed`` in ``parts``.
    """
    import psutil

    shape = shape_from_folder(model_path)
    nbytes = DTYPE_BYTES[dtype]
    if engine.device == "cpu":
        est = cpu_serving_estimate(shape, nbytes, kv_cache_space_gib=engine.kv_cache_space_gib,
                                   max_loras=engine.max_loras, max_lora_rank=engine.max_lora_rank,
                                   enable_lora=enable_lora, usable_bytes=psutil.virtual_memory().total)
        return {"bytes": est.needed, "parts": est.parts, "usable": est.usable, "source": CPU_ESTIMATE_SOURCE,
                "formula": "weights + kv_cache_space_gib + LoRA slots + 3 processes x 1 GiB runtime"}
    import torch

    card = int(torch.cuda.get_device_properties(0).total_memory)
    est = serving_estimate(shape, nbytes, max_model_len=max_model_len, max_num_seqs=engine.max_num_seqs,
                           max_loras=engine.max_loras if enable_lora else 0, max_lora_rank=engine.max_lora_rank,
                           overhead_bytes=GPU_OVERHEAD_BYTES, usable_bytes=int(card * engine.gpu_memory_utilization))
    return {"bytes": est.usable, "parts": {**est.parts, "worst_case_needed": est.needed}, "usable": est.usable,
            "source": CARD_ESTIMATE_SOURCE, "formula": "card x gpu_memory_utilization (vLLM fills the share with KV blocks)"}


def measured_block(device: str, peak_bytes: int, *, docs: int, tokens: int, seconds: float,
                   estimate: dict[str, Any] | None, machine_bytes: int, detail: dict[str, Any],
                   windows: int | None = None) -> dict[str, Any]:
    """The ``measured`` block of ``summary.json``.

    Args:
        device: ``cpu``, ``cuda`` or ``rocm``.
        peak_bytes: the engine's measured peak memory.
        docs: documents through the classify stage.
        tokens: prompt tokens of those documents (every window's prompt).
        seconds: the classify stage's wall time.
        estimate: :func:`plan_estimate`'s answer (``None`` when it could not be made).
        machine_bytes: the memory the engine may not exceed (host RAM on CPU, the card on an accelerator).
        detail: what was measured where (per process, vLLM's account...).
        windows: prompts of those documents (their ``n_windows`` summed; ``None``: one per document).

    Returns:
        ``{estimate_source, peak_rss_bytes, docs_per_s, tokens_per_s, windows, windows_per_doc, prompts_per_s,
        plan_estimate_bytes (the figure of ``estimate_source``; the key keeps its first name), ratio, tolerance, gap,
        exceeds_machine, machine_bytes, device, classify_s, docs, tokens, estimate, detail}``.
    """
    est = estimate["bytes"] if estimate else None
    ratio = round(peak_bytes / est, 3) if est else None
    tolerance = TOLERANCE[device]
    return {
        "device": device,
        "estimate_source": (estimate or {}).get("source") or (CPU_ESTIMATE_SOURCE if device == "cpu" else CARD_ESTIMATE_SOURCE),
        "peak_rss_bytes": int(peak_bytes),
        "peak_gib": round(peak_bytes / GIB, 3),
        "docs_per_s": round(docs / seconds, 3) if seconds > 0 else None,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "classify_s": round(seconds, 3),
        "docs": docs,
        "tokens": tokens,
        "windows": windows if windows is not None else docs,
        "windows_per_doc": round((windows if windows is not None else docs) / docs, 3) if docs else None,
        "prompts_per_s": round((windows if windows is not None else docs) / seconds, 3) if seconds > 0 else None,
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


def measure_pool(peaks: dict[str, int], gpu_bytes: int | None, *, model_path: str, model_cfg: Any, engine_cfg: Any,
                 enable_lora: bool, docs: int, tokens: int, seconds: float,
                 gpu_source: str = "nvml processes", windows: int | None = None) -> dict[str, Any]:
    """What the pilot's engine actors used, beside the estimate for the same engine (``estimate_source``).

    Args:
        peaks: :func:`pool_peaks` of the actors' processes, sampled while they ran.
        gpu_bytes: :func:`nvml_bytes` of those processes on an accelerator (``None`` on CPU).
        model_path: the folder the engines loaded (the merged model in merged mode).
        model_cfg: the model section (dtype, ``max_model_len``).
        engine_cfg: the engine section (``"auto"`` resolved here for the device).
        enable_lora: whether the engines reserved LoRA slots.
        docs: documents through the classify stage.
        tokens: their prompt tokens.
        seconds: the classify stage's wall time (first engine ready to last shard written).
        gpu_source: where ``gpu_bytes`` comes from (:func:`nvml_usage`).
        windows: the documents' prompts (``n_windows`` summed), or ``None`` for one per document.

    Returns:
        :func:`measured_block`'s dict, or ``{"error": ...}`` when there was nothing to measure (a stand-in
        engine without processes); nothing here raises.
    """
    try:
        import psutil

        device = detect_device()
        if device == "cpu" and not peaks:
            return {"error": "no engine process to measure (the actors reported none)"}
        detail: dict[str, Any] = {}
        estimate = None
        try:
            estimate = plan_estimate(model_path, compute_dtype(model_cfg), max_model_len=model_cfg.max_model_len,
                                     engine=engine_cfg.resolve(device), enable_lora=enable_lora)
        except Exception as err:  # the measurement is a record, never a reason to fail the pilot
            detail["estimate_error"] = f"{type(err).__name__}: {err}"
        if device == "cpu":
            detail.update(source="sum of VmHWM over the engine actors' processes (actor and VLLM:: processes)",
                          processes=peaks)
            peak, machine = sum(peaks.values()), psutil.virtual_memory().total
        else:
            if not gpu_bytes:
                return {"error": "NVML reported no device memory for the engine actors' processes"}
            import torch

            detail.update(source=("NVML device memory of the engine actors' processes" if gpu_source == "nvml processes"
                                  else f"NVML: {gpu_source}"), processes=peaks)
            peak, machine = gpu_bytes, int(torch.cuda.get_device_properties(0).total_memory)
        return measured_block(device, peak, docs=docs, tokens=tokens, seconds=seconds, estimate=estimate,
                              machine_bytes=machine, detail=detail, windows=windows)
    except Exception as err:
        log.warning("pilot: could not measure the engines: %s: %s", type(err).__name__, err)
        return {"error": f"{type(err).__name__}: {err}"}
