"""Adapters the server applies: resolved by name from the registry, verified once, pilot-gated per request.

A request names an adapter (``name@version``, ``name@latest`` or ``name``), never a path
(vLLM's ``lora/request.py`` habit). The first use of a version copies its card and listed files
into a folder private to this server process (mode 0700, files read-only), then re-hashes THE COPY
against the card and checks the base-model fingerprint (:meth:`adapters.registry.registry.Registry.resolve`
on the copy) and that the engine's LoRA settings can apply it (:func:`adapters.registry.compat.check_engine_compat`:
vLLM refuses such an adapter only inside the engine, which takes the engine down for every client).
vLLM is given the copy's path, never the registry's: it reads the files again whenever it evicts an
adapter from its LoRA cache and loads it back, and a registry file replaced or truncated after the
check would otherwise be served under the verified name and sha256 (or take the engine down). Later
uses reuse the verified copy while the card's content hash is unchanged; a changed card is a new
verification and a new copy, under a vLLM adapter id derived from the ref AND the sha256, so vLLM's
cache never answers for other bytes under an old id. The pilot gate is the one batch and the
pilot use (:mod:`classify.runs.gate`): the (base model, adapter sha256, classification config of
THIS server) key must have a passed pilot (:func:`classify.runs.gate.adapter_keys`: LoRA, or the
same combination piloted merged), so a pilot under other categories or another prompt never opens
the server. The gate record is re-read on every request, so an adapter that passes its pilot while
the server runs is served at once; the card's ``pilot`` block is shown as information only.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from adapters.registry.card import CARD_FILE
from adapters.registry.registry import Registry
from adapters.registry.resolved import ResolvedAdapter, lora_int_id
from classify.config.sections import ClassifyConfig, EngineConfig, ModelConfig, classification_sha256
from classify.engine.scoring import AdapterHandle
from classify.errors import AdapterIntegrityError
from classify.model.model import ModelRef
from classify.runs.gate import adapter_keys, gate_key, pilot_status, require_pilot
from classify.usercommand import user_flag

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServedAdapter(ResolvedAdapter):
    """A verified adapter as this server serves it: ``path`` is the server's private, verified copy.

    Attributes:
        source: the registry folder the copy was made from (for messages and listings).
    """

    source: Path | None = None

    def handle(self) -> AdapterHandle:
        """The engine handle: the private copy's path and a vLLM id bound to ``ref`` and ``sha256``."""
        return AdapterHandle(name=self.ref, path=str(self.path), int_id=lora_int_id(f"{self.ref}#{self.sha256}"),
                             sha256=self.sha256, temperature=self.info.temperature)


class AdapterService:
    """Registry look-ups, verification cache and the pilot gate for one base model.

    Args:
        registry: an :class:`adapters.registry.registry.Registry`.
        model: the engine's resolved base model (its fingerprint must match each adapter's card).
        model_cfg: the model section of the config (part of the base model's pilot-gate key).
        classify_cfg: the classify section (part of every pilot-gate key: base model and adapters).
        skip_pilot_gate: serve unpiloted adapters and an unpiloted base model, logging each use.
        engine_cfg: the engine section the server's vLLM engine was built with; each adapter must be one
            its LoRA support can apply (``max_lora_rank``, no DoRA, no ``modules_to_save``...). ``None``
            skips that check (bookkeeping tests with stand-in adapter files).
        copy_root: where the verified private copies go (default: a new ``docpilot-serve-adapters-*``
            folder under the system temp folder, mode 0700, removed by :meth:`close`).
    """

    def __init__(self, registry: Registry, model: ModelRef, model_cfg: ModelConfig, classify_cfg: ClassifyConfig, *,
                 skip_pilot_gate: bool = False, engine_cfg: EngineConfig | None = None,
                 copy_root: Path | str | None = None):
        self.registry = registry
        self.model = model
        self.engine_cfg = engine_cfg
        self.skip_pilot_gate = skip_pilot_gate
        self.classification_sha256 = classification_sha256(model_cfg, classify_cfg)
        self._base_key = gate_key(model.fingerprint, model_cfg, classify_cfg)
        self._verified: dict[tuple[str, str], ServedAdapter] = {}
        self._lock = threading.Lock()
        self._copy_lock = threading.Lock()  # one first-use copy at a time (two requests for one new version)
        self._copy_root = Path(copy_root) if copy_root is not None else None
        self._own_root = copy_root is None

    def check_base(self) -> None:
        """Apply the pilot gate to the base model alone (no adapter).

        Raises:
            PilotGateError: the base model + config has no passed pilot and the gate is not skipped.
        """
        require_pilot(self._base_key, f"base model {self.model.name} (no adapter)", self.skip_pilot_gate)

    def resolve(self, ref: str) -> ServedAdapter:
        """Find, verify (first use) and pilot-gate an adapter; blocking file I/O, call it in a thread.

        Args:
            ref: ``name@version``, ``name@latest`` or ``name``.

        Returns:
            The :class:`ServedAdapter` (a :class:`adapters.registry.resolved.ResolvedAdapter` whose ``.handle()`` gives the
            engine handle on the server's verified copy).

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
            served = self._verified.get(key)
        if served is None:
            with self._copy_lock:
                with self._lock:
                    served = self._verified.get(key)
                if served is None:
                    served = self._verified_copy(shown)
                    with self._lock:
                        self._verified[(served.ref, served.sha256)] = served
        if served.sha256 != shown.sha256:  # the card changed while it was copied: verify the new one
            return self.resolve(ref)
        self.check_adapter(shown)
        return dataclasses.replace(served, card=shown.card, info=shown.info)  # current pilot block, verified files

    def _root(self) -> Path:
        if self._copy_root is None:
            self._copy_root = Path(tempfile.mkdtemp(prefix="docpilot-serve-adapters-"))  # mode 0700
        self._copy_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._copy_root

    def _verified_copy(self, shown: ResolvedAdapter) -> ServedAdapter:
        """Copy ``shown``'s card and listed files into the private folder and verify the copy (not the registry).

        Raises:
            AdapterIntegrityError: a listed file is missing, unreadable or outside the version folder, or the
                copy's hashes differ from the card (names the file), or another base model.
            AdapterIncompatible: the engine's LoRA settings cannot apply it.
        """
        root = self._root() / shown.sha256[:16]
        target = root / shown.name / str(shown.version)
        staging = root / shown.name / f".{shown.version}.partial"
        for stale in (target, staging):
            if stale.exists():
                shutil.rmtree(stale)
        listed = [CARD_FILE, *sorted(shown.card.get("files") or {})]
        try:
            for rel in listed:
                part = PurePosixPath(rel)
                if part.is_absolute() or ".." in part.parts:
                    raise AdapterIntegrityError(f"adapter {shown.ref}: {CARD_FILE} lists {rel!r}, outside its folder; "
                                                "the adapter was not loaded")
                dest = staging / part
                dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                try:
                    shutil.copyfile(shown.path / part, dest)
                except OSError as err:
                    raise AdapterIntegrityError(
                        f"adapter {shown.ref} failed verification and was not loaded: {rel}: cannot be read from "
                        f"{shown.path} ({type(err).__name__}: {err.strerror or err})") from None
                dest.chmod(0o444)
            staging.rename(target)
            copy = Registry(root).resolve(shown.ref, base_fingerprint=self.model.fingerprint, engine=self.engine_cfg,
                                          base_model_path=self.model.path)
        except BaseException:
            for leftover in (staging, target):
                shutil.rmtree(leftover, ignore_errors=True)
            raise
        log.info("adapter %s verified from a private copy in %s (sha256 %s)", copy.ref, target, copy.sha256[:12])
        fields = {f.name: getattr(copy, f.name) for f in dataclasses.fields(ResolvedAdapter)}
        return ServedAdapter(**fields, source=shown.path)

    def close(self) -> None:
        """Remove the private copies (at shutdown; a copy the engine still holds in memory is unaffected)."""
        if self._own_root and self._copy_root is not None:
            shutil.rmtree(self._copy_root, ignore_errors=True)
            self._copy_root = None

    def gate_record(self, adapter: ResolvedAdapter) -> dict[str, Any] | None:
        """The pilot-gate record that decides ``adapter`` under this server's config (``None``: never piloted).

        Args:
            adapter: a :class:`adapters.registry.registry.ResolvedAdapter`.
        """
        for key in adapter_keys(self.model.fingerprint, adapter.sha256, self.classification_sha256):
            status = pilot_status(key)
            if status is not None:
                return status
        return None

    def check_adapter(self, adapter: ResolvedAdapter) -> None:
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
            log.warning("!!! PILOT GATE SKIPPED: serving adapter %s (%s)", adapter.ref, user_flag("--skip-pilot-gate"))

    def is_verified(self, ref: str, sha256: str) -> bool:
        """Whether ``ref`` with content hash ``sha256`` has been verified by this server."""
        with self._lock:
            return (ref, sha256) in self._verified

    def listing(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every registry version with what the server thinks of it (cards only; files are not re-hashed),
        and why any version's card could not be read (:meth:`adapters.registry.registry.Registry.scan`)."""
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

