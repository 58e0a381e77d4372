"""The device this process computes on and the dtype it computes in: torch's view of this machine.

The machine probe (:mod:`classify.machine.probe`) asks the system before any venv exists; these functions ask
torch (imported on first use) and serve every room above: the engine's arguments (:mod:`classify.engine.args`),
the training section, the batch and the server.
"""

from __future__ import annotations


def detect_device() -> str:
    """The device this machine's engine runs on: ``cuda``, ``rocm`` (torch's HIP build) or ``cpu``.

    Returns:
        ``"cuda"`` or ``"rocm"`` when torch sees an accelerator (``torch.version.hip`` tells ROCm
        apart), else ``"cpu"`` (vLLM's CPU backend).
    """
    if not on_accelerator():
        return "cpu"
    import torch

    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def on_accelerator() -> bool:
    """Whether a CUDA/ROCm device is visible to torch (else vLLM runs its CPU backend)."""
    import torch

    return bool(torch.cuda.is_available())


def card_has_bf16() -> bool:
    """Whether the first visible card computes bf16 natively (CUDA compute capability 8.0+, any ROCm card torch sees)."""
    import torch

    if not torch.cuda.is_available():
        return False
    if getattr(torch.version, "hip", None):
        return True
    return torch.cuda.get_device_capability(0)[0] >= 8


def cpu_has_native_bf16() -> bool:
    """Whether this x86 CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16 in ``/proc/cpuinfo``).

    Without them torch falls back to a slow reference kernel: measured here on an AVX2-only
    AMD EPYC, a 2048 x 2048 bf16 matmul ran at ~1 GFLOP/s against ~150 GFLOP/s in float32.
    """
    try:
        flags = open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def auto_dtype(device: str | None = None) -> str:
    """What ``dtype: auto`` means for the engine, decided for the device that computes.

    Args:
        device: ``cpu``, ``cuda`` or ``rocm`` to decide for (:func:`classify.engine.args.engine_kwargs` for a named device);
            ``None``: where this run computes (:func:`detect_device`).

    Returns:
        ``"bfloat16"`` on a card with native bf16 (compute capability 8.0+: A100, L4, H100, B200) or a CPU with
        native bf16 (:func:`cpu_has_native_bf16`); ``"float16"`` on an older card (T4: vLLM serves it in fp16);
        else ``"float32"``. The CPU's flags never decide for a card, nor a visible card for a CPU run.
    """
    device = device or detect_device()
    if device == "cpu":
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    return "bfloat16" if not on_accelerator() or card_has_bf16() else "float16"


def torch_device(device: str | None = None) -> str:
    """The torch device string a run computes on: ``"cuda"`` for CUDA and ROCm (torch's HIP build uses the cuda
    namespace), else ``"cpu"``.

    Args:
        device: ``cpu``, ``cuda`` or ``rocm``; ``None``: :func:`detect_device`.
    """
    return "cpu" if (device or detect_device()) == "cpu" else "cuda"


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile (inductor) would use for CPU kernels, or ``None`` when none runs.

    vLLM's CPU backend compiles its model graph with inductor when ``enforce_eager`` is false, and
    inductor builds C++ kernels with ``$CXX`` (default ``g++``; ``torch/_inductor/config.py``,
    ``cpp.cxx``): without one the engine start fails inside vLLM. The search is torch's own
    (``torch._inductor.cpp_builder.get_cpp_compiler``: runs ``<cxx> --version``).

    Returns:
        The compiler command (e.g. ``"g++"``), or ``None``.
    """
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # torch raises InvalidCxxCompiler; an older or trimmed torch may lack the module
        return None
