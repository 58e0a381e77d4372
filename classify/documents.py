"""Document reading for pilot, batch and serve: folders, JSONL and CSV, with a reason for every reject.

Nothing is dropped: an unreadable, empty, binary, non-UTF-8 or oversize document
becomes a :class:`~classify.records.Document` with ``reject_reason`` set, and a
repeated id is reported by :func:`find_duplicate_ids` (pilot refuses it, batch
rejects the id with a reason naming every occurrence). Mojibake (``Â£``) is valid
UTF-8 and stays text.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from classify.errors import InputError
from classify.records import Document

CONTROL_SHARE_LIMIT = 0.10
"""Above this share of control characters (other than tab/newline/CR) a text counts as binary."""

LABEL_FILES = ("labels.json", "labels.csv")


def check_bytes(raw: bytes, max_doc_bytes: int) -> tuple[str | None, str | None]:
    """Decode one document's bytes or say why it cannot be classified.

    Args:
        raw: the document's raw bytes.
        max_doc_bytes: size limit in bytes.

    Returns:
        ``(text, None)`` for a usable document, ``(None, reason)`` otherwise.
    """
    if len(raw) == 0:
        return None, "empty document (0 bytes)"
    if len(raw) > max_doc_bytes:
        return None, f"over size limit: {len(raw)} bytes > classify.max_doc_bytes {max_doc_bytes}"
    if b"\x00" in raw:
        return None, "binary content: contains NUL bytes (not a text document)"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return None, f"not valid UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start} (re-encode the file as UTF-8)"
    return check_text(text)


def check_text(text: str) -> tuple[str | None, str | None]:
    """Check decoded text: empty or mostly control characters is rejected; see :func:`check_bytes`."""
    if not text.strip():
        return None, "empty document: only whitespace"
    control = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r")
    if control / len(text) > CONTROL_SHARE_LIMIT:
        return None, f"binary content: {100 * control / len(text):.0f}% control characters"
    return text, None


def document_from_bytes(doc_id: str, raw: bytes, max_doc_bytes: int, source: str = "") -> Document:
    """Build a :class:`Document` from raw bytes (hashing them, checking them)."""
    text, reason = check_bytes(raw, max_doc_bytes)
    return Document(
        id=doc_id,
        text=text,
        input_sha256=hashlib.sha256(raw).hexdigest(),
        n_chars=len(text) if text is not None else 0,
        reject_reason=reason,
        source=source,
    )


def document_from_text(doc_id: str, text: object, max_doc_bytes: int, source: str = "") -> Document:
    """Build a :class:`Document` from a JSON/CSV text field (non-strings are rejected with a reason)."""
    if not isinstance(text, str):
        return Document(doc_id, None, "", 0, f"`text` must be a string, got {type(text).__name__}", source)
    return document_from_bytes(doc_id, text.encode("utf-8", errors="surrogatepass"), max_doc_bytes, source)


def _read_file(doc_id: str, path: Path, max_doc_bytes: int) -> Document:
    try:
        size = path.stat().st_size
        if size > max_doc_bytes:
            return Document(doc_id, None, "", 0, f"over size limit: {size} bytes > classify.max_doc_bytes {max_doc_bytes}", str(path))
        raw = path.read_bytes()
    except OSError as err:
        return Document(doc_id, None, "", 0, f"unreadable: {err.strerror or err}", str(path))
    return document_from_bytes(doc_id, raw, max_doc_bytes, str(path))


def iter_directory(folder: Path, max_doc_bytes: int, exclude: tuple[str, ...] = LABEL_FILES) -> Iterator[Document]:
    """Yield one document per file under ``folder`` (recursive, sorted); id = relative POSIX path.

    Hidden files (``.name``) and top-level label files are skipped.
    """
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or path.is_dir():
            continue
        if len(rel.parts) == 1 and rel.name in exclude:
            continue
        yield _read_file(rel.as_posix(), path, max_doc_bytes)


def iter_jsonl(path: Path, max_doc_bytes: int) -> Iterator[tuple[Document, dict]]:
    """Yield ``(document, record)`` per line of a JSONL file with ``id`` and ``text`` or ``path``.

    ``path`` is read relative to the JSONL file's folder. A line that is not a JSON object or has
    no ``id`` is yielded as a rejected document with id ``<file name>#L<line>`` so it is still
    accounted for. Blank lines are skipped.
    """
    with path.open("rb") as fh:
        for lineno, raw_line in enumerate(fh, start=1):
            if not raw_line.strip():
                continue
            where = f"{path.name}#L{lineno}"
            try:
                record = json.loads(raw_line)
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                yield Document(where, None, hashlib.sha256(raw_line).hexdigest(), 0, f"line {lineno} is not valid JSON: {err}", where), {}
                continue
            if not isinstance(record, dict) or not isinstance(record.get("id"), (str, int)) or record.get("id") == "":
                yield Document(where, None, hashlib.sha256(raw_line).hexdigest(), 0, f"line {lineno} has no `id` (string or integer)", where), {}
                continue
            doc_id = str(record["id"])
            if "text" in record:
                yield document_from_text(doc_id, record["text"], max_doc_bytes, where), record
            elif isinstance(record.get("path"), str):
                target = (path.parent / record["path"]).resolve()
                if not target.is_relative_to(path.parent.resolve()):
                    reason = f"`path` {record['path']!r} leaves the folder of {path.name} (only relative paths inside it)"
                    yield Document(doc_id, None, "", 0, reason, where), record
                else:
                    yield _read_file(doc_id, target, max_doc_bytes), record
            else:
                yield Document(doc_id, None, "", 0, "record has neither `text` nor `path`", where), record


def iter_csv(
    path: Path,
    max_doc_bytes: int,
    text_column: str = "text",
    id_column: str | None = "id",
    id_prefix: str | None = None,
) -> Iterator[tuple[Document, dict]]:
    """Yield ``(document, row)`` per CSV row.

    Args:
        path: the CSV file (UTF-8, header row).
        max_doc_bytes: size limit per document.
        text_column: column holding the text.
        id_column: column holding the id; when ``None`` or absent from the header, ids are
            ``<id_prefix>-<row index, 4 digits>`` counted from 0 (stable across runs).
        id_prefix: prefix for generated ids (default: the file's stem).

    Raises:
        InputError: the file cannot be decoded, is malformed (an unclosed quote: the error names the
            line) or lacks ``text_column``.
    """
    csv.field_size_limit(sys.maxsize)
    try:
        fh = path.open(encoding="utf-8-sig", newline="")
        reader = csv.DictReader(fh, strict=True)  # strict: an unbalanced quote is an error, not one merged row
        header = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InputError(f"{path}: cannot read CSV: {err}") from None
    with fh:
        if text_column not in header:
            raise InputError(f"{path}: text column {text_column!r} not in header {header}")
        use_ids = id_column is not None and id_column in header
        prefix = id_prefix or path.stem
        try:  # only the reader raises these: the loop body does no CSV or decoding of its own
            for index, row in enumerate(reader):
                doc_id = str(row[id_column]) if use_ids else f"{prefix}-{index:04d}"
                where = f"{path.name}#row{index}"
                if use_ids and not doc_id:
                    doc_id = where
                    yield Document(doc_id, None, "", 0, f"row {index} has an empty `{id_column}`", where), row
                    continue
                yield document_from_text(doc_id, row[text_column] or "", max_doc_bytes, where), row
        except csv.Error as err:
            raise InputError(f"{path}: malformed CSV in the record starting at line {reader.line_num + 1}: {err} "
                             "(an unclosed quote would merge every following row into one document); fix the file") from None
        except UnicodeDecodeError as err:
            raise InputError(f"{path}: cannot read CSV: {err}") from None


def find_duplicate_ids(docs: list[Document]) -> dict[str, list[str]]:
    """Map each id that occurs more than once to the sources of its occurrences."""
    seen: dict[str, list[str]] = defaultdict(list)
    for doc in docs:
        seen[doc.id].append(doc.source or doc.id)
    return {k: v for k, v in seen.items() if len(v) > 1}


def collapse_duplicates(docs: list[Document]) -> list[Document]:
    """One document per id: an id given more than once becomes one rejected document naming all occurrences.

    The first occurrence keeps its place; the reason lists every source and sha256 so nothing is lost.
    """
    dups = find_duplicate_ids(docs)
    out: list[Document] = []
    emitted: set[str] = set()
    for doc in docs:
        if doc.id in emitted:
            continue
        emitted.add(doc.id)
        if doc.id in dups:
            shas = [d.input_sha256[:12] for d in docs if d.id == doc.id]
            reason = (
                f"duplicate id: given {len(dups[doc.id])} times ({', '.join(dups[doc.id])}; "
                f"sha256 {', '.join(shas)}); give each document a unique id"
            )
            out.append(Document(doc.id, None, doc.input_sha256, doc.n_chars, reason, doc.source))
        else:
            out.append(doc)
    return out
