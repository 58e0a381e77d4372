"""Private: a corpus file in object storage (``s3://``, ``gs://``, any fsspec URL), read like a local one.

The corpus readers (:mod:`batch.corpus.scan`, :mod:`batch.corpus.plan`, :mod:`batch.corpus.tabular`) take a
:class:`pathlib.Path` and use a handful of its members: ``open("rb")``, ``stat().st_size``, ``name``, ``stem``,
``suffix``, ``is_dir()``. :class:`StoreObject` is that handful for one object in a store, so the same readers stream
it: ``open`` gives a buffered file object over fsspec byte-range reads (never a local copy), and every read
goes through :mod:`classify.runs.storage` (the store's deadlines and retry budget, :func:`classify.runs.storage.store_call`).

Identity: the object's ``etag``, ``version`` (S3 ``VersionId``, GCS ``generation``) and ``size`` as the store
reports them (:meth:`StoreObject.identity`). The identity seen when the corpus is located is kept (``expected``);
every later ``open`` and ``stat`` compares the store's current answer with it, so an object replaced while the
batch plans or runs is an :class:`classify.errors.InputError` naming it, before any of its bytes is used. The
shards' byte hashes (:func:`batch.corpus.plan.check_shard_bytes`, the Parquet row-group hashes) check the bytes
themselves, as for local files. A store that reports neither an etag nor a version leaves the content hash
(the corpus fingerprint) as the only identity: a resume then hashes the object again instead of trusting it.
"""

from __future__ import annotations

import io
import stat as stat_mod
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from classify.errors import InputError
from classify.runs import storage
from classify.runs.files import file_sha256, stream_sha256

READ_BLOCK_BYTES = 8 << 20
"""Bytes asked of the store per range request (fsspec's read-ahead block): one request per 8 MiB streamed."""

BUFFER_BYTES = 1 << 20
"""The buffer of the file object the readers get (line reads and small seeks are served from it)."""

_IDENTITY_KEYS = (("etag", ("ETag", "etag", "e_tag")), ("version", ("VersionId", "version_id", "generation")))


class _Stat(NamedTuple):
    st_size: int
    st_mode: int
    st_ino: int
    st_mtime_ns: int


def identity_of(info: dict[str, Any]) -> dict[str, Any]:
    """``{"size": n, "etag": ..., "version": ...}`` from an fsspec ``info`` answer (keys the store does not give are left out)."""
    out: dict[str, Any] = {"size": int(info.get("size") or 0)}
    for key, names in _IDENTITY_KEYS:
        value = next((info[n] for n in names if info.get(n) not in (None, "")), None)
        if value is not None:
            out[key] = str(value)
    return out


def same_object(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two identities name the same bytes without reading them: same size and the same etag or version
    (``False`` when neither carries one: only the content hash can tell then)."""
    if not a or not b or a.get("size") != b.get("size"):
        return False
    keys = [k for k, _ in _IDENTITY_KEYS if a.get(k) is not None and b.get(k) is not None]
    return bool(keys) and all(a[k] == b[k] for k in keys)


class _StoreRaw(io.RawIOBase):
    """An fsspec file as a raw stream whose reads carry :func:`classify.runs.storage.store_call` (for ``io.BufferedReader``)."""

    def __init__(self, fh: Any, url: str):
        self._fh, self._url = fh, url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._fh.seek(pos, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buf: Any) -> int:
        with storage.store_call("read", self._url):
            data = self._fh.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()


class StoreObject:
    """One object of an object store, with the members of :class:`pathlib.Path` the corpus readers use.

    Args:
        url: the object's URL (``s3://bucket/key``).
        expected: the identity the plan recorded (:func:`identity_of`); ``None``: nothing to compare yet.
    """

    def __init__(self, url: str, expected: dict[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.expected = expected
        self._key = PurePosixPath(self.url.split("://", 1)[1].split("?", 1)[0])

    @property
    def name(self) -> str:
        return self._key.name

    @property
    def stem(self) -> str:
        return self._key.stem

    @property
    def suffix(self) -> str:
        return self._key.suffix

    def with_name(self, name: str) -> str:
        """The URL of a sibling object (for messages)."""
        return f"{self.url.rsplit('/', 1)[0]}/{name}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"StoreObject({self.url!r})"

    def _fs(self) -> tuple[Any, str]:
        fs, path = storage.filesystem(self.url)
        fs.invalidate_cache(path)
        return fs, path

    def info(self) -> dict[str, Any] | None:
        """The store's answer about the object now (``None``: no such object; a prefix answers ``type: directory``)."""
        fs, path = self._fs()
        try:
            with storage.store_call("look up", self.url):
                return fs.info(path)
        except FileNotFoundError:
            return None

    def identity(self) -> dict[str, Any]:
        """The object's identity now, compared with ``expected`` when there is one.

        Raises:
            InputError: the object is gone, or is not the one planned (another etag, version or size).
        """
        info = self.info()
        if info is None:
            raise InputError(f"corpus {self.url} no longer exists in the store; it was removed while the batch ran. "
                             "Put it back and rerun the same command (complete shards are kept)")
        return self._checked(identity_of(info))

    def _checked(self, now: dict[str, Any]) -> dict[str, Any]:
        if self.expected is not None and (now.get("size") != self.expected.get("size") or any(
                now.get(k) != self.expected.get(k) for k, _ in _IDENTITY_KEYS if self.expected.get(k) is not None)):
            raise InputError(
                f"corpus {self.url} was replaced while the batch ran: the store answers {now}, the plan read "
                f"{self.expected}; nothing of the shards still to do was classified from it. Put the planned object "
                "back and rerun the same command (complete shards are kept), or start a new batch id for the new object")
        return now

    def exists(self) -> bool:
        return self.info() is not None

    def is_dir(self) -> bool:
        info = self.info()
        return info is not None and info.get("type") == "directory"

    def is_file(self) -> bool:
        info = self.info()
        return info is not None and info.get("type") != "directory"

    def stat(self) -> _Stat:
        """Size (and, for cache keys, a number that changes with the object's identity), identity checked."""
        ident = self.identity()
        return _Stat(ident["size"], stat_mod.S_IFREG | 0o444, 0, hash((ident.get("etag"), ident.get("version"))))

    def open(self, mode: str = "rb") -> io.BufferedReader:
        """A buffered binary file object over byte-range reads of the object (its identity checked first).

        Raises:
            InputError: the object is gone or replaced (:meth:`identity`).
            StoreUnreachable: the store did not answer in time (also on later reads).
        """
        if mode != "rb":
            raise ValueError(f"a corpus object is read only (mode 'rb'), got {mode!r}")
        fs, path = self._fs()
        try:
            with storage.store_call("read", self.url):
                fh = fs.open(path, "rb", block_size=READ_BLOCK_BYTES, cache_type="readahead")
                details = fh.details
        except FileNotFoundError:
            self.identity()  # raises, naming the object
            raise
        try:
            self._checked(identity_of(details))
        except BaseException:
            fh.close()
            raise
        return io.BufferedReader(_StoreRaw(fh, self.url), BUFFER_BYTES)


def corpus_file(path: str | Path, reading: dict[str, Any] | None = None) -> Path | StoreObject:
    """The corpus as its readers take it: a local :class:`Path`, or a :class:`StoreObject` for a URL.

    Args:
        path: the plan's corpus path or URL.
        reading: the plan's ``reading`` details (its ``object`` entry is the identity to check reads against).
    """
    if storage.is_url(str(path)):
        return StoreObject(str(path), (reading or {}).get("object"))
    return Path(path)


def sha256_of(where: Path | StoreObject) -> str:
    """sha256 hex of a local file or a store object, streamed."""
    if isinstance(where, Path):
        return file_sha256(where)
    with where.open("rb") as fh:
        return stream_sha256(fh)
