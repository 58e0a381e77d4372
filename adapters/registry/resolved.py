"""Adapter references and one resolved adapter version: ``name@version`` parsing, vLLM's int id, :class:`ResolvedAdapter`."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.registry.card import AdapterCard
from classify.engine.scoring import AdapterHandle
from classify.errors import AdapterError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
"""Adapter names: lower case, digits, ``.``, ``_``, ``-``; at most 64 characters."""


def lora_int_id(ref: str) -> int:
    """vLLM's integer id for an adapter: the first 31 bits of sha256(``ref``), never 0.

    Args:
        ref: ``name@version``.

    Returns:
        A positive int32, stable for the same ``ref`` across processes and machines.
    """
    value = int(hashlib.sha256(ref.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF
    return value or 1


def parse_ref(ref: str) -> tuple[str, int | None]:
    """Split ``name@version`` / ``name@latest`` / ``name`` into ``(name, version or None for latest)``.

    Raises:
        AdapterError: the name or version is malformed (names the part and what is allowed).
    """
    name, sep, version = ref.strip().partition("@")
    if not NAME_RE.match(name):
        raise AdapterError(
            f"adapter name must match {NAME_RE.pattern} (lower case, digits, '.', '_', '-'), got {name!r} in {ref!r}"
        )
    if not sep or version == "latest":
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise AdapterError(f"adapter version must be a positive integer or 'latest', got {version!r} in {ref!r}")
    return name, int(version)


@dataclass(frozen=True)
class ResolvedAdapter:
    """One published adapter version.

    Attributes:
        name: adapter name.
        version: positive integer version.
        path: the version folder (peft files + ``card.json``).
        card: ``card.json`` as parsed JSON (what is on disk).
        sha256: the adapter's content hash (:func:`adapters.registry.card.content_sha256` over its files).
        info: the same card validated (:class:`adapters.registry.card.AdapterCard`): typed base model,
            pilot block and calibration.
    """

    name: str
    version: int
    path: Path
    card: dict[str, Any] = field(hash=False, compare=False)
    sha256: str
    info: AdapterCard = field(hash=False, compare=False, repr=False)

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    @property
    def base_fingerprint(self) -> str:
        """Fingerprint of the base model the adapter was trained on."""
        return self.info.base_model.fingerprint

    def handle(self) -> AdapterHandle:
        """The :class:`classify.engine.scoring.AdapterHandle` the engine applies (stable ``int_id`` per ref; the card's
        ``calibration.temperature`` as its score temperature, 1.0 without one)."""
        return AdapterHandle(name=self.ref, path=str(self.path), int_id=lora_int_id(self.ref), sha256=self.sha256,
                             temperature=self.info.temperature)

    def summary(self) -> dict[str, Any]:
        """A short JSON-able view for listings (ref, base model, metrics, pilot, created)."""
        return {
            "ref": self.ref,
            "sha256": self.sha256,
            "base_model": self.card.get("base_model", {}),
            "metrics": self.card.get("metrics", {}),
            "pilot": self.card.get("pilot", {}),
            "created": self.card.get("created"),
            "path": str(self.path),
        }
