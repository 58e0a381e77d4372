"""The ``engine`` section: vLLM engine sizing, one section for every device (``"auto"`` fields chosen per device).

Shared by pilot, batch, training (validation through the engine) and serve; re-exported by
:mod:`classify.config.sections`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from classify.config.base import Frozen
from classify.errors import ConfigError

Device = Literal["cpu", "cuda", "rocm"]
"""Where the engine runs: vLLM's CPU backend, or an NVIDIA (CUDA) / AMD (ROCm) accelerator."""

DEVICES: tuple[str, ...] = ("cpu", "cuda", "rocm")

ENGINE_AUTO: dict[str, dict[str, Any]] = {
    "cpu": {"enforce_eager": True, "max_num_seqs": 64, "max_num_batched_tokens": None},
    "cuda": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384},
    "rocm": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384},
}
"""What each ``"auto"`` engine field becomes on each device (see :meth:`EngineConfig.resolve`).

CPU: the values this 2-core CPU was tuned with (eager mode: torch.compile's start costs more than it
saves on a short run, except in a batch long enough per engine, :meth:`EngineConfig.for_workload`; 64 sequences; ``None`` leaves the step's token budget to vLLM, 4096 for the
offline ``LLM`` on CPU). Accelerators, vLLM's throughput settings (``vllm/engine/arg_utils.py``,
``EngineArgs.get_batch_defaults``; ``vllm/config/model.py`` ``enforce_eager``): CUDA graphs on
(``enforce_eager=False``, vLLM's own default), 256 sequences (vLLM's offline default on cards
under 70 GiB, its server default everywhere) and 16384 batched tokens (vLLM's offline default on
H100/H200/B200-class cards): with ~350-token classification prompts one step prefills ~45 of them.
Set explicitly so that the offline ``LLM`` (pilot, batch) and the server's ``AsyncLLM`` (whose
engine context would otherwise fall back to 128 sequences and 2048 tokens) run alike.
"""


TENSOR_PARALLEL_SIZES: tuple[int, ...] = (1, 2, 4, 8)
"""The tensor-parallel sizes an engine may take: GPUs of one node that hold one model copy together."""


def _tensor_parallel(value: Any) -> Any:
    """``engine.tensor_parallel_size``: one of :data:`TENSOR_PARALLEL_SIZES` or ``"auto"``."""
    if value == "auto" or (type(value) is int and value in TENSOR_PARALLEL_SIZES):
        return value
    raise ValueError(f"must be 1, 2, 4, 8 or 'auto', got {value!r}")


COMPILE_MIN_DOCS_PER_ENGINE = 2000
"""Documents one CPU engine must have ahead of it before ``enforce_eager: "auto"`` turns torch.compile on.

vLLM's CPU backend runs RMSNorm, SiLU-and-mul and the residual adds as separate eager torch ops with
float32 copies between them (``forward_native``; ``SiluAndMul.forward_cpu`` on x86), which its
torch.compile (inductor) graph fuses: "torch.compile is enabled by default and is a critical part of
the framework" (vLLM docs, design/torch_compile). Measured on a 2-core AVX512-BF16/AMX Xeon, one engine
on one core, merged SmolLM2-135M, news articles of ~312 prompt tokens (the demo set): eager 3.5 docs/s, compiled 4.9-6.3
docs/s, for ~90-130 s more engine start (the compile). The start pays back after ~1,000 documents;
2,000 keeps a margin for slower compiles. The pilot (12 documents), the tests' small batches and the
server stay eager under ``"auto"``; set ``enforce_eager: false`` for a long-running CPU server.
"""


def _auto_or(kind: type, lo: int | None = None, hi: int | None = None, none_ok: bool = False):
    """A before-validator accepting ``"auto"`` or a ``kind`` value in ``[lo, hi]`` (one error line, no union noise)."""
    allowed = f"'auto', {'null, ' if none_ok else ''}" + ("true or false" if kind is bool else f"an integer from {lo} to {hi}")

    def check(value: Any) -> Any:
        if value == "auto" or (value is None and none_ok):
            return value
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise ValueError(f"must be {allowed}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be {allowed}")
        if value < lo:
            raise ValueError(f"must be greater than or equal to {lo}")
        if value > hi:
            raise ValueError(f"must be less than or equal to {hi}")
        return value

    return BeforeValidator(check)


class EngineSettings(Frozen):
    """The engine section resolved for one device: no ``"auto"`` left (see :meth:`EngineConfig.resolve`).

    Attributes:
        device: ``cpu``, ``cuda`` or ``rocm``.
        enforce_eager: vLLM ``enforce_eager``.
        max_num_seqs: vLLM ``max_num_seqs``.
        max_num_batched_tokens: vLLM ``max_num_batched_tokens`` (``None``: vLLM's own default).
        gpu_memory_utilization: accelerators only (``None`` on CPU).
        kv_cache_space_gib: CPU only (``None`` on accelerators).
        max_loras: vLLM ``max_loras``.
        max_lora_rank: vLLM ``max_lora_rank``.
        seed: engine seed.
        tensor_parallel_size: GPUs one engine spans (vLLM ``tensor_parallel_size``); 1 on CPU.
    """

    device: Device
    enforce_eager: bool
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float | None
    kv_cache_space_gib: int | None
    max_loras: int
    max_lora_rank: int
    seed: int
    tensor_parallel_size: int = 1

    def parallel_kwargs(self) -> dict[str, Any]:
        """vLLM's parallel arguments for this engine: ``{}`` for one card (vLLM's ``uni`` executor in this process),
        else ``tensor_parallel_size`` and the ``mp`` executor: one worker process per card, all inside this
        process's node and its ``CUDA_VISIBLE_DEVICES`` (a Ray actor holding the TP group's GPUs), as Ray Data
        LLM's TP replicas do with ``mp`` inside one placement bundle set.

        Example:
            >>> EngineConfig(tensor_parallel_size=2).resolve("cuda").parallel_kwargs()
            {'tensor_parallel_size': 2, 'distributed_executor_backend': 'mp'}
        """
        if self.tensor_parallel_size == 1:
            return {}
        return {"tensor_parallel_size": self.tensor_parallel_size, "distributed_executor_backend": "mp"}


class EngineConfig(Frozen):
    """vLLM engine sizing, one file for every device: ``"auto"`` fields are chosen by the device the engine runs on.

    CPU fields apply on CPU machines, GPU fields on accelerators; a value the user sets is used as
    given on every device. :meth:`resolve` turns the section into concrete settings
    (:data:`ENGINE_AUTO` lists what ``"auto"`` becomes and why).

    Attributes:
        kv_cache_space_gib: CPU only: host RAM in whole GiB vLLM reserves for the KV cache
            (exported as ``VLLM_CPU_KVCACHE_SPACE``, which takes whole GiB).
        gpu_memory_utilization: GPU only: share (0-1] of the card's memory vLLM may take for weights,
            activations, CUDA graphs and KV cache. vLLM's own default is 0.92
            (``vllm/config/cache.py``); docpilot keeps 0.85, the figure ``make plan`` sizes with.
        max_num_seqs: most sequences the scheduler runs at once, or ``"auto"`` (CPU 64, GPU 256).
        max_num_batched_tokens: most tokens one scheduler step processes, ``"auto"`` (CPU: vLLM's
            default, GPU 16384) or ``null`` (vLLM's default on every device).
        max_loras: LoRA adapters held in one batch at once (vLLM ``max_loras``).
        max_lora_rank: largest adapter rank the engine accepts (vLLM ``max_lora_rank``).
        enforce_eager: skip CUDA-graph / torch.compile capture (faster start, slower steps), or
            ``"auto"`` (false on accelerators; on CPU true, except a batch whose engines each have
            :data:`COMPILE_MIN_DOCS_PER_ENGINE` documents or more: :meth:`for_workload`).
        seed: engine sampling seed.
        tensor_parallel_size: GPUs of one node that hold one model copy together (1, 2, 4, 8), or
            ``"auto"``: the smallest that fits one sequence of ``max_model_len`` by the plan's formula
            (:func:`classify.model.memory.choose_tensor_parallel`, resolved by the batch driver and the plan
            before the engines start). The batch starts ``GPUs // tp`` engine actors per node, each
            holding ``tp`` GPUs of one node. CPU engines always run with 1 (a set value is warned about).
    """

    kv_cache_space_gib: int = Field(1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_num_seqs: Annotated[int | Literal["auto"], _auto_or(int, 1, 4096)] = "auto"
    max_num_batched_tokens: Annotated[int | Literal["auto"] | None, _auto_or(int, 1, 1 << 20, none_ok=True)] = "auto"
    max_loras: int = Field(2, ge=1, le=64)
    max_lora_rank: int = Field(16, ge=1, le=512)
    enforce_eager: Annotated[bool | Literal["auto"], _auto_or(bool)] = "auto"
    seed: int = 0
    tensor_parallel_size: Annotated[int | Literal["auto"], BeforeValidator(_tensor_parallel)] = 1

    def for_workload(self, docs_per_engine: int) -> EngineConfig:
        """This section with ``enforce_eager: "auto"`` made ``false`` (torch.compile) for long runs.

        On accelerators ``"auto"`` already means ``false``; on CPU it means eager unless each engine
        has at least :data:`COMPILE_MIN_DOCS_PER_ENGINE` documents ahead of it, where the compile's
        start cost is paid back. A value the user set is kept.

        Args:
            docs_per_engine: documents each engine will classify in this run (a batch attempt's
                remaining documents over its engine actors, rounded up).

        Returns:
            ``self``, or a copy with ``enforce_eager=False``.

        Example:
            >>> EngineConfig().for_workload(5000).enforce_eager
            False
            >>> EngineConfig().for_workload(100).enforce_eager
            'auto'
        """
        if self.enforce_eager != "auto" or docs_per_engine < COMPILE_MIN_DOCS_PER_ENGINE:
            return self
        return self.model_copy(update={"enforce_eager": False})

    def resolve(self, device: str) -> EngineSettings:
        """Replace every ``"auto"`` by :data:`ENGINE_AUTO`'s value for ``device``; values the user set stay.

        ``tensor_parallel_size`` is 1 on CPU; ``"auto"`` left here (not resolved by the batch driver or
        the plan, which know the model and the card) is 1.

        Args:
            device: ``cpu``, ``cuda`` or ``rocm`` (``classify.machine.device.detect_device`` finds this machine's).

        Returns:
            The concrete :class:`EngineSettings`.

        Raises:
            ConfigError: an unknown device.

        Example:
            >>> EngineConfig().resolve("cuda").max_num_seqs
            256
            >>> EngineConfig(max_num_seqs=32).resolve("cuda").max_num_seqs
            32
        """
        if device not in ENGINE_AUTO:
            raise ConfigError(f"`device` must be one of {list(DEVICES)}, got {device!r}")
        auto = ENGINE_AUTO[device]
        pick = {k: auto[k] if getattr(self, k) == "auto" else getattr(self, k) for k in auto}
        cpu = device == "cpu"
        tp = 1 if cpu or self.tensor_parallel_size == "auto" else self.tensor_parallel_size
        return EngineSettings(
            device=device, **pick,
            gpu_memory_utilization=None if cpu else self.gpu_memory_utilization,
            kv_cache_space_gib=self.kv_cache_space_gib if cpu else None,
            max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, seed=self.seed, tensor_parallel_size=tp,
        )
