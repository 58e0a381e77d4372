"""Adapter export copies, the machinery of :mod:`adapters.registry.transfer`: staging a version with ``SHA256SUMS``,
tar archives (``SHA256SUMS`` last), reading a copy back from a folder, archive or URL, and its re-check.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from adapters.registry.registry import CARD_FILE, ResolvedAdapter, content_sha256
from classify.errors import AdapterError, AdapterIntegrityError
from classify.runs import storage
from classify.runs.export import SHA256SUMS, compare_sha256, read_sums, sums_text
from classify.runs.files import file_sha256, special_kind, tree_sha256
from classify.runs.records import write_bytes_atomic
from classify.runs.storage import Dest, redact

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_archive(dest: Dest) -> bool:
    """Whether ``dest`` names an archive (``.tar``, ``.tar.gz``, ``.tgz``) rather than a folder."""
    return str(dest).lower().endswith(ARCHIVE_SUFFIXES)


def stage_copy(adapter: ResolvedAdapter, into: Path) -> dict[str, str]:
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


def write_archive(folder: Path, files: list[str], out: Path) -> None:
    """A tar (gzip when ``out`` ends .gz/.tgz) of ``files`` then ``SHA256SUMS`` as the last member."""
    mode = "w:gz" if str(out).lower().endswith((".gz", ".tgz")) else "w"
    with tarfile.open(out, mode) as tar:
        for rel in [*files, SHA256SUMS]:
            info = tar.gettarinfo(str(folder / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(folder / rel, "rb") as fh:
                tar.addfile(info, fh)


IMPORT_MAX_BYTES = 4 << 30
"""The most an imported adapter export may declare in all (4 GiB; a LoRA adapter of the default model is a few MB):
an archive whose members declare more is refused before anything is written."""
IMPORT_MAX_MEMBERS = 10_000
"""The most members an imported archive may hold."""
SUMS_MAX_BYTES = 1 << 20
"""The most ``SHA256SUMS`` may hold (1 MiB: about 10,000 files)."""


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a tar member cannot be extracted (``None`` for a plain relative file)."""
    rel = PurePosixPath(member.name)
    if member.issparse():
        return f"archive member {member.name!r} is a sparse file (it could declare any size); exports hold plain files"
    if not member.isfile() or rel.is_absolute() or ".." in rel.parts:
        return f"archive member {member.name!r} is not a plain relative file"
    return None


def extract_archive(archive: Path, into: Path, label: str, max_bytes: int = IMPORT_MAX_BYTES) -> None:
    """Extract an export archive's listed files, bounded before and while anything is written.

    Two passes over the archive. The first reads only the member headers and ``SHA256SUMS`` (nothing
    is written but that small file): every member must be a plain relative file (no link, device, FIFO,
    sparse file, absolute or ``..`` name), their declared sizes together at most ``max_bytes``, at most
    :data:`IMPORT_MAX_MEMBERS` of them, each listed in ``SHA256SUMS`` and given once. The second pass writes
    only those files, each exactly the size its header declares, stopping at ``max_bytes`` in all.

    Args:
        archive: the local archive (``.tar``, ``.tar.gz``, ``.tgz``).
        into: the empty folder written into.
        label: where it came from, for messages.
        max_bytes: the cap on the bytes extracted in all (:data:`IMPORT_MAX_BYTES`).

    Raises:
        AdapterIntegrityError: any member refused (named), the cap passed, ``SHA256SUMS`` missing, or an
            archive cut short or damaged (the member is named). The caller removes ``into``.
    """
    refused = f"import of {label} refused, nothing was imported"
    member_name = "(archive header)"
    try:
        with tarfile.open(archive, "r:*") as tar:  # pass 1: headers, sizes and the listing
            names: list[str] = []
            declared = 0
            for member in tar:
                member_name = member.name
                if member.isdir():
                    continue
                if (problem := _member_problem(member)) is not None:
                    raise AdapterIntegrityError(f"{refused}: {problem}")
                declared += member.size
                if declared > max_bytes:
                    raise AdapterIntegrityError(f"{refused}: its members declare more than the import cap of {max_bytes} "
                                                f"bytes (at {member.name!r}, {member.size} bytes); an adapter export is "
                                                "far smaller: this archive is not one")
                if len(names) >= IMPORT_MAX_MEMBERS:
                    raise AdapterIntegrityError(f"{refused}: more than {IMPORT_MAX_MEMBERS} members")
                if member.name in names:
                    raise AdapterIntegrityError(f"{refused}: archive member {member.name!r} is given twice")
                names.append(member.name)
                if member.name == SHA256SUMS:
                    if member.size > SUMS_MAX_BYTES:
                        raise AdapterIntegrityError(f"{refused}: {SHA256SUMS} is {member.size} bytes (at most {SUMS_MAX_BYTES})")
                    src = tar.extractfile(member)
                    assert src is not None
                    with src, open(into / SHA256SUMS, "wb") as out:
                        out.write(src.read(SUMS_MAX_BYTES))
        if SHA256SUMS not in names:
            raise AdapterIntegrityError(
                f"{refused}: {SHA256SUMS} is missing, so the export is incomplete (an interrupted upload); "
                "rerun `docpilot adapters export` to the same destination to complete it")
        listed = read_sums(into / SHA256SUMS)
        unlisted = [n for n in names if n != SHA256SUMS and n not in listed]
        if unlisted:
            raise AdapterIntegrityError(f"{refused}: archive members not listed in {SHA256SUMS}: "
                                        f"{', '.join(repr(n) for n in unlisted[:10])}{' ...' if len(unlisted) > 10 else ''}; "
                                        "nothing was extracted")
        written = 0
        with tarfile.open(archive, "r:*") as tar:  # pass 2: the listed files, each at its declared size
            for member in tar:
                member_name = member.name
                if member.isdir() or member.name == SHA256SUMS:
                    continue
                if member.name not in listed or _member_problem(member) is not None:  # the archive changed meanwhile
                    raise AdapterIntegrityError(f"{refused}: archive member {member.name!r} changed between two reads")
                written += member.size
                if written > max_bytes:
                    raise AdapterIntegrityError(f"{refused}: more than the import cap of {max_bytes} bytes")
                rel = PurePosixPath(member.name)
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with src, open(into / rel, "wb") as out:  # tarfile reads exactly member.size bytes
                    shutil.copyfileobj(src, out, storage.CHUNK_BYTES)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise AdapterIntegrityError(
            f"import of {label} refused, nothing was imported: the archive is truncated or damaged at "
            f"{member_name}: {err}") from None


def check_folder_listing(src: Path, label: str, max_bytes: int = IMPORT_MAX_BYTES) -> list[Path]:
    """The files of a local export folder, checked before any is copied: each a regular file listed in its
    ``SHA256SUMS`` (or ``SHA256SUMS`` itself), at most ``max_bytes`` in all. Without ``SHA256SUMS`` every
    file is returned for :func:`check_copy` to name the incomplete export.

    Raises:
        AdapterIntegrityError: an unlisted or special file, or the cap passed.
    """
    refused = f"import of {label} refused, nothing was imported"
    files = sorted(p for p in src.rglob("*") if not p.is_dir())
    listed = read_sums(src / SHA256SUMS) if (src / SHA256SUMS).is_file() and (src / SHA256SUMS).stat().st_size <= SUMS_MAX_BYTES else None
    if listed is None:
        return [p for p in files if p.is_file()]
    unlisted = [p.relative_to(src).as_posix() for p in files if p.relative_to(src).as_posix() not in (*listed, SHA256SUMS)]
    if unlisted:
        raise AdapterIntegrityError(f"{refused}: files not listed in {SHA256SUMS}: {', '.join(unlisted[:10])}; nothing was copied")
    special = [p.relative_to(src).as_posix() for p in files if special_kind(p.lstat().st_mode) is not None or p.is_symlink()]
    if special:
        raise AdapterIntegrityError(f"{refused}: not regular files: {', '.join(special[:10])}")
    total = sum(p.stat().st_size for p in files)
    if total > max_bytes:
        raise AdapterIntegrityError(f"{refused}: {total} bytes, over the import cap of {max_bytes} bytes")
    return files


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
    label = redact(src)
    if not storage.exists(src):
        raise AdapterError(f"no adapter export at {label}")
    if is_archive(src):
        if isinstance(src, str):
            with storage.local_copy_dir("archive") as tmp:
                local = Path(tmp) / "export.tar"
                storage.download_file(src, local)
                extract_archive(local, into, label)
        else:
            extract_archive(src, into, label)
    elif isinstance(src, str):
        storage.download_tree(src, into)
    else:
        for p in check_folder_listing(src, label):  # unlisted, special or oversized files refused before any copy
            (into / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, into / p.relative_to(src))


def read_export(src: Dest) -> dict[str, Any]:
    """Read an export back from where it is and check it (:func:`check_copy`); return its card."""
    with storage.local_copy_dir("adapter-check") as tmp:
        fetch_copy(src, Path(tmp))
        return check_copy(Path(tmp), redact(src))
