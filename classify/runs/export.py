"""Export copies of a finished folder with a ``SHA256SUMS`` file, and their re-check.

``SHA256SUMS`` is in ``sha256sum -c`` format (``<64 hex>  <relative path>`` per line). A run
folder (pilot, batch) is copied by :func:`export_run` and re-read by :func:`verify_export`;
adapter exports (:mod:`adapters.registry.transfer`) use the same file format (:func:`sums_text`,
:func:`read_sums`) and the same comparison (:func:`compare_sha256`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from classify.errors import VerificationError
from classify.runs import storage
from classify.runs.files import atomic_dir, tree_sha256
from classify.runs.records import write_bytes_atomic
from classify.runs.storage import Dest

SHA256SUMS = "SHA256SUMS"
EXPORT_STAGING_SUFFIX = ".export-tmp"
"""Suffix of the hidden folder a local export is built in (``.<name>-<random>.export-tmp`` beside it), so that a
killed export's staging copy can be found and removed (:mod:`batch.run.debris`)."""


RUN_SELF_RECORDS = ("batch.log", "train.log", "detach.json", "exit.json")
"""Files a detached run writes about itself while it runs (its log, its supervisor's record, its exit status):
never part of the export, whose hashes must not race a log line written during the copy."""


def sums_text(sums: dict[str, str]) -> bytes:
    """The ``SHA256SUMS`` bytes for ``{relative path: sha256 hex}``, one ``<hex>  <path>`` line each, in dict order."""
    return "".join(f"{h}  {p}\n" for p, h in sums.items()).encode()


def read_sums(path: Path) -> dict[str, str]:
    """Parse a ``SHA256SUMS`` file into ``{relative path: sha256 hex}`` (lines without a path are skipped).

    Raises:
        OSError: the file cannot be read.
    """
    listed: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, _, rel = line.partition("  ")
        if rel:
            listed[rel] = digest
    return listed


def export_run(run_dir: Path, export_dir: Dest, reuse: dict[str, str] | None = None) -> Dest:
    """Copy a finished run folder to ``export_dir`` with a ``SHA256SUMS`` file.

    A local copy goes to a temporary sibling folder and is renamed into place, so a partial copy
    never looks complete. An object-storage copy (``s3://...``, see :mod:`classify.runs.storage`) has
    no rename: every file is uploaded first and ``SHA256SUMS`` last, so a copy without
    ``SHA256SUMS`` is incomplete (an interrupted upload) and is cleared and rewritten here, except
    the objects ``reuse`` names with the hash the source file has now: those are already there (a
    batch's shards copied off the pod as they completed, :mod:`batch.run.offpod`) and are not sent
    again (the re-check after the export reads them back like every other file).
    Hashes are taken from the source files.

    Args:
        run_dir: the run folder.
        export_dir: destination folder or URL (must not hold a complete export yet).
        reuse: ``{relative path: sha256 hex}`` of objects already at a URL ``export_dir``; ignored for a folder.

    Returns:
        ``export_dir``.

    Raises:
        VerificationError: ``export_dir`` already holds an export (exports are never overwritten).
    """
    if export_complete(export_dir):
        raise VerificationError(f"export folder {export_dir} already exists; exports are never overwritten")
    sums = tree_sha256(run_dir, skip={SHA256SUMS, *RUN_SELF_RECORDS})
    if isinstance(export_dir, str):
        fs, root = storage.filesystem(export_dir)
        fs.invalidate_cache()
        keep = {rel for rel, digest in (reuse or {}).items() if sums.get(rel) == digest}
        with storage.store_call("clear an incomplete copy", export_dir):
            if fs.exists(root) and not keep:  # an interrupted upload: no SHA256SUMS, so nothing there was ever complete
                fs.rm(root, recursive=True)
            elif keep:  # only what the copy will not hold is removed; what it lists is overwritten in place
                stray = [f"{root}/{rel}" for rel in storage.list_files(export_dir) if rel not in sums]
                if stray:
                    fs.rm(stray)
        with storage.local_copy_dir("sums") as tmp:
            storage.upload_tree(run_dir, [rel for rel in sums if rel not in keep], export_dir)
            write_bytes_atomic(Path(tmp) / SHA256SUMS, sums_text(sums))
            storage.upload_file(Path(tmp) / SHA256SUMS, storage.join(export_dir, SHA256SUMS))
        return export_dir
    with atomic_dir(export_dir, suffix=EXPORT_STAGING_SUFFIX) as staged:
        for rel in sums:
            (staged.path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / rel, staged.path / rel)
        write_bytes_atomic(staged.path / SHA256SUMS, sums_text(sums))
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
        actual: what :func:`classify.runs.files.tree_sha256` (or an equivalent) found.
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
    problems = compare_sha256(read_sums(sums_path), tree_sha256(export_dir, skip={SHA256SUMS}), SHA256SUMS,
                              missing="missing from the copy")
    if not problems and check is not None:
        problems += check(export_dir)
    return problems
