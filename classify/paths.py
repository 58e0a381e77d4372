"""Where docpilot keeps its state. Every location can be overridden by an environment variable.

=====================  ==========================================  ==========================
what                   default                                     override
=====================  ==========================================  ==========================
state (git-ignored)    ``./.docpilot``                             ``DOCPILOT_HOME``
model cache            ``<state>/models``                          ``DOCPILOT_MODEL_CACHE``
adapter registry       ``<state>/registry``                        ``DOCPILOT_REGISTRY``
pilot records          ``<state>/pilots``                          (under state)
run folders            ``./runs``                                  ``DOCPILOT_RUNS``
export copies          ``./exports``                               ``DOCPILOT_EXPORTS``
=====================  ==========================================  ==========================

Data paths written in the config file (``corpus.path``, ``train.data.path``) and the overrides above may
use environment variables in the shell's form, ``${VAR}`` or ``${VAR:-default}`` (:func:`expand_path`); a
path that does not exist is reported with how each variable was expanded (:func:`path_hint`). A variable
that is unset, empty or only spaces and would change what the path names (``${DATA}/train.csv`` becoming
``/train.csv``, a path from the file-system root) is refused instead of followed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from classify.errors import ConfigError, InputError


def _env_path(var: str, default: Path) -> Path:
    """``var``'s folder, its ``${...}`` expanded as in a configured path (:func:`expand_path`), or ``default``.

    Raises:
        ConfigError: the value is only spaces, or :func:`expand_path` refuses it (a malformed ``${``, an unset or
            empty variable that would make it start from the file-system root...); the message names ``var``.
    """
    value = os.environ.get(var)
    if not value:
        return default.resolve()
    if not value.strip():
        raise ConfigError(f"{var}={value!r} is only spaces: unset it (for {default}) or set it to a folder")
    try:
        return expand_path(value).resolve()
    except ConfigError as err:
        raise ConfigError(f"{var}: {err}") from None


def state_dir() -> Path:
    """Return the git-ignored state folder (``DOCPILOT_HOME``, default ``./.docpilot``)."""
    return _env_path("DOCPILOT_HOME", Path.cwd() / ".docpilot")


def model_cache_dir() -> Path:
    """Return the local model cache (``DOCPILOT_MODEL_CACHE``, default ``<state>/models``)."""
    return _env_path("DOCPILOT_MODEL_CACHE", state_dir() / "models")


def registry_dir() -> Path:
    """Return the adapter registry root (``DOCPILOT_REGISTRY``, default ``<state>/registry``)."""
    return _env_path("DOCPILOT_REGISTRY", state_dir() / "registry")


def pilots_dir() -> Path:
    """Return the folder holding recorded pilot outcomes (``<state>/pilots``)."""
    return state_dir() / "pilots"


def runs_dir() -> Path:
    """Return the parent of all run folders (``DOCPILOT_RUNS``, default ``./runs``)."""
    return _env_path("DOCPILOT_RUNS", Path.cwd() / "runs")


def exports_dir() -> Path:
    """Return the default parent of export copies (``DOCPILOT_EXPORTS``, default ``./exports``)."""
    return _env_path("DOCPILOT_EXPORTS", Path.cwd() / "exports")


def verbose_logs() -> bool:
    """Whether vLLM's, Ray's and transformers' own output is wanted (``docpilot --verbose`` / ``DOCPILOT_VERBOSE=1``)."""
    return os.environ.get("DOCPILOT_VERBOSE", "") not in ("", "0")


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^${}]*))?\}")
"""One ``${VAR}`` or ``${VAR:-default}`` (the default holds no ``$``, ``{`` or ``}``)."""

_BARE_VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
"""A shell-style ``$VAR`` without braces: not expanded (a ``$`` in a path may be a real one), hinted at."""

PATH_FORMS = "${VAR} or ${VAR:-default} (VAR: letters, digits and _, not starting with a digit; the default without $, { or })"
"""The variable forms a configured path may use, for messages."""


def path_variables(configured: str) -> list[tuple[str, str | None]]:
    """The environment variables a configured path uses, checked.

    Args:
        configured: the path as written in the config (``train.data.path``, ``corpus.path``).

    Returns:
        ``(name, default or None)`` per ``${...}``, in order (``[]`` for a path without one).

    Raises:
        ValueError: a ``${`` that does not open one of :data:`PATH_FORMS` (unclosed, a bad name,
            another operator such as ``${VAR:?}``, a nested ``${``); the message names the character.
    """
    found: list[tuple[str, str | None]] = []
    at = configured.find("${")
    while at != -1:
        match = _VARIABLE.match(configured, at)
        if match is None:
            raise ValueError(f"has a malformed `${{` at character {at + 1}: write {PATH_FORMS}")
        found.append((match.group(1), match.group(2)))
        at = configured.find("${", match.end())
    return found


def expand_path(configured: str) -> Path:
    """A configured path with its ``${VAR}`` / ``${VAR:-default}`` expanded as the shell does, and ``~`` expanded.

    ``${VAR}`` is VAR's value (empty when unset); ``${VAR:-default}`` is the default when VAR is unset
    or set but empty. A bare ``$VAR`` (no braces) is kept as it is written: a ``$`` may be part of a
    real file name (:func:`path_hint` points at it when the path does not exist). A relative result
    stays relative (taken from the current directory by the caller).

    Unlike the shell, a variable that expands to nothing (unset, empty, ``${VAR:-}``, or only spaces) is
    refused where it would change what the path names: where the path starts with it (``${D}/etc/x`` would
    be ``/etc/x``, from the file-system root; ``${D}x.csv`` would be ``x.csv``), right after a leading ``~``
    (``~${U}/x`` would be your home's ``x``), or as a whole folder of it (``/srv/${D}/x`` would be ``/srv/x``).
    Inside a name with other text (``a/${D}-x.csv``) it stays empty, as in the shell.

    Args:
        configured: the path as written in the config, e.g. ``${DATA_DIR:-../data}/test.csv``.

    Returns:
        The path, e.g. ``../data/test.csv`` for that example with ``DATA_DIR`` unset.

    Raises:
        ConfigError: a malformed ``${`` (see :func:`path_variables`), naming the path; a path that is
            empty or only spaces once expanded (``${DATA}`` with DATA unset or empty), with :func:`path_hint`'s
            note; or a variable that expanded to nothing where it changes what the path names (above): the
            message names the variable, the path as written and as expanded, and what to set.
    """
    try:
        path_variables(configured)
    except ValueError as err:
        raise ConfigError(f"path {configured!r} {err}") from None
    expanded, spans = _expand(configured)
    if not expanded.strip():  # Path("") is the current directory: a corpus or data set read from wherever docpilot runs
        raise ConfigError(f"path {configured!r} is {'empty' if not expanded else 'only spaces'} once expanded"
                          f"{path_hint(configured)}")
    _refuse_dropped(configured, expanded, spans)
    return Path(expanded).expanduser()


def expand_location(configured: str) -> str | Path:
    """A configured data location: an object-storage URL (``s3://...``) as a string with its ``${VAR}`` expanded,
    anything else as :func:`expand_path` gives it (a ``Path`` would fold the URL's ``//``).

    Raises:
        ConfigError: as :func:`expand_path` (a variable that expands to nothing and would leave out the bucket or a
            folder of a URL, too).
    """
    if "://" in configured and not configured.startswith("file://"):
        try:
            path_variables(configured)
        except ValueError as err:
            raise ConfigError(f"path {configured!r} {err}") from None
        expanded, spans = _expand(configured)
        _refuse_dropped(configured, expanded, spans)  # s3://${BUCKET}/x would be s3:///x
        return expanded
    return expand_path(configured[len("file://"):] if configured.startswith("file://") else configured)


def _expand(configured: str) -> tuple[str, list[tuple[str, int, int]]]:
    """``configured`` with its ``${...}`` expanded, and ``(name, start, end)`` of each variable's text in the result."""
    out, spans, at = [], [], 0
    length = 0
    for match in _VARIABLE.finditer(configured):
        literal = configured[at:match.start()]
        value = os.environ.get(match.group(1)) or (match.group(2) or "")
        out += [literal, value]
        length += len(literal)
        spans.append((match.group(1), length, length + len(value)))
        length += len(value)
        at = match.end()
    out.append(configured[at:])
    return "".join(out), spans


def _refuse_dropped(configured: str, expanded: str, spans: list[tuple[str, int, int]]) -> None:
    """Raise the :class:`ConfigError` of the first variable of ``spans`` that changes what the path names (:func:`_dropped`)."""
    for name, start, end in spans:
        effect = _dropped(configured, expanded, start, end)
        if effect:
            raise ConfigError(
                f"path {configured!r} would be {expanded!r}: {_expanded_as(name, expanded[start:end])}, so {effect}; "
                f"set {name} to what it stands for, or write a default in the path (${{{name}:-<value>}})")


def _dropped(configured: str, expanded: str, start: int, end: int) -> str:
    """What a variable that expanded to nothing (or only spaces) at ``expanded[start:end]`` does to the path.

    Returns:
        ``""`` when the path keeps its shape (the variable is inside a name with other text: ``a/${D}-x.csv``);
        else what changed: the path starts from the file-system root (``${D}/etc/x`` is ``/etc/x``), starts
        without its leading part (``${D}x.csv``), names the home folder (``~${D}/x``), or leaves a folder out
        (``/srv/${D}/x``).
    """
    if expanded[start:end].strip():
        return ""
    before, rest = expanded[:start], expanded[end:]
    left = expanded.rfind("/", 0, start) + 1
    right = expanded.find("/", end)
    component = expanded[left:right if right != -1 else len(expanded)]
    if not before.strip():
        if rest.lstrip().startswith("/") and not configured.startswith("/"):
            return "the path would start from the file-system root"
        return "the path would lose the part it starts with"
    if before.strip() == "~" and component.strip() == "~":
        return "`~` would be your home folder"
    if not component.strip():
        return "a folder of the path would be left out"
    return ""


def _expanded_as(name: str, value: str) -> str:
    """How ``${name}`` expanded to ``value`` (empty or only spaces), for a message: ``${D} is empty, from unset D``."""
    raw = os.environ.get(name)
    if raw is None:
        return f"${{{name}}} is empty, from unset {name} with no default"
    if not raw:
        return f"${{{name}}} is empty, from {name} set but empty, with no default"
    return f"${{{name}}} is only spaces ({value!r}), from {name}={raw!r}"


def path_hint(configured: str) -> str:
    """A note for a "does not exist" error about a configured path: how each ``${VAR}`` in it was expanded.

    Args:
        configured: the path as written in the config (``train.data.path``, ``corpus.path``).

    Returns:
        ``""`` when ``configured`` uses no variable (or a malformed one); else a parenthesised note,
        e.g. `` (${DATA_DIR} is /x, from DATA_DIR=/x; set DATA_DIR to where the data is)``,
        `` (${DATA_DIR} is ../data, from unset DATA_DIR: ../data from the current directory; set DATA_DIR ...)``
        or, for a variable in the environment with an empty value, `` (${DATA_DIR} is empty, from DATA_DIR
        set but empty, with no default; ...)``. A bare ``$VAR`` (no braces, kept literally) adds
        `` ($DATA_DIR is taken literally: only ${VAR} and ${VAR:-default} are expanded; write ${DATA_DIR})``.
    """
    try:
        variables = path_variables(configured)
    except ValueError:
        return ""
    parts, names = [], []
    for name, default in variables:
        value = os.environ.get(name)
        source = f"unset {name}" if value is None else f"{name} set but empty"
        if value and value.strip():
            parts.append(f"${{{name}}} is {value}, from {name}={value}")
        elif value:
            parts.append(f"${{{name}}} is only spaces, from {name}={value!r}")
        elif default:
            where = "" if Path(default).expanduser().is_absolute() else " from the current directory"
            parts.append(f"${{{name}}} is {default}, from {source}: {default}{where}")
        else:
            parts.append(f"${{{name}}} is empty, from {source}{',' if value is not None else ''} with no default")
        if name not in names:
            names.append(name)
    hint = f" ({'; '.join(parts)}; set {' / '.join(names)} to where the data is)" if variables else ""
    bare = list(dict.fromkeys(_BARE_VARIABLE.findall(configured)))
    if bare:
        literal = " and ".join(f"${name}" for name in bare)
        hint += (f" ({literal} {'is' if len(bare) == 1 else 'are'} taken literally: only ${{VAR}} and "
                 f"${{VAR:-default}} are expanded; write {' and '.join(f'${{{name}}}' for name in bare)})")
    return hint


def configured_path(configured: str | None, missing: str) -> Path:
    """A data path from the config file, expanded (:func:`expand_path`), or an error saying what to set.

    Args:
        configured: the path as written (``corpus.path``, ``train.data.path``), or ``None`` when not set.
        missing: the message of the error when it is not set.

    Returns:
        The expanded path (still relative when ``configured`` is).

    Raises:
        InputError: ``configured`` is ``None`` (the message is ``missing``).
        ConfigError: a malformed ``${``.
    """
    if configured is None:
        raise InputError(missing)
    return expand_path(configured)


def checked_path_field(value: str | None) -> str | None:
    """A pydantic field validator's body for a configured data path: ``value``, once its ``${...}`` are well formed.

    Raises:
        ValueError: a malformed ``${`` (:func:`path_variables`); pydantic words it as the field's error.
    """
    if value is not None:
        path_variables(value)
    return value


DataPath = Annotated[str | None, Field(min_length=1), AfterValidator(checked_path_field)]
"""A configured data path field (``corpus.path``, ``train.data.path``): ``None`` or a non-empty string whose
``${...}`` are well formed (:func:`checked_path_field`)."""

