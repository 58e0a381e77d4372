"""Can the engine apply this adapter? vLLM's LoRA rules, checked before vLLM ever sees the adapter.

vLLM validates an adapter only when a request first uses it, inside the engine process
(``vllm/lora/worker_manager.py`` ``WorkerLoRAManager._load_adapter``); a refusal there kills the
engine for every client. :func:`check_engine_compat` applies the same rules, and the features
vLLM's ``PEFTHelper`` silently ignores, from ``adapter_config.json``, the safetensors header of
``adapter_model.safetensors`` and the base model's own safetensors headers, without torch.

Every field peft 0.21 and 0.22's ``LoraConfig`` writes is in :data:`CONFIG_RULES`: allowed (vLLM applies it,
or it has no effect on inference) or refused (vLLM does not apply it). A field docpilot does not know
(a newer peft's) is accepted while its value is empty (``null``, ``false``, ``{}``, ``[]``, ``""``: peft's
default for an optional feature) and refused when it is set, since vLLM would ignore it (docs/registry.md).

Example:
    >>> check_engine_compat("runs/x/adapter", cfg.engine, model.path)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from classify.config.training import LINEAR_MODULES
from classify.errors import AdapterIncompatible

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"

LLAMA_LORA_MODULES = (*LINEAR_MODULES, "embed_tokens", "lm_head")
"""Modules vLLM applies LoRA to in a Llama-family model: every ``LinearBase`` (the packed ``qkv_proj`` and
``gate_up_proj`` unpacked by ``LlamaForCausalLM.packed_modules_mapping``) plus its ``embedding_modules``
(``vllm/model_executor/models/llama.py``, ``vllm/lora/utils.py`` ``get_supported_lora_modules``,
``vllm/lora/worker_manager.py`` ``expected_lora_modules``)."""

LORA_MODULES = {arch: LLAMA_LORA_MODULES for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")}
"""Architecture -> modules vLLM applies LoRA to; other architectures: any 2-D weight of the base model."""

SUPPORTED_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")
"""String ``init_lora_weights`` values vLLM loads (``PEFTHelper._init_is_supported``, an allow-list: they only set
the initial adapter weights); any other string (PiSSA, OLoRA, CorDA, LoftQ, Astra, NoRA, a future one) is refused.
Booleans are always allowed."""

ALLOWED = "allowed"
CONFIG_RULES: dict[str, str] = {
    # applied by vLLM (vllm/lora/peft_helper.py PEFTHelper fields)
    "r": "checked against engine.max_lora_rank (PEFTHelper.validate_legal)",
    "lora_alpha": ALLOWED, "alpha_pattern": ALLOWED, "use_rslora": ALLOWED,
    "rank_pattern": "each rank checked against engine.max_lora_rank (PEFTHelper.validate_legal)",
    "target_modules": "list entries must be modules vLLM applies LoRA to (LORA_MODULES)",
    # choose which modules get LoRA; vLLM reads the modules from the weights file (LoRAModel.from_local_checkpoint)
    "exclude_modules": ALLOWED, "layers_to_transform": ALLOWED, "layers_pattern": ALLOWED,
    # training-time only: no effect on the saved A/B matrices or on inference
    "lora_dropout": ALLOWED, "inference_mode": ALLOWED, "task_type": ALLOWED, "peft_type": "must be LORA",
    "peft_version": ALLOWED, "base_model_name_or_path": ALLOWED, "revision": ALLOWED, "auto_mapping": ALLOWED,
    "megatron_config": ALLOWED, "megatron_core": ALLOWED, "runtime_config": ALLOWED, "velora_config": ALLOWED,
    "loftq_config": ALLOWED, "eva_config": ALLOWED, "corda_config": ALLOWED, "lora_ga_config": ALLOWED,
    "astra_config": ALLOWED,  # peft 0.22; Astra itself is refused through init_lora_weights="astra"
    "qalora_group_size": ALLOWED, "ensure_weight_tying": ALLOWED,
    "init_lora_weights": "refused unless a boolean or one of SUPPORTED_INITS (PEFTHelper._init_is_supported)",
    # refused: vLLM does not apply them (PEFTHelper._validate_features / validate_legal, or ignored)
    "bias": "must be none (PEFTHelper.validate_legal)",
    "lora_bias": "refused (PEFTHelper._validate_features)",
    "use_dora": "refused (PEFTHelper._validate_features)",
    "modules_to_save": "refused (PEFTHelper._validate_features; LoRAModelManager.supported_modules_to_save)",
    "alora_invocation_tokens": "refused (PEFTHelper._validate_features)",
    "layer_replication": "refused (PEFTHelper._validate_features)",
    "use_bdlora": "refused (PEFTHelper._validate_features)",
    "use_qalora": "refused (PEFTHelper._validate_features)",
    "trainable_token_indices": "refused (utils.parse_fine_tuned_lora_name has no trainable_tokens_delta)",
    "target_parameters": "refused (vLLM reads parameter LoRA only for fused MoE experts)",
    "fan_in_fan_out": "refused when true (vLLM reads lora_A as [r, in], lora_B as [out, r])",
    "kasa_config": "refused (lora_diag is not read by vLLM)",
    "monteclora_config": "refused (variational sampling is not applied by vLLM)",
    "arrow_config": "refused (routing across adapters is not applied by vLLM)",
}
"""Every ``adapter_config.json`` field peft's ``LoraConfig`` writes, with what docpilot does with it."""

_REFUSED_WHEN_SET = {
    "lora_bias": "vLLM does not apply LoRA bias terms",
    "use_dora": "vLLM does not apply DoRA (the magnitude vector is ignored)",
    "alora_invocation_tokens": "vLLM does not apply Activated LoRA (aLoRA)",
    "layer_replication": "vLLM does not replicate layers",
    "use_bdlora": "vLLM does not apply block-diagonal LoRA (BD-LoRA)",
    "use_qalora": "vLLM does not apply QALoRA",
    "trainable_token_indices": "vLLM does not load trainable-token deltas",
    "target_parameters": "vLLM applies parameter LoRA only to fused MoE experts, this base model has none",
    "fan_in_fan_out": "vLLM expects nn.Linear layout (lora_A [r, in], lora_B [out, r])",
    "kasa_config": "vLLM does not apply KaSA (lora_diag)",
    "monteclora_config": "vLLM does not apply MonteCLoRA sampling",
    "arrow_config": "vLLM does not apply Arrow routing",
}
_RETRAIN = "retrain without it"


def check_engine_compat(adapter_dir: Path | str, engine_cfg: Any, base_model_path: Path | str | None = None,
                        label: str | None = None) -> None:
    """Refuse an adapter the engine's LoRA support cannot apply, before any engine loads it.

    Args:
        adapter_dir: folder with peft's ``adapter_config.json`` and ``adapter_model.safetensors``.
        engine_cfg: the engine section (:class:`classify.config.sections.EngineConfig`, or a dict) whose
            ``max_lora_rank`` bounds every rank.
        base_model_path: the base model folder (``ModelRef.path``); its ``config.json`` and safetensors
            headers give the architecture, module names and shapes. ``None`` skips the base-model
            checks (at publish time without a model); the config and weight-name checks still run.
        label: how the adapter is named in the message (default the folder).

    Raises:
        AdapterIncompatible: one message naming every problem: the field or tensor, its value,
            the engine setting it breaks and what to do.
    """
    problems = compat_problems(adapter_dir, engine_cfg, base_model_path)
    if problems:
        raise AdapterIncompatible(
            f"adapter {label or adapter_dir} cannot be applied by the engine (vLLM LoRA) and was not loaded: "
            + "; ".join(problems)
        )


def compat_problems(adapter_dir: Path | str, engine_cfg: Any, base_model_path: Path | str | None = None) -> list[str]:
    """Every reason the engine cannot apply an adapter (see :func:`check_engine_compat`).

    Returns:
        Problems, one sentence each; empty when the engine can apply the adapter.
    """
    folder = Path(adapter_dir)
    max_rank = int(engine_cfg["max_lora_rank"] if isinstance(engine_cfg, dict) else engine_cfg.max_lora_rank)
    try:
        config = json.loads((folder / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [f"{ADAPTER_CONFIG_FILE} is unreadable ({err}); save the adapter with peft's save_pretrained"]
    if not isinstance(config, dict):
        return [f"{ADAPTER_CONFIG_FILE} must hold a JSON object, got {type(config).__name__}"]
    base = _base_modules(Path(base_model_path)) if base_model_path else None
    supported = LORA_MODULES.get(base[0], None) if base else LLAMA_LORA_MODULES
    problems = _config_problems(config, max_rank, supported)
    try:
        tensors = _safetensors_header(folder / ADAPTER_WEIGHTS_FILE)
    except (OSError, ValueError) as err:
        return [*problems, f"{ADAPTER_WEIGHTS_FILE} is unreadable ({err}); vLLM loads LoRA weights from it"]
    return problems + _weight_problems(config, tensors, max_rank, supported, base[1] if base else None)


def _config_problems(config: dict[str, Any], max_rank: int, supported: tuple[str, ...] | None) -> list[str]:
    out = []
    if config.get("peft_type", "LORA") != "LORA":
        out.append(f"`peft_type` must be LORA (vLLM loads LoRA adapters only), got {config.get('peft_type')!r}")
    for key in ("r", "lora_alpha", "target_modules"):  # PEFTHelper.from_dict required fields
        if key not in config:
            out.append(f"`{key}` is missing from {ADAPTER_CONFIG_FILE} (vLLM's PEFTHelper requires it)")
    r = config.get("r")
    if "r" in config and (not isinstance(r, int) or r < 1):
        out.append(f"`r` must be a positive integer, got {r!r}")
    elif isinstance(r, int) and r > max_rank:
        out.append(f"`r` is {r}, over engine.max_lora_rank {max_rank}; raise `engine.max_lora_rank` or retrain")
    for key, rank in (config.get("rank_pattern") or {}).items():
        if not isinstance(rank, int) or rank < 1:
            out.append(f"`rank_pattern` gives `{key}` r={rank!r}; ranks must be positive integers")
        elif rank > max_rank:
            out.append(f"`rank_pattern` raises `{key}` to r={rank}, over engine.max_lora_rank {max_rank}; "
                       "raise `engine.max_lora_rank` or retrain")
    if config.get("bias", "none") != "none":
        out.append(f"`bias` is {config['bias']!r}; vLLM applies no adapter bias (allowed: 'none'); {_RETRAIN}")
    saved = config.get("modules_to_save")
    if saved:
        out.append(f"`modules_to_save` is {saved!r}: vLLM does not load fully trained modules for a generation "
                   "model, the engine would run the base model's; retrain with modules_to_save=None")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in SUPPORTED_INITS:
        out.append(f"`init_lora_weights` is {init!r}: vLLM loads only {list(SUPPORTED_INITS)} or a boolean (PiSSA, "
                   "OLoRA, CorDA, LoftQ, Astra change the base weights, which vLLM does not); convert it with peft's "
                   "path_initial_model_for_weight_conversion or retrain")
    for key, why in _REFUSED_WHEN_SET.items():
        if config.get(key):
            out.append(f"`{key}` is {config[key]!r}: {why}; {_RETRAIN}")
    targets = config.get("target_modules")
    if supported is not None and isinstance(targets, list):
        bad = [t for t in targets if str(t).rsplit(".", 1)[-1] not in supported]
        if bad:
            out.append(f"`target_modules` {bad} are not modules vLLM applies LoRA to (allowed: {list(supported)})")
    unknown = sorted(k for k, v in config.items() if k not in CONFIG_RULES and v not in (None, False, {}, [], ""))
    if unknown:
        out.append(f"{ADAPTER_CONFIG_FILE} sets fields docpilot does not know {unknown}; vLLM would ignore them")
    return out


def _rank_for(config: dict[str, Any], module: str) -> int | None:
    """The rank peft gives ``module`` (``PEFTHelper._match_pattern``: suffix at a '.' boundary, first wins)."""
    for key, rank in (config.get("rank_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return rank if isinstance(rank, int) else None
    return config.get("r") if isinstance(config.get("r"), int) else None


def _parse_lora_name(name: str) -> tuple[str, str] | None:
    """``(module, kind)`` the way ``vllm/lora/utils.py`` ``parse_fine_tuned_lora_name`` reads a tensor name."""
    short = name.removeprefix("base_model.model.")
    for suffix, kind in ((".lora_A.weight", "A"), (".lora_B.weight", "B"),
                         (".lora_embedding_A", "embA"), (".lora_embedding_B", "embB")):
        if short.endswith(suffix):
            return short[: -len(suffix)], kind
    return None


def _weight_problems(config: dict[str, Any], tensors: dict[str, list[int]], max_rank: int,
                     supported: tuple[str, ...] | None, base: dict[str, list[int]] | None) -> list[str]:
    out: list[str] = []
    seen: dict[str, set[str]] = {}
    for name, shape in sorted(tensors.items()):
        parsed = _parse_lora_name(name)
        if parsed is None:
            if name.endswith((".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight")):
                why = "vLLM skips saved embedding weights (utils.is_base_embedding_weights), the engine would run the base ones"
            else:
                why = "not a LoRA A/B tensor vLLM reads (utils.parse_fine_tuned_lora_name)"
            out.append(f"{ADAPTER_WEIGHTS_FILE} holds `{name}` {shape}: {why}")
            continue
        module, kind = parsed
        seen.setdefault(module, set()).add(kind)
        leaf = module.rsplit(".", 1)[-1]
        if supported is not None and leaf not in supported:
            out.append(f"{ADAPTER_WEIGHTS_FILE} adapts `{module}`, not a module vLLM applies LoRA to "
                       f"(allowed: {list(supported)})")
            continue
        if len(shape) != 2:
            out.append(f"{ADAPTER_WEIGHTS_FILE} `{name}` has shape {shape}, vLLM expects a 2-D LoRA matrix")
            continue
        rank = shape[0] if kind in ("A", "embA") else shape[1]
        if rank > max_rank:
            out.append(f"{ADAPTER_WEIGHTS_FILE} `{name}` has rank {rank}, over engine.max_lora_rank {max_rank}; "
                       "raise `engine.max_lora_rank` or retrain")
        expected = _rank_for(config, module)
        if expected is not None and rank != expected:
            out.append(f"{ADAPTER_WEIGHTS_FILE} `{name}` has rank {rank} but {ADAPTER_CONFIG_FILE} gives "
                       f"`{module}` r={expected}; the files do not belong together")
        if base is not None:
            out.extend(_shape_problem(name, module, kind, shape, base))
    for module, kinds in sorted(seen.items()):
        pairs = {"A", "B"} if kinds & {"A", "B"} else {"embA", "embB"}
        if kinds != pairs:
            out.append(f"{ADAPTER_WEIGHTS_FILE} has {sorted(kinds)} for `{module}` but not both halves of the LoRA pair")
    if not tensors:
        out.append(f"{ADAPTER_WEIGHTS_FILE} holds no tensors")
    return out


def _shape_problem(name: str, module: str, kind: str, shape: list[int], base: dict[str, list[int]]) -> list[str]:
    weight = base.get(module)
    if weight is None:
        return [f"{ADAPTER_WEIGHTS_FILE} adapts `{module}`, which the base model does not have"]
    if len(weight) != 2:
        return [f"{ADAPTER_WEIGHTS_FILE} adapts `{module}` whose weight is {weight}, not a 2-D layer"]
    out_dim, in_dim = weight  # nn.Linear [out, in]; nn.Embedding [vocab, hidden]
    want = {"A": (None, in_dim), "B": (out_dim, None), "embA": (None, out_dim), "embB": (in_dim, None)}[kind]
    got = tuple(shape)
    if (want[0] is not None and got[0] != want[0]) or (want[1] is not None and got[1] != want[1]):
        return [f"{ADAPTER_WEIGHTS_FILE} `{name}` has shape {list(got)}, which does not fit the base model's "
                f"`{module}` {weight}; the adapter was made for another base model"]
    return []


def _safetensors_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's JSON header (8-byte little-endian length + JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ValueError(f"not a safetensors file (header length {size})")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file (header is not a JSON object)")
    return {k: list(v.get("shape", [])) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _base_modules(model_path: Path) -> tuple[str, dict[str, list[int]]] | None:
    """``(architecture, module -> weight shape)`` of a local base model, or ``None`` when it is not local."""
    try:
        hf = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
        files = sorted(model_path.glob("*.safetensors"))
        weights = {k: v for f in files for k, v in _safetensors_header(f).items()}
    except (OSError, ValueError):
        return None
    if not files:
        return None
    modules = {k.removesuffix(".weight"): v for k, v in weights.items() if k.endswith(".weight")}
    if "lm_head" not in modules and hf.get("tie_word_embeddings") and "model.embed_tokens" in modules:
        modules["lm_head"] = modules["model.embed_tokens"]  # vLLM ties ParallelLMHead to embed_tokens (llama.py)
    return str((hf.get("architectures") or [""])[0]), modules
