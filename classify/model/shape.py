"""The shape of a decoder-only model and its LoRA parameter count: one source for planning and training.

The lot plan (``batch/plan/plan.py``, memory per card) and training (``adapters/train/train.py``, the disk
check) both count LoRA parameters here, from the model's ``config.json``. The formulas assume the
Llama layout (rotary attention with grouped KV heads, gated SiLU MLP, RMSNorm, no linear biases
unless ``attention_bias``), which covers SmolLM2, Llama 2/3, Mistral and Qwen2/3. Query and output
projections are ``heads x head_dim`` wide, which differs from ``hidden_size`` when ``config.json``
sets ``head_dim`` explicitly (Qwen3, Gemma); key/value projections are ``kv_heads x head_dim``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classify.config.training import LINEAR_MODULES
from classify.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only model that memory depends on (from its ``config.json``).

    Attributes:
        name: where the shape came from (a built-in name or a folder).
        num_layers: ``num_hidden_layers``.
        hidden_size: ``hidden_size``.
        num_heads: ``num_attention_heads``.
        num_kv_heads: ``num_key_value_heads`` (grouped-query attention; = heads when absent).
        head_dim: ``head_dim`` (= hidden_size / heads when absent).
        intermediate_size: MLP width.
        vocab_size: vocabulary size.
        tie_word_embeddings: the output head shares the embedding matrix.
        attention_bias: q/k/v projections carry biases (Qwen2).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """``(in_features, out_features)`` of each linear layer in one block."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.intermediate_size
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    def num_parameters(self) -> int:
        """Parameter count: embeddings (+ untied head) + layers x (linears + 2 norms) + final norm."""
        per_layer = sum(a * b for a, b in self.linear_dims().values()) + 2 * self.hidden_size
        if self.attention_bias:
            per_layer += (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.vocab_size * self.hidden_size + head + self.num_layers * per_layer + self.hidden_size


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """Build a :class:`ModelShape` from a Hugging Face ``config.json`` dict.

    Args:
        config: the parsed ``config.json``.
        name: label for messages and the plan.

    Returns:
        The shape.

    Raises:
        ConfigError: a field the estimate needs is missing.
    """
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in config]
    if missing:
        raise ConfigError(f"{name}: config.json lacks {missing}; the plan needs a decoder-only (Llama-style) config")
    heads = int(config["num_attention_heads"])
    return ModelShape(
        name=name,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
    )


def shape_from_folder(folder: str | Path) -> ModelShape:
    """Read a model folder's ``config.json`` into a :class:`ModelShape`.

    Raises:
        ConfigError: no readable ``config.json`` in ``folder``.
    """
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read the model shape from {path}: {err}") from None
    return shape_from_config(config, str(folder))


def lora_parameter_count(shape: ModelShape, targets: tuple[str, ...], rank: int = 1, layers: int | None = None) -> int:
    """LoRA parameters: ``rank x layers x sum over targets of (in + out)``.

    Source: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", section 4: a
    target ``W (out x in)`` gets ``A (r x in)`` and ``B (out x r)``, i.e. ``r x (in + out)`` parameters.

    Args:
        shape: the model shape.
        targets: adapted linear layers (names in :data:`LINEAR_MODULES`).
        rank: LoRA rank r (1 gives the count per unit of rank).
        layers: adapted blocks (``None``: all ``shape.num_layers``).

    Returns:
        The parameter count.

    Raises:
        ConfigError: a target is not a linear layer of the block.
    """
    dims = shape.linear_dims()
    unknown = [t for t in targets if t not in dims]
    if unknown:
        raise ConfigError(f"LoRA targets {unknown} are not linear layers of a Llama block; use some of {list(LINEAR_MODULES)}")
    n_layers = shape.num_layers if layers is None else layers
    return rank * n_layers * sum(dims[t][0] + dims[t][1] for t in targets)
