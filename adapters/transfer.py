"""Move one adapter version off the machine and back: ``docpilot adapters export`` / ``import``.

An export holds the version's files, its ``card.json`` (base model + fingerprint, the sha256 of
every file, the pilot status) and a ``SHA256SUMS`` file (``sha256sum -c`` format) over all of
them, written LAST. It is either a folder or one archive (``.tar``, ``.tar.gz``, ``.tgz``, with
``SHA256SUMS`` as the last member), at a local path or an object-storage URL (``s3://``,
``gs://``, ...; see :mod:`classify.storage`).

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
    >>> export_adapter(Registry("/train/registry"), "bbc-news@1", "s3://team-bucket/adapters/bbc-news-1")  # doctest: +SKIP
    >>> import_adapter("s3://team-bucket/adapters/bbc-news-1", Registry("/serve/registry"),
    ...                base_fingerprint=model.fingerprint)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from adapters.compat import check_engine_compat
from adapters.registry import CARD_FILE, Registry, ResolvedAdapter, content_sha256, parse_ref
from classify import storage
from classify.errors import AdapterError, AdapterIntegrityError
from classify.export import SHA256SUMS, compare_sha256, read_sums, sums_text
from classify.files import atomic_dir, file_sha256, tree_sha256
from classify.runrecords import utc_now, write_bytes_atomic, write_json_atomic
from classify.storage import Dest

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_archive(dest: Dest) -> bool:
    """Whether ``dest`` names an archive (``.tar``, ``.tar.gz``, ``.tgz``) rather than a folder."""
    return str(dest).lower().endswith(ARCHIVE_SUFFIXES)


def _redact(dest: Dest) -> str:
    """``dest`` as text with any ``user:password@`` part of a URL removed (never logged or stored)."""
    text = str(dest)
    if not storage.is_url(dest):
        return text
    parts = urlsplit(text)
    return urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.username or parts.password else text


def _stage(adapter: ResolvedAdapter, into: Path) -> dict[str, str]:
    """Copy the version's files + card into ``into`` and write ``SHA256SUMS``; return the sums."""
    for rel in [*sorted(adapter.card["files"]), CARD_FILE]:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(adapter.path / rel, into / rel)
    sums = {rel: file_sha256(into / rel) for rel in [*sorted(adapter.card["files"]), CARD_FILE]}
    write_bytes_atomic(into / SHA256SUMS, sums_text(dict(sorted(sums.items()))))
    # the card was copied after its files were verified: re-check that it still lists the same files
    if json.loads((into / CARD_FILE).read_text(encoding="utf-8")).get("sha256") != adapter.sha256:
        raise AdapterError(f"adapter {adapter.ref}: card.json changed during the export; export again")
    return sums


def _write_archive(folder: Path, files: list[str], out: Path) -> None:
    """A tar (gzip when ``out`` ends .gz/.tgz) of ``files`` then ``SHA256SUMS`` as the last member."""
    mode = "w:gz" if str(out).lower().endswith((".gz", ".tgz")) else "w"
    with tarfile.open(out, mode) as tar:
        for rel in [*files, SHA256SUMS]:
            info = tar.gettarinfo(str(folder / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(folder / rel, "rb") as fh:
                tar.addfile(info, fh)


def _extract_archive(archive: Path, into: Path, label: str) -> None:
    """Extract regular files only, refusing absolute or ``..`` names; a cut-short archive names the member."""
    member_name = "(archive header)"
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                member_name = member.name
                rel = PurePosixPath(member.name)
                if member.isdir():
                    continue
                if not member.isfile() or rel.is_absolute() or ".." in rel.parts:
                    raise AdapterIntegrityError(f"import of {label} refused: archive member {member.name!r} "
                                                "is not a plain relative file")
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with src, open(into / rel, "wb") as out:
                    shutil.copyfileobj(src, out, storage.CHUNK_BYTES)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise AdapterIntegrityError(
            f"import of {label} refused, nothing was imported: the archive is truncated or damaged at "
            f"{member_name}: {err}") from None


def check_copy(folder: Path, label: str) -> dict[str, Any]:
    """Check an exported adapter copy in a local folder; return its card.

    Checks, in order: ``SHA256SUMS`` is there (else the export is incomplete), every file matches
    it and none is missing or unlisted, the card lists exactly the other files with the same
    hashes, and the card's content hash matches.

    Args:
        folder: the copy (read back from its destination).
        label: where it came from, for messages.

    Returns:
        The parsed ``card.json``.

    Raises:
        AdapterIntegrityError: the first kind of problem found, naming every file concerned.
    """
    refused = f"import of {label} refused, nothing was imported"
    if not (folder / SHA256SUMS).is_file():
        raise AdapterIntegrityError(
            f"{refused}: {SHA256SUMS} is missing, so the export is incomplete (an interrupted upload); "
            "rerun `docpilot adapters export` to the same destination to complete it")
    listed = read_sums(folder / SHA256SUMS)
    actual = tree_sha256(folder, skip={SHA256SUMS}, hidden=True)
    problems = compare_sha256(listed, actual, SHA256SUMS, missing="missing from the copy")
    if problems:
        raise AdapterIntegrityError(f"{refused}: {'; '.join(problems)}")
    try:
        card = json.loads((folder / CARD_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise AdapterIntegrityError(f"{refused}: {CARD_FILE} is unreadable: {err}") from None
    files = {k: v for k, v in listed.items() if k != CARD_FILE}
    problems = compare_sha256(card.get("files") or {}, files, CARD_FILE, listed_as="card")
    if not card.get("files"):
        problems.append(f"{CARD_FILE} lists no files")
    if not problems and content_sha256(files) != card.get("sha256"):
        problems.append(f"{CARD_FILE}: content sha256 {content_sha256(files)[:12]}... != card {str(card.get('sha256'))[:12]}...")
    if problems:
        raise AdapterIntegrityError(f"{refused}: {'; '.join(problems)}")
    return card


def fetch_copy(src: Dest, into: Path) -> None:
    """Read an export (folder or archive, local or URL) into the empty local folder ``into``.

    Raises:
        AdapterError: nothing is at ``src``.
        AdapterIntegrityError: an archive is truncated or damaged.
    """
    label = _redact(src)
    if not storage.exists(src):
        raise AdapterError(f"no adapter export at {label}")
    if is_archive(src):
        if isinstance(src, str):
            with storage.local_copy_dir("archive") as tmp:
                local = Path(tmp) / "export.tar"
                storage.download_file(src, local)
                _extract_archive(local, into, label)
        else:
            _extract_archive(src, into, label)
    elif isinstance(src, str):
        storage.download_tree(src, into)
    else:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                (into / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, into / p.relative_to(src))


def read_export(src: Dest) -> dict[str, Any]:
    """Read an export back from where it is and check it (:func:`check_copy`); return its card."""
    with storage.local_copy_dir("adapter-check") as tmp:
        fetch_copy(src, Path(tmp))
        return check_copy(Path(tmp), _redact(src))


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
    label = _redact(dest)
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
        sums = _stage(adapter, stage)
        files = list(sums)
        if is_archive(dest):
            archive = Path(tmp) / "export.tar"
            _write_archive(stage, files, archive)
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
    label = _redact(src)
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
