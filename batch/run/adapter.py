"""The one adapter preparation of batch and pilot: resolved and verified from the registry (integrity, base
model, the engine's LoRA rules), merged (cached) in merged mode, and how the engines run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.registry.merged_cache import merged_model
from adapters.registry.registry import Registry
from classify.config.sections import ClassifyConfig, ModelConfig
from classify.engine.args import compute_dtype
from classify.model.model import ModelRef

if TYPE_CHECKING:
    from adapters.registry.resolved import ResolvedAdapter
    from classify.engine.scoring import AdapterHandle


@dataclass(frozen=True)
class BatchAdapter:
    """The batch's one adapter and how the engines run it (``model.adapter_mode``).

    Attributes:
        resolved: the verified registry adapter (:class:`adapters.registry.registry.ResolvedAdapter`).
        mode: ``merged`` (the engines load ``merged`` as their base model, LoRA off) or ``lora``.
        merged: the cached merged model (:func:`adapters.registry.merged_cache.merged_model`), ``None`` in ``lora`` mode.
    """

    resolved: ResolvedAdapter
    mode: str
    merged: ModelRef | None = None

    @property
    def ref(self) -> str:
        """``name@version`` of the adapter."""
        return self.resolved.ref

    @property
    def sha256(self) -> str:
        """The adapter's content hash from its registry card."""
        return self.resolved.sha256

    @property
    def temperature(self) -> float:
        """The card's score temperature (``calibration.temperature``, 1.0 without one), applied in both modes."""
        return self.resolved.handle().temperature

    def handle(self) -> AdapterHandle | None:
        """The LoRA handle the engines apply per request; ``None`` in merged mode (the weights hold the adapter)."""
        return None if self.merged is not None else self.resolved.handle()

    def engine_model(self, model_cfg: ModelConfig, base_fingerprint: str) -> tuple[ModelConfig, str]:
        """The model section and expected fingerprint the engine actors get.

        Args:
            model_cfg: the config's model section.
            base_fingerprint: the base model's fingerprint.

        Returns:
            ``(model_cfg, base_fingerprint)`` in lora mode; in merged mode the section with
            ``base_model`` set to the merged folder and the merged weights' fingerprint.
        """
        if self.merged is None:
            return model_cfg, base_fingerprint
        return model_cfg.model_copy(update={"base_model": self.merged.path}), self.merged.fingerprint

    @property
    def card(self) -> dict[str, Any]:
        """The adapter's registry card."""
        return self.resolved.card

    def describe(self) -> dict[str, Any]:
        """``{"adapter_mode", "merged_model"}`` for ``manifest.json`` and ``summary.json``."""
        merged = {"path": self.merged.path, "fingerprint": self.merged.fingerprint} if self.merged else None
        return {"adapter_mode": self.mode, "merged_model": merged}


def resolve_adapter(ref: str | None, model: ModelRef, engine: Any = None,
                     model_cfg: ModelConfig | None = None) -> BatchAdapter | None:
    """Resolve and verify the batch's adapter; in merged mode build or reuse its merged model.

    Args:
        ref: ``name@version`` / ``name@latest``, or ``None`` for the base model alone.
        model: the resolved base model.
        engine: the engine config whose LoRA limits the adapter must fit (checked in both modes:
            the server runs the same adapter through LoRA).
        model_cfg: the model section (its ``adapter_mode`` and dtype); default ``ModelConfig()``.

    Returns:
        The :class:`BatchAdapter`, or ``None`` without ``ref``.

    Raises:
        AdapterError: unknown, tampered or incompatible adapter, or a merge that fails its check.
    """
    if ref is None:
        return None
    model_cfg = model_cfg or ModelConfig()
    resolved = Registry().resolve(ref, base_fingerprint=model.fingerprint, engine=engine, base_model_path=model.path)
    if model_cfg.adapter_mode == "lora":
        return BatchAdapter(resolved, "lora")
    return BatchAdapter(resolved, "merged", merged_model(resolved, model, compute_dtype(model_cfg)))


PROMPT_FIELDS = ("categories", "instruction", "max_doc_tokens", "long_documents", "descriptions")
"""The ``classify`` fields that shape the prompt an adapter was trained on (``long_documents``: its examples were
windows or cut documents; a card written before issue 41 has no such field and is not compared on it; likewise
``descriptions`` before issue 56, where ``null`` and ``{}`` are the same prompt)."""


def prompt_mismatch(card: dict[str, Any], classify_cfg: ClassifyConfig) -> list[str]:
    """Where the prompt an adapter was trained on differs from the one this config builds.

    Args:
        card: the adapter's registry card (its ``classify`` section is the training config's).
        classify_cfg: the ``classify`` section the run uses.

    Returns:
        One ``"<field>: trained <value>, piloted <value>"`` line per differing field of
        :data:`PROMPT_FIELDS`; empty when they agree or the card has no ``classify`` section.
    """
    trained = card.get("classify") or {}
    now = classify_cfg.model_dump(mode="json")
    if trained.get("descriptions") == {}:  # no descriptions either way: the same prompt
        trained = {**trained, "descriptions": None}
    if now.get("descriptions") == {}:
        now["descriptions"] = None
    return [f"{k}: trained {trained[k]!r}, piloted {now[k]!r}" for k in PROMPT_FIELDS
            if k in trained and trained[k] != now[k]]
