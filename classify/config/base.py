"""What every docpilot config model shares: the frozen base class and the validation-message formatter.

One home for the pieces the config schema (``classify.config.sections``), the batch, training and lot-plan
configs, the adapter card and the server's settings and request errors all use:

- :class:`Frozen`: a pydantic model that is immutable and refuses unknown fields;
- :func:`problem_message` / :func:`format_validation_error`: pydantic errors as
  "`field` must be ..., got ..." lines (peft's habit: name the field, repeat the value);
- :func:`parse_config`: validate data into a config model, raising :class:`classify.errors.ConfigError`;
- :func:`canonical_json`: the sorted, compact JSON every docpilot hash is taken over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from classify.errors import ConfigError

UNKNOWN_FIELD = "is not a known field (check the spelling; unknown fields are refused)"
"""What an unknown (``extra_forbidden``) field is told in a config file."""

_REPHRASE = (
    ("Input should be", "must be"),
    ("Input should have", "must have"),  # e.g. a datetime without its timezone
    ("String should have", "must have"),
    ("List should have", "must have"),
    ("String should match", "must match"),
)


_NUMBERS = (int, float, int | None, float | None)


class Frozen(BaseModel):
    """Base of every docpilot config section: immutable (``frozen``) and refusing unknown fields (``extra="forbid"``).

    A JSON ``true``/``false`` or a string given for a number is refused (pydantic's lax mode would read ``true``
    as 1, so a ``"cpu_actors": true`` meant as "on" would silently start one actor, and ``"10"`` as 10: a config
    file is JSON, its numbers are written as numbers).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_or_strings_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if (isinstance(value, bool | str) and info.field_name
                and cls.model_fields[info.field_name].annotation in _NUMBERS):
            hint = f" (a string: write {value} without quotes)" if isinstance(value, str) else ""
            raise ValueError(f"must be a number, got {json.dumps(value)}{hint}")
        return value


M = TypeVar("M", bound=BaseModel)


def problem_message(item: dict[str, Any], unknown_field: str = UNKNOWN_FIELD) -> str:
    """The "must ..." part of one pydantic error item (pydantic's wording turned into docpilot's).

    Args:
        item: one entry of ``ValidationError.errors()`` (keys ``type``, ``msg``).
        unknown_field: what an unknown field is told (the caller may list the allowed fields).

    Returns:
        For example ``"must be greater than or equal to 1"``, ``"is required"`` or ``unknown_field``.
    """
    kind = item.get("type")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return unknown_field
    msg = str(item.get("msg", "is invalid")).removeprefix("Value error, ")
    for before, after in _REPHRASE:
        msg = msg.replace(before, after)
    return msg


def format_validation_error(err: ValidationError, source: str,
                            rename: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None) -> str:
    """Turn a pydantic error into docpilot's "`field` must be ..., got ..." lines.

    Args:
        err: the pydantic error.
        source: where the data came from (a file path or "request"), for the message.
        rename: maps an error's location in the validated data to where the user wrote it
            (e.g. ``("thresholds", "min_accuracy")`` -> ``("pilot", "thresholds", "min_accuracy")``).

    Returns:
        One line per problem, prefixed with ``source``, e.g.
        ``pilot.json: `thresholds.min_accuracy` must be less than or equal to 1, got 1.5``.
    """
    lines = []
    for item in err.errors():
        loc = rename(tuple(item["loc"])) if rename else item["loc"]
        field = ".".join(str(p) for p in loc) or "(root)"
        got = item.get("input")
        shown = json.dumps(got)[:80] if got is None or isinstance(got, (str, int, float, bool, list)) else type(got).__name__
        problem = problem_message(item)
        if item.get("type") == "missing":  # its "input" is the enclosing object: nothing to show
            lines.append(f"{source}: `{field}` {problem}")
            continue
        if ", got " in problem:  # a validator's own message that already shows the value (and may name its fields)
            lines.append(f"{source}: {problem}" if field == "(root)" and problem.startswith("`") else f"{source}: `{field}` {problem}")
            continue
        lines.append(f"{source}: `{field}` {problem}, got {shown}")
    return "\n".join(lines)


def parse_config(cls: type[M], data: Any, source: str = "config") -> M:
    """Validate ``data`` against ``cls``.

    Args:
        cls: a docpilot config model.
        data: parsed JSON.
        source: name used in error messages.

    Returns:
        The frozen config object.

    Raises:
        ConfigError: on any invalid or unknown field, naming field, value and bound.
    """
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def canonical_json(data: Any) -> str:
    """Serialise ``data`` as sorted, compact JSON (the form every docpilot hash is taken over)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
