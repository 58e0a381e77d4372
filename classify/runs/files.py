"""File helpers shared by every package: sha256 of files and folders, and folders that appear whole.

One home for what model provisioning, run exports, the adapter registry, adapter
transfer, merging and training checkpoints all need:

- :func:`file_sha256`, :func:`stream_sha256`, :func:`tree_sha256`, :func:`ids_sha256`: content hashes (lowercase hex);
- :func:`atomic_dir`: build a folder under a hidden temporary name beside its target, then rename
  it into place, so a reader sees the whole folder or nothing (a crash leaves only a hidden
  ``.<name>-*`` folder, never a half-written target).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CHUNK_BYTES = 1 << 20
"""Files are hashed in 1 MiB reads."""


def stream_sha256(fh: Any, chunk_bytes: int = CHUNK_BYTES) -> str:
    """sha256 hex digest (64 lowercase hex) of everything readable from a binary file object.

    Args:
        fh: an object with ``read(n) -> bytes`` (an open file, an fsspec file).
        chunk_bytes: bytes per read.
    """
    digest = hashlib.sha256()
    while block := fh.read(chunk_bytes):
        digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> str:
    """sha256 hex digest (64 lowercase hex) of a file's bytes, read in ``chunk_bytes`` pieces.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as fh:
        return stream_sha256(fh, chunk_bytes)


_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def special_kind(mode: int) -> str | None:
    """What a file is when it is not a regular file (``"a FIFO (named pipe)"``, ``"a character device"``...),
    ``None`` for a regular file.

    Args:
        mode: ``st_mode`` of an ``os.stat`` result.
    """
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), f"not a regular file (mode {oct(mode)})")


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a regular file is read (refused before any read)."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file (only regular files are read)")
        self.strerror = f"not a regular file: {kind}"
        self.kind = kind


def open_regular(path: str | Path) -> Any:
    """Open a regular file for reading in binary, never blocking on a FIFO or touching a device.

    The path is ``stat``-ed first (links followed) and refused unless it is a regular file; it is then
    opened with ``O_NONBLOCK`` (a FIFO swapped in meanwhile cannot block the open) and ``fstat``-ed again,
    so what is read is the regular file that was checked.

    Args:
        path: the file.

    Returns:
        A binary file object (close it, or use it in a ``with`` block).

    Raises:
        NotRegularFile: a FIFO, a device, a socket or a folder.
        OSError: the file cannot be opened.
    """
    kind = special_kind(os.stat(path).st_mode)
    if kind is not None:
        raise NotRegularFile(path, kind)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFile(path, kind)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of a regular file (:func:`open_regular`): a reader can tell "over the limit"
    without reading a file that grows, or is larger than memory.

    Args:
        path: the file.
        max_bytes: the size limit in bytes.

    Raises:
        NotRegularFile, OSError: as :func:`open_regular`.
    """
    with open_regular(path) as fh:
        return fh.read(max_bytes + 1)


def regular_file_sha256(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, str]:
    """``(bytes read, sha256 hex)`` of a regular file (:func:`open_regular`: a FIFO or device is refused, never read).

    Raises:
        NotRegularFile, OSError: as :func:`open_regular`.
    """
    digest = hashlib.sha256()
    size = 0
    with open_regular(path) as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def ids_sha256(ids: list[str]) -> str:
    """sha256 hex digest of ids joined by newlines (UTF-8, lone surrogates kept): a shard's identity in a batch plan."""
    return hashlib.sha256("\n".join(ids).encode("utf-8", "surrogatepass")).hexdigest()


def tree_sha256(folder: Path, *, skip: Collection[str] = (), hidden: bool = False) -> dict[str, str]:
    """sha256 of every regular file under ``folder``, sorted by path.

    Args:
        folder: the folder walked (recursively).
        skip: relative POSIX paths left out (e.g. ``{"SHA256SUMS"}``, ``{"card.json"}``).
        hidden: when False, a file is left out if any part of its relative path starts with ``.``
            (temporary files and staging folders); when True every file is listed.

    Returns:
        ``{relative POSIX path: sha256 hex}``.

    Raises:
        OSError: a file cannot be read.
    """
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file() or rel.as_posix() in skip:
            continue
        if not hidden and any(part.startswith(".") for part in rel.parts):
            continue
        out[rel.as_posix()] = file_sha256(p)
    return out


@dataclass
class StagedDir:
    """The hidden folder :func:`atomic_dir` yields; write into ``path``.

    Attributes:
        path: the temporary folder (``<target parent>/.<target name>-<random><suffix>``).
        target: where it is renamed to on success; the block may change it (same file system) when
            the name is known only after the content is read, e.g. an import's ``name/version``.
        discarded: set by :meth:`discard`; the folder is then removed instead of renamed.
    """

    path: Path
    target: Path
    discarded: bool = False

    def discard(self) -> None:
        """Give up the write: on leaving the ``with`` block the folder is removed, the target untouched."""
        self.discarded = True


@contextmanager
def atomic_dir(target: Path, *, suffix: str = "", if_exists: Literal["error", "keep", "replace"] = "error",
               mode: int | None = None) -> Iterator[StagedDir]:
    """Build the folder ``target`` in a hidden sibling and rename it into place when the block ends.

    On an exception inside the block the temporary folder is removed and the exception propagates;
    ``target`` is never touched. The parent folder is created if missing.

    Args:
        target: the folder to create.
        suffix: added to the temporary folder's name (e.g. ``".tmp"``), so stale ones can be found.
        if_exists: what to do when ``target`` exists at the rename: ``"error"`` raises
            :class:`FileExistsError` (a concurrent writer won; its copy is kept), ``"keep"`` silently
            keeps the existing folder and drops the new one, ``"replace"`` removes the existing
            folder first (not atomic between the removal and the rename).
        mode: permission bits set on the folder before the rename (``mkdtemp`` creates it ``0o700``).

    Yields:
        A :class:`StagedDir`; write into its ``path``, or call ``discard()`` to leave without renaming.

    Raises:
        FileExistsError: ``if_exists="error"`` and ``target`` exists (checked by the rename itself).
        OSError: the folder cannot be created or renamed.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = StagedDir(Path(tempfile.mkdtemp(prefix=f".{target.name}-", suffix=suffix, dir=target.parent)), target)
    try:
        yield staged
        target = staged.target
        if staged.discarded or (if_exists == "keep" and target.exists()):
            return
        if mode is not None:
            os.chmod(staged.path, mode)
        if if_exists == "replace" and target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged.path, target)  # fails when target is a non-empty folder: a concurrent writer won
        except OSError:
            if target.exists():
                raise FileExistsError(f"{target} already exists") from None
            raise
    finally:
        shutil.rmtree(staged.path, ignore_errors=True)
