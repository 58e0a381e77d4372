"""The adapter card (``card.json``): its pydantic model, file names, and the adapter's content hash.

Read by the registry, adapter transfer, the server, the pilot gate's callers and the merged-model
cache; written by :meth:`adapters.registry.registry.Registry.publish` (and rewritten only for its ``pilot``
block). The JSON on disk is unchanged: the models validate what the registry depends on
(``files``, ``sha256``, ``base_model``, ``pilot``, ``calibration``) and keep every other key as it
is (``training``, ``metrics``, ``loss_curve``, ``classify``, ``imported``...), so
:meth:`AdapterCard.to_json` writes back what was read.

Example:
    >>> card = parse_card({"name": "topics", "version": 1, "files": {"a": "0" * 64}, "sha256": "1" * 64,
    ...                    "base_model": {"name": "m", "fingerprint": "sha256:2"}})
    >>> card.pilot.status, card.temperature
    ('not-run', 1.0)
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from classify.config.base import format_validation_error
from classify.errors import AdapterIntegrityError

CARD_FILE = "card.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
REQUIRED_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)
"""peft's artifact contract (``peft.utils.constants``): what vLLM's LoRA loader reads."""

CARD_SCHEMA = 1
PILOT_STATUSES = ("passed", "failed")


class _Open(BaseModel):
    """A card block: known fields validated, other keys kept as they are (written back unchanged)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class CardBaseModel(_Open):
    """The base model the adapter was trained on.

    Attributes:
        name: its name (``smollm2-135m-instruct``, a folder or a Hugging Face id).
        fingerprint: :func:`classify.model.model.weights_fingerprint` of its weights; every load compares it.
        source: where the weights came from (information).
    """

    name: str = Field(min_length=1)
    fingerprint: str = Field(min_length=1)
    source: str | None = None


class CardPilot(_Open):
    """The card's pilot block: the latest pilot of this version, for information.

    The pilot gate (:mod:`classify.runs.gate`, keyed by base model, adapter sha256 and the
    classification config) decides what batch and serve run; this block does not say under which
    config the pilot ran. Import resets it (the exported block is kept under ``imported``).

    Attributes:
        status: ``not-run``, ``passed`` or ``failed``.
        run_id: the pilot's run folder name.
        at: UTC time of the outcome (ISO 8601).
        history: every outcome, oldest first (``{status, run_id, at}``).
    """

    status: Literal["not-run", "passed", "failed"] = "not-run"
    run_id: str | None = None
    at: str | None = None
    history: list[dict[str, Any]] = Field(default_factory=list)


class Calibration(_Open):
    """The score temperature fitted at the end of training (Guo et al. 2017, temperature scaling).

    Attributes:
        temperature: T > 0; first-token scores are ``softmax(logprobs / T)`` over the categories.
        ece_before: expected calibration error of the validation rows at T = 1.
        ece_after: the same at the fitted T.
        fitted_on: what it was fitted on (e.g. the number of validation rows).
    """

    temperature: float = Field(gt=0)
    ece_before: float | None = None
    ece_after: float | None = None
    fitted_on: int | str | None = None


class AdapterCard(_Open):
    """``card.json`` of one published adapter version.

    Attributes:
        schema_version: card format version (``schema`` in the file).
        name: adapter name.
        version: positive integer version.
        ref: ``name@version``.
        files: relative POSIX path -> sha256 of every adapter file (``card.json`` excluded).
        sha256: the adapter's content hash (:func:`content_sha256` of ``files``).
        base_model: the base model it was trained on.
        created: UTC publish time.
        code_revision: docpilot's git revision at publish time.
        pilot: the latest pilot of this version (information; the pilot gate decides).
        calibration: the fitted score temperature, absent when none was fitted (T = 1).
    """

    schema_version: int = Field(CARD_SCHEMA, alias="schema")
    name: str | None = None
    version: int | None = None
    ref: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    sha256: str = ""
    base_model: CardBaseModel
    created: str | None = None
    code_revision: Any = None
    pilot: CardPilot = Field(default_factory=CardPilot)
    calibration: Calibration | None = None

    @property
    def temperature(self) -> float:
        """The score temperature to apply (1.0 without a ``calibration`` block)."""
        return self.calibration.temperature if self.calibration else 1.0

    def to_json(self) -> dict[str, Any]:
        """The card as written to ``card.json``: the keys that were read or set, extras included."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def parse_card(data: Any, source: str = CARD_FILE) -> AdapterCard:
    """Validate a parsed ``card.json``.

    Args:
        data: the parsed JSON.
        source: where it came from, for the message (e.g. ``"adapter topics@1: card.json"``).

    Returns:
        The :class:`AdapterCard`.

    Raises:
        AdapterIntegrityError: a field the registry relies on is missing or malformed (names the field).
    """
    try:
        return AdapterCard.model_validate(data)
    except ValidationError as err:
        raise AdapterIntegrityError(format_validation_error(err, source)) from None


def content_sha256(files: dict[str, str]) -> str:
    """One content hash for an adapter: sha256 over sorted ``"<file>:<sha256>\\n"`` lines.

    Args:
        files: relative POSIX path -> sha256 hex of every adapter file (``card.json`` excluded).

    Returns:
        A 64-hex digest (same construction as :func:`classify.model.model.weights_fingerprint`).
    """
    return hashlib.sha256("".join(f"{k}:{files[k]}\n" for k in sorted(files)).encode()).hexdigest()
