"""The pilot's adapter side: resolving the adapter, the mode it runs in, the merged model, and prompt drift.

Used by :func:`batch.pilot.run_pilot`; nothing here starts an engine.
"""

from __future__ import annotations

import logging
from typing import Any

from classify.config import ClassifyConfig, PilotConfig
from classify.engine import Classifier
from classify.errors import EngineError
from classify.model import ModelRef
from classify.scoring import AdapterHandle

log = logging.getLogger("batch.pilot")


PROMPT_FIELDS = ("categories", "instruction", "max_doc_tokens")
"""The ``classify`` fields that shape the prompt an adapter was trained on."""


def prompt_mismatch(card: dict[str, Any], classify_cfg: ClassifyConfig) -> list[str]:
    """Where the prompt an adapter was trained on differs from the one this config builds.

    Args:
        card: the adapter's registry card (its ``classify`` section is the training config's).
        classify_cfg: the ``classify`` section the pilot runs with.

    Returns:
        One ``"<field>: trained <value>, piloted <value>"`` line per differing field of
        :data:`PROMPT_FIELDS`; empty when they agree or the card has no ``classify`` section.
    """
    trained = card.get("classify") or {}
    now = classify_cfg.model_dump(mode="json")
    return [f"{k}: trained {trained[k]!r}, piloted {now[k]!r}" for k in PROMPT_FIELDS
            if k in trained and trained[k] != now[k]]


def resolve_adapter(ref: str, model: ModelRef, cfg: PilotConfig) -> tuple[AdapterHandle, Any]:
    """Resolve and verify ``ref`` in the registry before the engine starts; return its handle and the resolved adapter.

    Raises:
        AdapterNotFound, AdapterIntegrityError: unknown or damaged adapter, or trained on another base model.
        AdapterIncompatible: the engine's LoRA support cannot apply it (exit 4).
    """
    from adapters.registry import Registry

    # Integrity, base model and the engine's LoRA rules, all before the engine starts (AdapterIncompatible, exit 4).
    resolved = Registry().resolve(ref, base_fingerprint=model.fingerprint, engine=cfg.engine, base_model_path=model.path)
    return resolved.handle(), resolved


def adapter_mode(cfg: PilotConfig, adapter_ref: str | None, engine: Classifier | None) -> str | None:
    """The adapter mode this trial runs: ``model.adapter_mode``, or ``lora`` for a given LoRA engine; ``None`` without adapter.

    The gate records the mode that ran: a caller that hands in a LoRA-enabled classifier (tests share
    one) pilots lora mode, logged, whatever the config says.
    """
    if not adapter_ref:
        return None
    mode = cfg.model.adapter_mode
    if mode == "merged" and engine is not None and engine.lora_enabled:
        log.warning("the classifier given to this pilot runs adapters through LoRA: piloting lora mode although "
                    "`model.adapter_mode` is \"merged\" (the gate records lora)")
        return "lora"
    return mode


def merged_for_pilot(resolved: Any, model: ModelRef, cfg: PilotConfig, engine: Classifier | None) -> ModelRef:
    """Build or reuse the merged model (:func:`adapters.merged_cache.merged_model`), checked against a given engine.

    Raises:
        AdapterError: the merge failed or its cached copy could not be rebuilt.
        EngineError: the classifier handed in runs another model than this merge.
    """
    from adapters.merged_cache import merged_model
    from classify.device import compute_dtype

    merged = merged_model(resolved, model, compute_dtype(cfg.model))
    if engine is not None and engine.model.fingerprint != merged.fingerprint:
        raise EngineError(f"the classifier given runs {engine.model.path} ({engine.model.fingerprint}), not the merge of "
                          f"{resolved.ref} ({merged.fingerprint}) that merged mode pilots")
    return merged
