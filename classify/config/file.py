"""One config file for every command: shared sections at the top, one section per command.

``config/docpilot.json`` (:data:`DEFAULT_CONFIG`) holds what pilot, batch, training and the server
must agree on once, and what each command alone reads in its own section::

    {
      "model":    {...},                      shared: base model, dtype, max_model_len, adapter_mode
      "engine":   {...},                      shared: vLLM sizing per device
      "classify": {...},                      shared: categories, instruction, token/byte limits, scoring
      "pilot":    {"thresholds": {...}, "seed": 0},
      "corpus":   {...},                      batch: what to read
      "batch":    {...},                      batch: shards, actors, retries, timeouts
      "train":    {"data": {...}, "lora": {...}, "training": {...}, "smoke": {...}, "checks": {...}, "output": {...}}
    }

Each command validates the shared sections and its own, and works on a flat *view*
(:class:`CommandConfig` subclasses: ``PilotConfig``, ``BatchConfig``, ``TrainConfig``) whose
fields are the shared sections plus that command's. The pilot gate's classification hash is
taken over the shared ``model`` and ``classify`` sections, so a pilot, a batch, a training run
and the server that read the same file always agree on it.

Old per-command files (``config/pilot.json`` with ``thresholds``/``seed`` at the top,
``config/train.json`` with ``data``/``lora``/... at the top, each with its own ``model``,
``engine`` and ``classify``) are no longer read: they are refused with a :class:`ConfigError`
saying how to move them into one file (:func:`migration_message`). A flat dump of a view
(``cfg.model_dump()``) is such a file; :func:`file_data` gives a view's one-file layout instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationError, model_validator

from classify.config.base import Frozen, format_validation_error
from classify.errors import ConfigError

DEFAULT_CONFIG = "config/docpilot.json"
"""The one config file every command reads by default (``--config``; the Makefile's ``CONFIG``)."""

SHARED_SECTIONS = ("model", "engine", "classify")
"""Sections every command reads from the same place."""

FILE_SECTIONS = (*SHARED_SECTIONS, "pilot", "corpus", "batch", "train")
"""Every top-level section of a config file (one file, shared sections first)."""

OLD_FILES = ("pilot.json", "batch.json", "train.json")
"""Names of the per-command files docpilot shipped before the one config file."""


class CommandConfig(Frozen):
    """Base of a command's view of the config file: the shared sections plus the command's own.

    ``file_section`` names the file section that holds the command's own fields (``"pilot"``:
    ``pilot.thresholds``, ``pilot.seed``); ``None`` means its own fields are top-level sections
    of the file (the batch's ``corpus`` and ``batch``).
    """

    file_section: ClassVar[str | None] = None

    @model_validator(mode="after")
    def _documents_fit_a_prompt(self) -> CommandConfig:
        """``classify.max_doc_tokens`` below ``model.max_model_len``: else every longer document is rejected, at run time."""
        model, classify = getattr(self, "model", None), getattr(self, "classify", None)
        if model is not None and classify is not None and classify.max_doc_tokens >= model.max_model_len:
            raise ValueError(
                f"`classify.max_doc_tokens` must be below `model.max_model_len` ({model.max_model_len}): a prompt holds "
                "the instructions, the categories and the answer besides the document's tokens, so every document "
                "longer than that would be rejected once the engine runs; lower it or raise `model.max_model_len`, "
                f"got {classify.max_doc_tokens}")
        return self


def own_fields(cls: type[CommandConfig]) -> list[str]:
    """The fields of a command view that are not shared sections, in declaration order."""
    return [f for f in cls.model_fields if f not in SHARED_SECTIONS]


def migration_message(source: str, cls: type[CommandConfig]) -> str:
    """What to change in an old per-command file (the :class:`ConfigError` it is refused with).

    Args:
        source: the file, for the message.
        cls: the command view the file was read for.

    Returns:
        One paragraph naming the fields to move and where.
    """
    own = ", ".join(f"`{f}`" for f in own_fields(cls))
    return (f"{source} is an old per-command config ({own} at the top level, with its own `model`, `engine` and "
            f"`classify`). It is no longer read: the shared sections would have to be kept equal by hand in every "
            f"command's file, or the pilot gate refuses the batch and the server. Move to one {DEFAULT_CONFIG}: "
            f"keep `model`, `engine` and `classify` at the top, put {own} under `{cls.file_section}` "
            f"(see docs/config.md).")


def command_view(cls: type[CommandConfig], data: Any, source: str) -> Any:
    """The flat dict a command view validates, picked out of a config file's data.

    Args:
        cls: the command view (``PilotConfig``, ``BatchConfig``, ``TrainConfig``).
        data: the parsed file (a dict; anything else is returned for validation to refuse).
        source: the file, for messages.

    Returns:
        The shared sections plus the command's own fields (the command's section flattened).

    Raises:
        ConfigError: an old per-command file (its own fields at the top level; the message is
            :func:`migration_message`), an unknown top-level section, a command section that is not
            an object, or an old-style field given both at the top and inside the command's section.
    """
    if not isinstance(data, dict):
        return data
    section, own = cls.file_section, own_fields(cls)
    if section is not None:
        flat = [k for k in own if k in data]
        one_file = [k for k in FILE_SECTIONS if k not in SHARED_SECTIONS and k in data]  # never in an old per-command file
        if flat and one_file:
            raise ConfigError(f"{source}: {', '.join(f'`{k}`' for k in flat)} must be inside `{section}`, "
                              f"not at the top level ({', '.join(f'`{k}`' for k in one_file)} given too); see docs/config.md")
        if flat:
            raise ConfigError(migration_message(source, cls))
    unknown = [k for k in data if k not in FILE_SECTIONS]
    if unknown:
        raise ConfigError(f"{source}: {', '.join(f'`{k}`' for k in unknown)} is not a known section "
                          f"(allowed: {', '.join(FILE_SECTIONS)}; see docs/config.md)")
    view = {k: data[k] for k in SHARED_SECTIONS if k in data}
    if section is None:
        return {**view, **{k: data[k] for k in own if k in data}}
    inner = data.get(section, {})
    if not isinstance(inner, dict):
        raise ConfigError(f"{source}: `{section}` must be an object with {', '.join(own)}, got {type(inner).__name__}")
    return {**view, **inner}


def file_data(cfg: CommandConfig) -> dict[str, Any]:
    """A command view written back in the one-file layout (what :func:`command_view` reads).

    Args:
        cfg: a loaded view (``PilotConfig``, ``BatchConfig``, ``TrainConfig``).

    Returns:
        JSON-ready data: the shared sections at the top and the command's own fields under its
        ``file_section`` (at the top for a view without one, the batch's ``corpus`` and ``batch``).
        ``load_config(type(cfg), path)`` of a file holding it gives ``cfg`` back.
    """
    data = cfg.model_dump(mode="json")
    section = type(cfg).file_section
    if section is None:
        return data
    shared = {k: data.pop(k) for k in SHARED_SECTIONS if k in data}
    return {**shared, section: data}


def validate_view(cls: type[CommandConfig], view: Any, source: str, nested: bool) -> CommandConfig:
    """Validate a command view; error fields are named as they are written in the file.

    Args:
        cls: the command view.
        view: what :func:`command_view` returned.
        source: the file, for messages.
        nested: whether the command's own fields came from inside ``cls.file_section`` (then a
            problem in ``thresholds.min_accuracy`` is reported as ``pilot.thresholds.min_accuracy``).

    Raises:
        ConfigError: any invalid or unknown field.
    """
    try:
        return cls.model_validate(view)
    except ValidationError as err:
        section = cls.file_section if nested else None

        def rename(loc: tuple[Any, ...]) -> tuple[Any, ...]:
            return (section, *loc) if section and loc and loc[0] not in SHARED_SECTIONS else loc

        raise ConfigError(format_validation_error(err, source, rename)) from None


def is_nested(cls: type[CommandConfig], data: Any) -> bool:
    """Whether ``data`` is the one-file layout for ``cls`` (its own fields inside its section)."""
    return bool(cls.file_section) and isinstance(data, dict) and not any(k in data for k in own_fields(cls))
