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
import types
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

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


_NUMBERS = (int, float)


def _not_a_number(annotation: Any, value: Any) -> tuple[str, Any] | None:
    """Where ``annotation`` wants a number (itself, or inside a dict's values, a list's or tuple's items, an optional
    or ``Annotated`` one): the first boolean or string ``value`` holds there, as ``(where, value)``; else ``None``."""
    if annotation in _NUMBERS:
        return ("", value) if isinstance(value, bool | str) else None
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _not_a_number(args[0], value)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return _not_a_number(members[0], value) if len(members) == 1 and value is not None else None
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        pairs = [(key, args[1], item) for key, item in value.items()]
    elif origin in (list, tuple, set, frozenset) and args and isinstance(value, list | tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # tuple[X, Y]: one type per place
            pairs = list(zip(range(len(args)), args, value, strict=False))
        else:
            pairs = [(i, args[0], item) for i, item in enumerate(value)]
    else:
        return None
    for key, inner, item in pairs:
        found = _not_a_number(inner, item)
        if found is not None:
            return (f".{key}{found[0]}", found[1])
    return None


class Frozen(BaseModel):
    """Base of every docpilot config section: immutable (``frozen``) and refusing unknown fields (``extra="forbid"``).

    One numeric rule for every config file: a number is a JSON number, and a finite one. A JSON ``true``/``false``
    or a string given for a number is refused, also inside a table of numbers (``usd_per_lot``): pydantic's lax mode
    would read ``true`` as 1, so a ``"cpu_actors": true`` meant as "on" would silently start one actor, and ``"10"``
    as 10. ``Infinity``, ``-Infinity`` and ``NaN`` (which Python's JSON reader accepts) are refused for every float
    (``allow_inf_nan=False``): a price or a training float of infinity passes every ``> 0`` bound and turns the plan
    or the run into ``inf``/``nan``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_or_strings_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        found = _not_a_number(cls.model_fields[info.field_name].annotation, value) if info.field_name else None
        if found is not None:
            where, bad = found
            hint = f" (a string: write {bad} without quotes)" if isinstance(bad, str) else ""
            if where:  # inside a table or list of numbers: say which entry
                raise ValueError(f"must hold numbers, got {json.dumps(bad)} at {where[1:]}{hint}")
            raise ValueError(f"must be a number, got {json.dumps(bad)}{hint}")
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
