"""A full disk, told apart once: for the batch (shards, merge, export), training and the registry.

One word list, one walk of an exception's chain, one free-space reader. An ``OSError`` with ``ENOSPC`` (no space
left) or ``EDQUOT`` (quota) anywhere in an exception's chain, or an error carrying the OS's words for them (pyarrow
words it ``[errno 28] No space left on device``, safetensors and torch ``... (os error 28)``), is a full disk.

In a batch it becomes an :class:`~classify.errors.EnvironmentCheckError` (exit 6) naming the folder that is full
and its free space (:func:`full_disk_is_environment`). The attempt's failure is recorded in ``manifest.json`` and
``progress.json`` where space allows; where it does not, the message says so plainly. Every write of a batch is
atomic (a temporary name, then a rename), so a rerun after freeing space resumes from the complete shard files and
finishes exactly once. Training checks its free space before it starts (:func:`check_disk`).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from classify.errors import EnvironmentCheckError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""``OSError.errno`` values that mean the file system (or the user's quota) is full."""

_DISK_FULL_WORDS = ("no space left on device", "disk quota exceeded", "[errno 28]", "os error 28)", "os error 122)")


def error_chain(err: BaseException | None) -> list[BaseException]:
    """``err`` and the errors it was raised from or during (``__cause__``, ``__context__``), each once."""
    seen: list[BaseException] = []
    while err is not None and all(err is not e for e in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _says_full(err: BaseException) -> bool:
    return (isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS) or any(w in str(err).lower() for w in _DISK_FULL_WORDS)


def disk_full(err: BaseException | None) -> OSError | None:
    """The "no space left" ``OSError`` in ``err``'s chain (``__cause__``, ``__context__``), or ``None``.

    Args:
        err: any exception.
    """
    return next((e for e in error_chain(err) if isinstance(e, OSError) and _says_full(e)), None)


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the disk or the quota is full.

    Args:
        err: any exception.

    Returns:
        True for an ``OSError`` with errno ``ENOSPC``/``EDQUOT`` anywhere in the chain, or an error
        whose message carries the OS's words for them (pyarrow, safetensors, torch).
    """
    return any(_says_full(e) for e in error_chain(err))


def _existing(folder: Path) -> Path:
    """``folder`` or its nearest existing parent."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def free_bytes(folder: Path) -> int | None:
    """Free bytes for this user on the file system holding ``folder`` (or its nearest existing parent); ``None``
    when it cannot be read."""
    try:
        return shutil.disk_usage(_existing(folder)).free
    except OSError:
        return None


def free_mib(folder: Path) -> float:
    """Free space in MiB on the file system holding ``folder`` (or its nearest existing parent); -1 if unknown."""
    free = free_bytes(folder)
    return -1.0 if free is None else free / 2**20


def check_disk(folder: Path, plan: dict[str, int]) -> dict[str, int]:
    """Stop before writing when ``folder``'s file system has less free space than ``plan['total']``.

    Args:
        folder: where the writes go (it may not exist yet: its nearest existing parent is asked).
        plan: bytes to be written, by item, with a ``total``.

    Returns:
        ``plan`` plus ``free`` bytes (-1 when the free space cannot be read: nothing is refused then).

    Raises:
        EnvironmentCheckError: the shortfall, with every item in MiB.
    """
    probe = _existing(folder)
    free = free_bytes(probe)
    if free is not None and free < plan["total"]:
        items = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in plan.items() if k != "total" and v)
        raise EnvironmentCheckError(
            f"not enough free disk at {probe}: the run needs {plan['total'] / 2**20:.1f} MiB ({items}) "
            f"but only {free / 2**20:.1f} MiB is free; free space or set DOCPILOT_RUNS elsewhere"
        )
    return {**plan, "free": -1 if free is None else free}


def _folder_of(err: OSError, fallbacks: list[Path]) -> Path:
    """The full folder: of the folders ``err`` names (``shutil`` names the source and the destination of a copy)
    and ``fallbacks``, the existing one with the least free space."""
    candidates: list[Path] = []
    for name in (err.filename, err.filename2):
        if name:
            path = Path(str(name))
            found = next((c for c in (path, path.parent) if c.is_dir()), None)  # the file's own folder, if it exists
            if found is not None:
                candidates.append(found)
    candidates += [f for f in fallbacks if f.is_dir()]
    if not candidates:
        return fallbacks[0]
    return min(candidates, key=lambda f: free_bytes(f) if free_bytes(f) is not None else 1 << 62)


def full_disk_error(err: OSError, fallbacks: list[Path], what: str, unrecorded: str | None = None) -> EnvironmentCheckError:
    """The environment error for a full disk.

    Args:
        err: the ``OSError`` (:func:`disk_full`).
        fallbacks: folders written to (the run folder, a local export destination): the fullest of these and of
            those ``err`` names is the one named.
        what: what was being written (``"batch b1"``).
        unrecorded: why the attempt's failure could not be recorded, or ``None`` when it was.

    Returns:
        An :class:`~classify.errors.EnvironmentCheckError` (exit 6) naming the folder and its free space.
    """
    folder = _folder_of(err, fallbacks)
    free = free_bytes(folder)
    shown = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    record = ("the attempt's failure is recorded in its manifest.json" if unrecorded is None else
              f"the attempt's failure could NOT be recorded ({unrecorded}): `docpilot status` will show it as interrupted")
    return EnvironmentCheckError(
        f"{what}: no space left in {folder} ({shown}): {err.strerror or err}; {record}. Free space there "
        "(or choose another folder) and rerun the same command: complete shards are kept and the batch resumes")


@contextmanager
def full_disk_is_environment(fallbacks: list[Path], what: str, state: dict | None = None) -> Iterator[None]:
    """Turn a full-disk ``OSError`` raised inside the block (anywhere in its chain) into :func:`full_disk_error`.

    Args:
        fallbacks: the folders written to (:func:`full_disk_error`).
        what: what is being written, for the message.
        state: a dict whose ``"unrecorded"`` key the block sets when it could not record the failure.
    """
    try:
        yield
    except EnvironmentCheckError:
        raise
    except Exception as err:
        full = disk_full(err)
        if full is None:
            raise
        raise full_disk_error(full, fallbacks, what, (state or {}).get("unrecorded")) from None
