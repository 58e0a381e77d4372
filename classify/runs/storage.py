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

Deadlines (S3 and S3-compatible stores): every HTTP request to the store has a deadline and the whole
call a retry budget, so a store that accepts connections and then stops answering fails a call in
bounded time (:func:`store_limits`) instead of holding an export, a wrap-up or ``status --from`` for
ten minutes or more. botocore's own settings do the work (``connect_timeout``, ``read_timeout``,
``retries={"mode": "standard", "total_max_attempts": N}``); s3fs's second retry loop is switched off
(``retries = 1``) so the budget is botocore's alone. One gap is closed here: a PUT sends
``Expect: 100-continue`` and aiohttp waits for the ``100 Continue`` answer without any timeout, so
:class:`_DeadlineSession` (aiobotocore's ``http_session_cls`` hook) bounds each whole request as well.
A call that runs out of budget raises :class:`classify.errors.StoreUnreachable` (exit 6) naming the
store, the call and the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from classify.errors import ConfigError, StoreUnreachable

Dest = Path | str
"""A local folder (``Path``) or an fsspec URL (``str`` with ``scheme://``)."""

CHUNK_BYTES = 1 << 20

STORE_TIMEOUT_S = 30.0
"""Default seconds a store request may wait to connect, and then for each read of its answer
(``DOCPILOT_STORE_TIMEOUT_S``). AWS S3 answers in milliseconds and MinIO or R2 under load in a few
seconds; 30 s leaves a wide margin and still ends a stalled call in about a minute and a half."""

STORE_ATTEMPTS = 3
"""Default attempts of one store request, the first included (``DOCPILOT_STORE_ATTEMPTS``; botocore's
``standard`` retry mode, with its jittered backoff between attempts)."""

MIN_BODY_BYTES_PER_S = 256 * 1024
"""Slowest upload rate a request body is given time for: each request's whole deadline is the timeout plus its
body at this rate (a 50 MiB multipart part gets 30 + 200 s)."""

STORE_DEADLINE_S = 600.0
"""Default seconds a batch waits in all for the store once its work is done on the pod (``DOCPILOT_STORE_DEADLINE_S``):
the rest of the shards' copy, the final export and its re-check. Past it the batch ends "done here, not yet off the
pod" (:class:`classify.errors.OffPodPending`, exit 9) with the command that finishes the copy later."""

STORE_SCHEMES = ("s3", "s3a")
"""URL schemes whose calls get :func:`store_limits` (s3fs over aiobotocore); other fsspec backends keep their own."""


class StoreLimits(NamedTuple):
    """The deadline and retry budget of every object-store call (:func:`store_limits`).

    Attributes:
        timeout_s: seconds to connect, and seconds for each read of an answer.
        attempts: attempts of one request, the first included.
    """

    timeout_s: float
    attempts: int


def store_limits() -> StoreLimits:
    """The object-store deadline and retry budget: the defaults, or ``DOCPILOT_STORE_TIMEOUT_S`` / ``DOCPILOT_STORE_ATTEMPTS``.

    Returns:
        The :class:`StoreLimits` in force.

    Raises:
        ConfigError: a variable that is not a number in range (timeout 0.1 to 3600 s, attempts 1 to 20);
            the message names the variable, the value and the range.
    """
    timeout_s = _env_number("DOCPILOT_STORE_TIMEOUT_S", STORE_TIMEOUT_S, 0.1, 3600.0, float)
    attempts = _env_number("DOCPILOT_STORE_ATTEMPTS", STORE_ATTEMPTS, 1, 20, int)
    return StoreLimits(float(timeout_s), int(attempts))


def store_deadline_s() -> float:
    """Seconds a batch waits in all for the store once its work is done here: :data:`STORE_DEADLINE_S` or
    ``DOCPILOT_STORE_DEADLINE_S``.

    Raises:
        ConfigError: not a number of seconds from 1 to 86400 (the message names the variable and the value).
    """
    return float(_env_number("DOCPILOT_STORE_DEADLINE_S", STORE_DEADLINE_S, 1.0, 86400.0, float))


def _env_number(name: str, default: float, low: float, high: float, kind: type) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name} must be {'a whole number' if kind is int else 'a number of seconds'} from {low} to "
                          f"{high}, got {raw!r}; unset it for the default {default}")
    return value


def _storage_options(url: str, limits: StoreLimits) -> dict[str, Any]:
    """The fsspec options that put :func:`store_limits` on ``url``'s calls (none for schemes other than S3)."""
    if url.split("://", 1)[0].lower() not in STORE_SCHEMES:
        return {}
    return {"config_kwargs": {
        "connect_timeout": limits.timeout_s, "read_timeout": limits.timeout_s,
        "retries": {"mode": "standard", "total_max_attempts": limits.attempts},
        "http_session_cls": _deadline_session_cls()}}


_SESSION_CLS: Any = None


def _deadline_session_cls() -> Any:
    """aiobotocore's HTTP session with a deadline on each whole request (built once, on first use).

    aiohttp bounds connecting and each socket read, but not its wait for ``100 Continue`` after a PUT's
    headers: a store that accepts the connection and never answers held ``put_file`` forever. The
    deadline is the timeout twice (connect, answer) plus the body at :data:`MIN_BODY_BYTES_PER_S`; on
    expiry the attempt fails as botocore's ``ReadTimeoutError``, which botocore's retry budget counts.
    """
    global _SESSION_CLS
    if _SESSION_CLS is not None:
        return _SESSION_CLS
    from aiobotocore.httpsession import AIOHTTPSession
    from botocore.exceptions import ReadTimeoutError

    class _DeadlineSession(AIOHTTPSession):
        async def send(self, request: Any) -> Any:
            limit = (self._timeout.sock_connect or STORE_TIMEOUT_S) + (self._timeout.sock_read or STORE_TIMEOUT_S)
            try:
                size = int(request.headers.get("Content-Length") or 0)
            except (TypeError, ValueError):
                size = 0
            limit += size / MIN_BODY_BYTES_PER_S
            try:
                async with asyncio.timeout(limit):
                    return await super().send(request)
            except TimeoutError as err:
                raise ReadTimeoutError(endpoint_url=request.url, error=err) from None

    _SESSION_CLS = _DeadlineSession
    return _SESSION_CLS


def _unreachable_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [TimeoutError]
    with contextlib.suppress(ImportError):
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    with contextlib.suppress(ImportError):
        from botocore.exceptions import (
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        types += [ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError, ConnectionClosedError]
    return tuple(types)


@contextlib.contextmanager
def store_call(what: str, url: Dest) -> Iterator[None]:
    """Turn a store call that ran out of deadline or retries into one :class:`StoreUnreachable` naming it.

    Args:
        what: the call in words (``"upload"``, ``"list"``, ``"read"``...).
        url: the object or folder the call was for.

    Raises:
        StoreUnreachable: the store did not answer (timeouts, refused or dropped connections) within
            :func:`store_limits`; the message names the URL, the endpoint, the limits and what to do.
    """
    try:
        yield
    except StoreUnreachable:
        raise
    except _unreachable_types() as err:
        if isinstance(url, Path):
            raise
        limits = store_limits()
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("FSSPEC_S3_ENDPOINT_URL") or "the default endpoint"
        raise StoreUnreachable(
            f"object store did not answer: {what} {str(url).split('?', 1)[0]} at {endpoint} failed after "
            f"{limits.attempts} attempt(s) of {limits.timeout_s:g} s each ({type(err).__name__}: {err}); "
            "check the endpoint and the network, then run the command again (finished work is kept and resumes); "
            "DOCPILOT_STORE_TIMEOUT_S / DOCPILOT_STORE_ATTEMPTS set the limits") from None


def is_url(dest: Dest | None) -> bool:
    """Whether ``dest`` is an fsspec URL (``s3://...``) rather than a local path (``file://`` counts as local)."""
    return isinstance(dest, str) and "://" in dest and not dest.startswith("file://")


def redact(dest: Dest) -> str:
    """``dest`` as text with any ``user:password@`` part of a URL removed (never logged or stored)."""
    text = str(dest)
    if not is_url(dest):
        return text
    parts = urlsplit(text)
    return urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.username or parts.password else text


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
        ConfigError: ``DOCPILOT_STORE_TIMEOUT_S`` / ``DOCPILOT_STORE_ATTEMPTS`` out of range (:func:`store_limits`).
    """
    import fsspec

    limits = store_limits()
    try:
        fs, path = fsspec.core.url_to_fs(url, **_storage_options(url, limits))
    except (ImportError, ValueError) as err:
        raise ImportError(f"cannot open {url}: {err} (install the fsspec backend for this scheme, "
                          "e.g. `pip install s3fs` for s3://, `pip install gcsfs` for gs://)") from None
    if url.split("://", 1)[0].lower() in STORE_SCHEMES:
        fs.retries = 1  # s3fs's own retry loop off: botocore's budget (store_limits) is the only one
    return fs, path.rstrip("/")


def exists(dest: Dest, rel: str | None = None) -> bool:
    """Whether ``dest`` (or the file ``rel`` inside it) exists."""
    target = join(dest, rel) if rel else dest
    if isinstance(target, Path):
        return target.exists()
    fs, path = filesystem(target)
    fs.invalidate_cache()
    with store_call("look up", target):
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
        with store_call("upload", join(dest, rel)):
            fs.put_file(str(src / rel), f"{root}/{rel}")
    fs.invalidate_cache()


def list_files(url: str) -> list[str]:
    """Every object under a URL, as POSIX paths relative to it, sorted (hidden names included)."""
    fs, root = filesystem(url)
    fs.invalidate_cache()
    with store_call("list", url):
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
        with store_call("read", join(url, rel)), fs.open(f"{root}/{rel}", "rb") as src, open(into / rel, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK_BYTES)
    return rels


def download_file(url: str, into: Path) -> None:
    """Read one object (``url``) into the local file ``into``."""
    fs, path = filesystem(url)
    fs.invalidate_cache()
    with store_call("read", url), fs.open(path, "rb") as src, open(into, "wb") as out:
        shutil.copyfileobj(src, out, CHUNK_BYTES)


def upload_file(local: Path, url: str) -> None:
    """Copy one local file to the object ``url`` (a single PUT or a multipart upload: all or nothing)."""
    fs, path = filesystem(url)
    with store_call("upload", url):
        fs.put_file(str(local), path)
    fs.invalidate_cache()


def local_copy_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary local folder for reading a remote copy back (removed when the context exits)."""
    return tempfile.TemporaryDirectory(prefix=f"docpilot-{prefix}-")
