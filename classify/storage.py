"""Where copies go: a local folder or an object-storage URL (``s3://``, ``gs://``, ...) through fsspec.

Run exports and adapter exports write to a *destination* and read it back to re-check it.
A destination is either a local path (kept as a :class:`pathlib.Path`, so local behaviour
stays exactly as before) or a URL handled by fsspec (``s3://`` through s3fs, ``gs://``
through gcsfs, ``az://`` through adlfs, ...). Credentials come only from the backend's usual
sources (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE``, ``~/.aws/credentials``,
``GOOGLE_APPLICATION_CREDENTIALS``, instance roles); docpilot never reads them from its config
files and never logs them. An S3-compatible store other than AWS (MinIO, Cloudflare R2, Ceph,
moto) is reached with ``AWS_ENDPOINT_URL=https://host:port`` (botocore) or
``FSSPEC_S3_ENDPOINT_URL`` (fsspec's own config).

Object stores have no atomic rename, so a copy there is made complete by writing a marker
*last* (the ``SHA256SUMS`` file of the copy): a reader refuses a destination without it, and
writing again to an incomplete destination overwrites and finishes it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

Dest = Path | str
"""A local folder (``Path``) or an fsspec URL (``str`` with ``scheme://``)."""

CHUNK_BYTES = 1 << 20


def is_url(dest: Dest | None) -> bool:
    """Whether ``dest`` is an fsspec URL (``s3://...``) rather than a local path (``file://`` counts as local)."""
    return isinstance(dest, str) and "://" in dest and not dest.startswith("file://")


def as_dest(value: str | Path) -> Dest:
    """Turn a command-line or config value into a destination: a URL stays a string, anything else a ``Path``.

    Args:
        value: ``s3://bucket/prefix``, ``file:///abs/path``, ``/abs/path`` or a relative path.

    Returns:
        The URL unchanged (without a trailing ``/``), or the local ``Path``.
    """
    text = str(value)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    if "://" in text:
        return text.rstrip("/")
    return Path(text)


def join(dest: Dest, *parts: str) -> Dest:
    """``dest / part / ...`` for a local path or a URL."""
    if isinstance(dest, Path):
        return dest.joinpath(*parts)
    return "/".join([dest.rstrip("/"), *parts])


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem and the backend path for a URL.

    Args:
        url: ``s3://bucket/prefix`` etc.

    Returns:
        ``(fs, path)``; ``path`` is what the filesystem's methods take (``bucket/prefix`` for s3).

    Raises:
        ImportError: fsspec or the URL's backend (s3fs, gcsfs, ...) is not installed; the message
            says which package to install.
    """
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise ImportError(f"cannot open {url}: {err} (install the fsspec backend for this scheme, "
                          "e.g. `pip install s3fs` for s3://, `pip install gcsfs` for gs://)") from None
    return fs, path.rstrip("/")


def exists(dest: Dest, rel: str | None = None) -> bool:
    """Whether ``dest`` (or the file ``rel`` inside it) exists."""
    target = join(dest, rel) if rel else dest
    if isinstance(target, Path):
        return target.exists()
    fs, path = filesystem(target)
    fs.invalidate_cache()
    return fs.exists(path)


def upload_tree(src: Path, files: list[str], dest: str, last: str | None = None) -> None:
    """Copy ``files`` (relative POSIX paths under ``src``) to the URL ``dest``, then ``last`` after all others.

    Each file is one object PUT (large files: a multipart upload, which the store makes visible
    only when complete), so an interrupted upload leaves some objects, never a half object; the
    ``last`` file is the completeness marker.

    Args:
        src: local folder holding the files.
        files: relative paths to copy, in order.
        dest: destination URL (the copy's folder).
        last: the marker file (relative path under ``src``), copied after every other file.
    """
    fs, root = filesystem(dest)
    for rel in [*[f for f in files if f != last], *([last] if last else [])]:
        fs.put_file(str(src / rel), f"{root}/{rel}")
    fs.invalidate_cache()


def list_files(url: str) -> list[str]:
    """Every object under a URL, as POSIX paths relative to it, sorted (hidden names included)."""
    fs, root = filesystem(url)
    fs.invalidate_cache()
    if not fs.exists(root):
        return []
    found = fs.find(root)
    return sorted(PurePosixPath(p).relative_to(root).as_posix() for p in found if p.rstrip("/") != root)


def download_tree(url: str, into: Path) -> list[str]:
    """Read every object under ``url`` back into the local folder ``into`` (which must exist).

    This is the "read it back from the destination" step of a re-check: the bytes checked are
    the bytes the store returns, not the ones that were sent.

    Args:
        url: the copy's folder URL.
        into: an empty local folder.

    Returns:
        The relative paths read.
    """
    fs, root = filesystem(url)
    rels = list_files(url)
    for rel in rels:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        with fs.open(f"{root}/{rel}", "rb") as src, open(into / rel, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK_BYTES)
    return rels


def download_file(url: str, into: Path) -> None:
    """Read one object (``url``) into the local file ``into``."""
    fs, path = filesystem(url)
    fs.invalidate_cache()
    with fs.open(path, "rb") as src, open(into, "wb") as out:
        shutil.copyfileobj(src, out, CHUNK_BYTES)


def upload_file(local: Path, url: str) -> None:
    """Copy one local file to the object ``url`` (a single PUT or a multipart upload: all or nothing)."""
    fs, path = filesystem(url)
    fs.put_file(str(local), path)
    fs.invalidate_cache()


def local_copy_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary local folder for reading a remote copy back (removed when the context exits)."""
    return tempfile.TemporaryDirectory(prefix=f"docpilot-{prefix}-")
