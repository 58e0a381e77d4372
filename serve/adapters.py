"""Adapters the server applies: resolved by name from the registry, verified once, pilot-gated per request.

A request names an adapter (``name@version``, ``name@latest`` or ``name``), never a path
(vLLM's ``lora/request.py`` habit). The first use of a version re-hashes its files and checks
the base-model fingerprint (:meth:`adapters.registry.Registry.resolve`), and that the engine's LoRA
settings can apply it (:func:`adapters.compat.check_engine_compat`: vLLM refuses such an adapter only
inside the engine, which takes the engine down for every client); later uses reuse that
verification while the card's content hash is unchanged. The pilot gate is the one batch and the
pilot use (:mod:`classify.pilotgate`): the (base model, adapter sha256, classification config of
THIS server) key must have a passed pilot (:func:`classify.pilotgate.adapter_keys`: LoRA, or the
same combination piloted merged), so a pilot under other categories or another prompt never opens
the server. The gate record is re-read on every request, so an adapter that passes its pilot while
the server runs is served at once; the card's ``pilot`` block is shown as information only.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from classify.config import ClassifyConfig, EngineConfig, ModelConfig, classification_sha256
from classify.model import ModelRef
from classify.pilotgate import adapter_keys, gate_key, pilot_status, require_pilot

log = logging.getLogger(__name__)


class AdapterService:
    """Registry look-ups, verification cache and the pilot gate for one base model.

    Args:
        registry: an :class:`adapters.registry.Registry`.
        model: the engine's resolved base model (its fingerprint must match each adapter's card).
        model_cfg: the model section of the config (part of the base model's pilot-gate key).
        classify_cfg: the classify section (part of every pilot-gate key: base model and adapters).
        skip_pilot_gate: serve unpiloted adapters and an unpiloted base model, logging each use.
        engine_cfg: the engine section the server's vLLM engine was built with; each adapter must be one
            its LoRA support can apply (``max_lora_rank``, no DoRA, no ``modules_to_save``...). ``None``
            skips that check (bookkeeping tests with stand-in adapter files).
    """

    def __init__(self, registry: Any, model: ModelRef, model_cfg: ModelConfig, classify_cfg: ClassifyConfig,
                 skip_pilot_gate: bool = False, engine_cfg: EngineConfig | None = None):
        self.registry = registry
        self.model = model
        self.engine_cfg = engine_cfg
        self.skip_pilot_gate = skip_pilot_gate
        self.classification_sha256 = classification_sha256(model_cfg, classify_cfg)
        self._base_key = gate_key(model.fingerprint, model_cfg, classify_cfg)
        self._verified: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def check_base(self) -> None:
        """Apply the pilot gate to the base model alone (no adapter).

        Raises:
            PilotGateError: the base model + config has no passed pilot and the gate is not skipped.
        """
        require_pilot(self._base_key, f"base model {self.model.name} (no adapter)", self.skip_pilot_gate)

    def resolve(self, ref: str) -> Any:
        """Find, verify (first use) and pilot-gate an adapter; blocking file I/O, call it in a thread.

        Args:
            ref: ``name@version``, ``name@latest`` or ``name``.

        Returns:
            The :class:`adapters.registry.ResolvedAdapter` (``.handle()`` gives the engine handle).

        Raises:
            AdapterError: malformed ref (400).
            AdapterNotFound: unknown name or version (404).
            AdapterIntegrityError: changed files or another base model (409).
            AdapterIncompatible: the engine's LoRA settings cannot apply the adapter (422); the engine
                is never asked to load it.
            PilotGateError: no passed pilot for this adapter under this server's config (:meth:`check_adapter`; 409).
        """
        shown = self.registry.show(ref)  # re-reads the card: current version and pilot status
        key = (shown.ref, shown.sha256)
        with self._lock:
            verified = key in self._verified
        if not verified:
            adapter = self.registry.resolve(shown.ref, base_fingerprint=self.model.fingerprint, engine=self.engine_cfg,
                                            base_model_path=self.model.path)
            with self._lock:
                self._verified[(adapter.ref, adapter.sha256)] = adapter
        self.check_adapter(shown)
        return shown

    def gate_record(self, adapter: Any) -> dict[str, Any] | None:
        """The pilot-gate record that decides ``adapter`` under this server's config (``None``: never piloted).

        Args:
            adapter: a :class:`adapters.registry.ResolvedAdapter`.
        """
        for key in adapter_keys(self.model.fingerprint, adapter.sha256, self.classification_sha256):
            status = pilot_status(key)
            if status is not None:
                return status
        return None

    def check_adapter(self, adapter: Any) -> None:
        """Apply the pilot gate to ``adapter`` on this base model under this server's config.

        Raises:
            PilotGateError: no passed pilot for (base model, adapter sha256, classification config) in LoRA
                or merged mode, and the gate is not skipped (409). The message gives the card's pilot status.
        """
        lora, merged = adapter_keys(self.model.fingerprint, adapter.sha256, self.classification_sha256)
        card = adapter.info.pilot  # information only: it does not say under which config the pilot ran
        what = (f"adapter {adapter.ref} under this server's config (classification sha256 "
                f"{self.classification_sha256[:12]}; card pilot status: {card.status}"
                f"{', run ' + card.run_id if card.run_id else ''})")
        gate = require_pilot(lora, what, self.skip_pilot_gate, also=(merged,))
        if gate["override"]:
            log.warning("!!! PILOT GATE SKIPPED: serving adapter %s (--skip-pilot-gate)", adapter.ref)

    def is_verified(self, ref: str, sha256: str) -> bool:
        """Whether ``ref`` with content hash ``sha256`` has been verified by this server."""
        with self._lock:
            return (ref, sha256) in self._verified

    def listing(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every registry version with what the server thinks of it (cards only; files are not re-hashed),
        and why any version's card could not be read (:meth:`adapters.registry.Registry.scan`)."""
        out = []
        adapters, problems = self.registry.scan()
        for adapter in adapters:
            status = adapter.info.pilot.status
            matches = adapter.base_fingerprint == self.model.fingerprint
            gate = self.gate_record(adapter) if matches else None
            passed = bool(gate and gate.get("verdict") == "pass")
            out.append({
                "ref": adapter.ref,
                "sha256": adapter.sha256,
                "base_model": adapter.card.get("base_model", {}),
                "base_model_matches": matches,
                "pilot_status": status,
                "servable": matches and (passed or self.skip_pilot_gate),
                "loaded": self.is_verified(adapter.ref, adapter.sha256),
                "created": adapter.info.created,
            })
        return out, problems

