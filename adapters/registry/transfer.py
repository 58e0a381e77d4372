"""Move one adapter version off the machine and back: ``docpilot adapters export`` / ``import``.

An export holds the version's files, its ``card.json`` (base model + fingerprint, the sha256 of
every file, the pilot status) and a ``SHA256SUMS`` file (``sha256sum -c`` format) over all of
them, written LAST. It is either a folder or one archive (``.tar``, ``.tar.gz``, ``.tgz``, with
``SHA256SUMS`` as the last member), at a local path or an object-storage URL (``s3://``,
``gs://``, ...; see :mod:`classify.runs.storage`).

* Export verifies the version in the registry first, then writes, then reads the copy back
  from the destination and re-checks every hash. A folder in object storage has no atomic
  rename: the files go first and ``SHA256SUMS`` last, so an interrupted upload leaves a copy
  without ``SHA256SUMS``, which import refuses and which the next export to it clears and
  completes. An archive is one object (a single PUT, or a multipart upload that the store
  shows only when complete); a local folder or archive is written beside the target and
  renamed into place.
* Import reads the copy into a hidden folder inside the registry, checks every file against
  ``SHA256SUMS`` and the card, the content hash and the base-model fingerprint (and, given the
  engine section, that the engine can apply it), and only then renames it into
  ``<registry>/<name>/<version>``: the version is never half-visible. A version that exists
  with the same content is a no-op; with other content it is refused (versions are immutable).
* The card's pilot status travels in the card as ``pilot.imported`` (what the exporting side's
  pilot said), but the imported version starts ``not-run``: the importing side's pilot gate is
  its own, because its config may differ. Run ``make pilot ADAPTER=name@version`` there.

Example:
    >>> export_adapter(Registry("/train/registry"), "topics@1", "s3://team-bucket/adapters/topics-1")  # doctest: +SKIP
    >>> import_adapter("s3://team-bucket/adapters/topics-1", Registry("/serve/registry"),
    ...                base_fingerprint=model.fingerprint)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from adapters.registry.compat import check_engine_compat
from adapters.registry.export_copy import (
    check_copy,
    fetch_copy,
    is_archive,
    read_export,
    stage_copy,
    write_archive,
)
from adapters.registry.registry import CARD_FILE, Registry, ResolvedAdapter, parse_ref
from classify.errors import AdapterError, AdapterIntegrityError
from classify.runs import storage
from classify.runs.export import SHA256SUMS
from classify.runs.files import atomic_dir
from classify.runs.records import utc_now, write_json_atomic
from classify.runs.storage import Dest, redact


def _complete(dest: Dest) -> bool:
    """Whether an export is complete at ``dest``: an archive exists, or a folder's ``SHA256SUMS`` does."""
    return storage.exists(dest) if is_archive(dest) else storage.exists(dest, SHA256SUMS)


def export_adapter(registry: Registry, ref: str, dest: Dest) -> dict[str, Any]:
    """Export one verified adapter version to a folder or archive, local or in object storage.

    Args:
        registry: the registry holding the version.
        ref: ``name@version`` or ``name@latest``.
        dest: destination folder or archive (``.tar``, ``.tar.gz``, ``.tgz``): a local path or an
            fsspec URL. A complete export of the same content there is re-checked and kept (no-op);
            an incomplete folder export (no ``SHA256SUMS``: an interrupted upload) is completed.

    Returns:
        ``{"ref", "sha256", "dest", "files", "bytes", "written"}``; ``written`` is False for a no-op.

    Raises:
        AdapterNotFound: unknown ref.
        AdapterIntegrityError: the version fails verification in the registry, or the copy fails
            its re-check (names the file).
        AdapterError: ``dest`` holds another adapter or version, or a local folder that is not an export.
    """
    adapter = registry.resolve(ref)
    label = redact(dest)
    result = {"ref": adapter.ref, "sha256": adapter.sha256, "dest": label, "files": len(adapter.card["files"]) + 1,
              "bytes": sum((adapter.path / f).stat().st_size for f in adapter.card["files"]), "written": False}
    if _complete(dest):
        there = read_export(dest)
        if there.get("sha256") != adapter.sha256 or there.get("ref") != adapter.ref:
            raise AdapterError(f"{label} already holds adapter {there.get('ref')} sha256 {str(there.get('sha256'))[:12]}..., "
                               f"not {adapter.ref} sha256 {adapter.sha256[:12]}...; exports are never overwritten, "
                               "choose another destination")
        return result
    if isinstance(dest, Path) and dest.exists() and not is_archive(dest):
        raise AdapterError(f"{dest} exists and is not a complete adapter export (no {SHA256SUMS}); "
                           "choose a new folder or remove it")
    with storage.local_copy_dir("adapter-export") as tmp:
        stage = Path(tmp) / "stage"
        stage.mkdir()
        sums = stage_copy(adapter, stage)
        files = list(sums)
        if is_archive(dest):
            archive = Path(tmp) / "export.tar"
            write_archive(stage, files, archive)
            if isinstance(dest, str):
                storage.upload_file(archive, dest)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                part = dest.with_name(f".{dest.name}.part")
                shutil.copyfile(archive, part)
                os.replace(part, dest)
        elif isinstance(dest, str):
            fs, root = storage.filesystem(dest)
            fs.invalidate_cache()
            if fs.exists(root):  # incomplete (no SHA256SUMS): clear what an interrupted upload left
                fs.rm(root, recursive=True)
            storage.upload_tree(stage, [*files, SHA256SUMS], dest, last=SHA256SUMS)
        else:
            with atomic_dir(dest, suffix=".part") as part:
                shutil.copytree(stage, part.path, dirs_exist_ok=True)
    there = read_export(dest)  # read back from the destination and re-check every hash
    if there.get("sha256") != adapter.sha256:
        raise AdapterIntegrityError(f"the copy at {label} reads back as sha256 {there.get('sha256')}, not {adapter.sha256}")
    result["written"] = True
    return result


def import_adapter(src: Dest, registry: Registry, *, base_fingerprint: str | None = None, engine: Any = None,
                   base_model_path: str | Path | None = None) -> tuple[ResolvedAdapter, bool]:
    """Import an exported adapter version into ``registry``, verified before it becomes visible.

    Args:
        src: the export: folder or archive, local path or fsspec URL.
        registry: the registry to import into (created if missing).
        base_fingerprint: this side's base-model fingerprint; when given, the card's must equal it.
        engine: this side's engine section; when given, its LoRA support must be able to apply the adapter.
        base_model_path: this side's base model folder (module and shape checks, with ``engine``).

    Returns:
        ``(adapter, created)``: the verified version in ``registry``; ``created`` is False when the same
        version with the same content was already there (nothing written).

    Raises:
        AdapterError: nothing at ``src``, or the version exists with other content (versions are immutable).
        AdapterIntegrityError: the export is incomplete, truncated or tampered with (names the file), or
            was trained on another base model.
        AdapterIncompatible: ``engine`` is given and cannot apply the adapter.
    """
    label = redact(src)
    renaming = False
    try:
        # staged as <registry>/.import-*.tmp; renamed to <registry>/<name>/<version> once the card is read
        with atomic_dir(registry.root / "import", suffix=".tmp", mode=0o755) as staged:
            tmp = staged.path
            fetch_copy(src, tmp)
            card = check_copy(tmp, label)
            name, version = parse_ref(str(card.get("ref") or f"{card.get('name')}@{card.get('version')}"))
            if version is None:
                raise AdapterIntegrityError(f"import of {label} refused: {CARD_FILE} has no version")
            ref = f"{name}@{version}"
            fingerprint = (card.get("base_model") or {}).get("fingerprint")
            if base_fingerprint is not None and fingerprint != base_fingerprint:
                raise AdapterIntegrityError(
                    f"import of {label} refused: adapter {ref} was trained on base model "
                    f"{(card.get('base_model') or {}).get('name', '?')} ({fingerprint}) but this side's base model has "
                    f"fingerprint {base_fingerprint}")
            (tmp / SHA256SUMS).unlink()
            if engine is not None:
                check_engine_compat(tmp, engine, base_model_path, label=ref)
            existing = _existing(registry, name, version, card, label)
            if existing is not None:
                staged.discard()
                return existing, False
            exported_pilot = card.get("pilot") or {}
            card["pilot"] = {"status": "not-run", "run_id": None, "at": None, "history": [],
                             "imported": {**exported_pilot, "note": "the exporting side's pilot; pilot it here"}}
            card["imported"] = {"from": label, "at": utc_now()}
            write_json_atomic(tmp / CARD_FILE, card)
            staged.target = registry.root / name / str(version)  # the rename: the version appears whole or not at all
            renaming = True
    except FileExistsError:
        if not renaming:
            raise
        existing = _existing(registry, name, version, card, label)
        if existing is not None:
            return existing, False
        raise
    return registry.resolve(ref, base_fingerprint=base_fingerprint), True


def _existing(registry: Registry, name: str, version: int, card: dict[str, Any], label: str) -> ResolvedAdapter | None:
    """The same version already in the registry with the same content, ``None`` when absent; refuses other content."""
    if version not in registry.versions(name):
        return None
    there = registry.resolve(f"{name}@{version}")
    if there.sha256 != card.get("sha256"):
        raise AdapterError(
            f"adapter {name}@{version} already exists in {registry.root} with sha256 {there.sha256[:12]}... but "
            f"{label} holds sha256 {str(card.get('sha256'))[:12]}...; versions are immutable, nothing was imported")
    return there
