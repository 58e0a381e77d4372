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
BBC News data          ``../shared/data/bbc-news``                 ``DOCPILOT_BBC_DIR``
=====================  ==========================================  ==========================
"""

from __future__ import annotations

import os
from pathlib import Path


def _env_path(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default.resolve()


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


def bbc_dir() -> Path:
    """Return the BBC News data folder (``DOCPILOT_BBC_DIR``, default ``../shared/data/bbc-news``)."""
    return _env_path("DOCPILOT_BBC_DIR", Path.cwd().parent / "shared" / "data" / "bbc-news")


def expand_bbc_dir(configured: str) -> Path:
    """A configured path with ``{bbc_dir}`` replaced by :func:`bbc_dir` and ``~`` expanded (still relative when it was).

    Args:
        configured: the path as written in the config (``train.data.path``, ``corpus.path``).

    Returns:
        The path, e.g. ``../shared/data/bbc-news/test.csv`` for ``{bbc_dir}/test.csv`` with ``DOCPILOT_BBC_DIR`` unset.
    """
    return Path(configured.replace("{bbc_dir}", str(bbc_dir()))).expanduser()


def verbose_logs() -> bool:
    """Whether vLLM's, Ray's and transformers' own output is wanted (``docpilot --verbose`` / ``DOCPILOT_VERBOSE=1``)."""
    return os.environ.get("DOCPILOT_VERBOSE", "") not in ("", "0")


def bbc_dir_hint(configured: str) -> str:
    """A note for a "does not exist" error about a configured path: how ``{bbc_dir}`` was expanded, if it was used.

    Args:
        configured: the path as written in the config (``train.data.path``, ``corpus.path``).

    Returns:
        ``""`` when ``configured`` has no ``{bbc_dir}``; else a parenthesised note naming
        ``DOCPILOT_BBC_DIR`` and its value or default.
    """
    if "{bbc_dir}" not in configured:
        return ""
    where = os.environ.get("DOCPILOT_BBC_DIR")
    source = f"DOCPILOT_BBC_DIR={where}" if where else "unset DOCPILOT_BBC_DIR: ../shared/data/bbc-news from the current directory"
    return f" ({{bbc_dir}} is {bbc_dir()}, from {source}; set DOCPILOT_BBC_DIR to the BBC News data folder)"
