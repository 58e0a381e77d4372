"""Private: a full disk during a batch (shards, merge, export) as an environment error, not a traceback.

An ``OSError`` with ``ENOSPC`` (no space left) or ``EDQUOT`` (quota) anywhere in an exception's chain, from
Python or from pyarrow (which words it ``[errno 28] No space left on device``), becomes an
:class:`~classify.errors.EnvironmentCheckError` (exit 6) naming the folder that is full and its free space.
The attempt's failure is recorded in ``manifest.json`` and ``progress.json`` where space allows; where it
does not, the message says so plainly. Every write of a batch is atomic (a temporary name, then a rename),
so a rerun after freeing space resumes from the complete shard files and finishes exactly once.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from classify.errors import EnvironmentCheckError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "[errno 28]")


def disk_full(err: BaseException | None) -> OSError | None:
    """The "no space left" ``OSError`` in ``err``'s chain (``__cause__``, ``__context__``), or ``None``.

    Args:
        err: any exception.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and (err.errno in FULL_ERRNOS or any(w in str(err).lower() for w in _FULL_WORDS)):
            return err
        err = err.__cause__ or err.__context__
    return None


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


def free_bytes(folder: Path) -> int | None:
    """Free bytes on ``folder``'s file system for this user (``None`` when it cannot be read)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


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
