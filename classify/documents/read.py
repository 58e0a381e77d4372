"""Document reading for pilot, batch and serve: one file, one JSONL line or one text field becomes a document
(CSV and Parquet rows: :mod:`batch.corpus.tabular`), with a reason for every reject (the text rules:
:mod:`classify.documents.text`). Walking a folder corpus and cutting a JSONL file into lines are the batch
reader's (:func:`batch.corpus.scan.walk_files`, :mod:`batch.corpus.shard`), which the pilot shares.

Nothing is dropped: an unreadable, empty, invisible-only, binary, non-UTF-8 or oversize
document becomes a :class:`~classify.records.Document` with ``reject_reason`` set. A repeated id is
found by the batch plan, which keeps one rejected row naming every occurrence
(:func:`batch.corpus.plan.fold_duplicates`); the pilot refuses such a set
(:func:`batch.pilot.inputs.pilot_documents`). Mojibake (``Â£``) is valid UTF-8 and stays text.

The same rules hold for pilot, batch and serve, which all read through this module:

* an id is a JSON string or integer; any other JSON type (``true``, ``1.5``, ``null``, a list...)
  is a rejected row named ``<file>#L<line>`` whose reason names the type;
* an id or text holding a lone surrogate (a JSON ``"\\ud83d"`` escape without its pair, or a file
  name that is not UTF-8) cannot be written as UTF-8: the row is rejected, and its id is recorded
  with each surrogate written as the literal text ``\\udXXX`` (:func:`escape_surrogates`), so it
  is stable across runs and safe to write;
* a text with no visible character (:func:`has_visible_char`) is an empty document;
* a UTF-16 or UTF-32 file is named as such with the ``iconv`` command that converts it
  (:func:`wide_encoding`): a CSV or JSONL corpus is refused, a single document rejected.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import msgspec

from classify.documents.text import (
    check_bytes,
    checked_id,
    escape_surrogates,
    surrogate_reason,
)
from classify.records import Document
from classify.runs.files import NotRegularFile, read_regular, special_kind

LABEL_FILES = ("labels.json", "labels.csv")

_JSON_TYPES = {bool: "boolean", float: "number", type(None): "null", list: "array", dict: "object"}


def document_from_bytes(doc_id: str, raw: bytes, max_doc_bytes: int, source: str = "",
                        text: str | None = None) -> Document:
    """Build a :class:`Document` from raw bytes (hashing them, checking them); ``text``: ``raw`` decoded, when
    the caller encoded ``raw`` from it (:func:`classify.documents.text.check_bytes`)."""
    text, reason = check_bytes(raw, max_doc_bytes, text)
    return Document(
        id=doc_id,
        text=text,
        input_sha256=hashlib.sha256(raw).hexdigest(),
        n_chars=len(text) if text is not None else 0,
        reject_reason=reason,
        source=source,
    )


def document_from_text(doc_id: str, text: object, max_doc_bytes: int, source: str = "") -> Document:
    """Build a :class:`Document` from a JSON/CSV/HTTP text field: the one rule for pilot, batch and serve.

    Args:
        doc_id: the id as given (a lone surrogate in it rejects the document: :func:`checked_id`).
        text: the field's value; a non-string or a string with a lone surrogate is rejected with a reason.
        max_doc_bytes: size limit in bytes.
        source: where it came from, for messages.

    Returns:
        The document, rejected (``text=None``, ``reject_reason`` set) when it cannot be classified.
    """
    if not isinstance(text, str):
        kind = _JSON_TYPES.get(type(text), type(text).__name__)
        return checked_id(Document(doc_id, None, "", 0, f"`text` must be a string, got {kind}", source))
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: rejected, hashed as its surrogatepass bytes
        raw = text.encode("utf-8", errors="surrogatepass")
        reason = surrogate_reason("text", text) or "text is not valid Unicode"
        return checked_id(Document(doc_id, None, hashlib.sha256(raw).hexdigest(), 0, reason, source))
    return checked_id(document_from_bytes(doc_id, raw, max_doc_bytes, source, text))


def read_file_document(doc_id: str, path: Path, max_doc_bytes: int) -> Document:
    """Read one file as a document: rejected (never raised) when it is over ``max_doc_bytes``, unreadable or not text.

    Only a regular file is opened (a FIFO, a device, a socket or a folder, or a link to one, is a rejected
    row naming what it is, never opened: :func:`classify.runs.files.open_regular`), and at most
    ``max_doc_bytes + 1`` bytes are read.

    Args:
        doc_id: the document id.
        path: the file.
        max_doc_bytes: size limit in bytes (checked on the file size before reading, and on the bytes read).

    Returns:
        The :class:`Document`; ``source`` is ``str(path)``.
    """
    try:
        st = path.stat()
        kind = special_kind(st.st_mode)
        if kind is not None:  # a FIFO would block the open, /dev/zero never end: refused before any open
            return Document(doc_id, None, "", 0, f"not a regular file: {kind} (only regular files are read as documents)", str(path))
        if st.st_size > max_doc_bytes:
            return Document(doc_id, None, "", 0, f"over size limit: {st.st_size} bytes > classify.max_doc_bytes {max_doc_bytes}", str(path))
        raw = read_regular(path, max_doc_bytes)  # bounded: a file that grew since the stat is over the limit, not read whole
    except NotRegularFile as err:
        return Document(doc_id, None, "", 0, f"{err.strerror} (only regular files are read as documents)", str(path))
    except OSError as err:
        return Document(doc_id, None, "", 0, f"unreadable: {err.strerror or err}", str(path))
    except UnicodeEncodeError:  # a JSONL `path` with a lone surrogate has no file name on disk
        return Document(doc_id, None, "", 0, f"unreadable: path {str(path)!r} holds a lone surrogate", str(path))
    return document_from_bytes(doc_id, raw, max_doc_bytes, str(path))


def _id_type_error(value: object) -> str | None:
    """Why a JSON ``id`` value is not an id (``None`` for a string or an integer; ``bool`` is not an integer here)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    shown = "" if isinstance(value, (list, dict)) or value is None else f" {json.dumps(value)}"
    return f"`id` must be a string or an integer, got {kind}{shown}"


_DECODER = msgspec.json.Decoder()


def _loads(raw: bytes) -> object:
    """``json.loads(raw)``, through msgspec's faster decoder when it accepts the line (it gives the same value
    for a plain record); anything it refuses (lone surrogates, NaN, huge integers, bad JSON) goes to ``json.loads``,
    whose value or error message is the reference."""
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        raw.decode("utf-8-sig", "surrogatepass")  # UnicodeDecodeError for a line that is not UTF-8 (json.loads would guess UTF-16)
        return json.loads(raw)


def _not_utf8_line(name: str, lineno: int, raw_line: bytes) -> tuple[str, str]:
    """``(id, reason)`` of a JSONL line that is not UTF-8: the id the line gives when read with its bad bytes
    escaped (``<name>#L<line>`` without one), the reason naming the first bad byte and the ``iconv`` fix."""
    start = 0
    try:
        raw_line.decode("utf-8", "surrogatepass")  # positions in the line itself (the caller's utf-8-sig skips a mark)
    except UnicodeDecodeError as err:
        start = err.start
    reason = (f"line {lineno} is not valid UTF-8: byte 0x{raw_line[start]:02X} at byte {start} of the line "
              "(the file, or this line, is in another encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)")
    record = _escaped_record(raw_line)
    if record.get("id") not in (None, "") and _id_type_error(record["id"]) is None:
        return escape_surrogates(str(record["id"])), reason
    return f"{name}#L{lineno}", reason


_LEADING_JUNK = re.compile("^[\\udc80-\\udcff\\ufeff]+")
"""Undecodable bytes (surrogate-escaped) and byte-order marks at the start of a line."""


def _escaped_record(raw_line: bytes) -> dict:
    """The JSON object of a line that is not UTF-8, its bad bytes read as lone surrogates (``{}`` if none);
    bad bytes or marks before the object (a stray UTF-16 mark FF FE) are skipped."""
    text = _LEADING_JUNK.sub("", raw_line.decode("utf-8", "surrogateescape"))
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def jsonl_line_fields(raw_line: bytes) -> dict:
    """The fields of one JSONL line whatever its id, for its label: the parsed object, a line that is not
    UTF-8 read with its bad bytes escaped (:func:`classify.documents.text.escape_surrogates` before writing any of
    them), ``{}`` for a line that is not a JSON object.

    Args:
        raw_line: the line's bytes.

    Returns:
        The line's JSON object, or ``{}``.
    """
    try:
        record = _loads(raw_line)
    except UnicodeDecodeError:
        return _escaped_record(raw_line)
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def jsonl_line_id(name: str, lineno: int, raw_line: bytes) -> tuple[str, dict | None, str | None]:
    """The id one JSONL line gives its document, without reading the document (the batch plan pass).

    Args:
        name: the JSONL file's name (escaped: :func:`escape_surrogates`).
        lineno: the line's number, from 1.
        raw_line: the line's bytes (not blank).

    Returns:
        ``(id, record, error)``: ``record`` is the parsed object when the line has a usable id
        (``None`` otherwise) and ``error`` the reject reason of a line without one or not in UTF-8 (``None`` otherwise);
        the id is what :func:`jsonl_line_document` gives the same line (``<name>#L<line>`` when there is no usable id).
    """
    where = f"{name}#L{lineno}"
    try:
        record = _loads(raw_line)
    except UnicodeDecodeError:
        doc_id, reason = _not_utf8_line(name, lineno, raw_line)
        return doc_id, None, reason
    except json.JSONDecodeError as err:
        return where, None, f"line {lineno} is not valid JSON: {err}"
    if not isinstance(record, dict) or "id" not in record or record["id"] == "":
        return where, None, f"line {lineno} has no `id` (string or integer)"
    if (type_error := _id_type_error(record["id"])) is not None:
        return where, None, f"{type_error} (line {lineno})"
    return escape_surrogates(str(record["id"])), record, None


def jsonl_line_document(path: Path, name: str, lineno: int, raw_line: bytes, max_doc_bytes: int) -> tuple[Document, dict]:
    """The ``(document, record)`` of one non-blank JSONL line with ``id`` and ``text`` or ``path``.

    ``path`` is read relative to the JSONL file's folder. A line that is not a JSON object, has
    no ``id``, or whose ``id`` is neither a string nor an integer (``true``, ``1.5``, ``null``, a list
    or an object: the reason names the type) is a rejected document with id ``<file name>#L<line>``
    so it is still accounted for. A line that is not UTF-8 is rejected with a reason naming its first
    bad byte and the ``iconv`` fix; it keeps its id and fields (a label) when it parses with the bad
    bytes escaped (bad bytes before the object skipped). An id with a lone surrogate is escaped and
    rejected (:func:`checked_id`). Blank lines are the caller's to skip; a UTF-16 or UTF-32 file is
    refused before its lines are read (:func:`classify.documents.text.refuse_wide_file`).

    Args:
        path: the JSONL file (a ``path`` field is read relative to its folder).
        name: the file's name, escaped (:func:`escape_surrogates`).
        lineno: the line's number, from 1.
        raw_line: the line's bytes.
        max_doc_bytes: size limit per document in bytes.

    Returns:
        ``(document, record)``; ``record`` is ``{}`` for a line that is not a JSON object; a rejected line's
        fields are given too (:func:`jsonl_line_fields`: its label still counts).
    """
    where = f"{name}#L{lineno}"
    doc_id, record, error = jsonl_line_id(name, lineno, raw_line)
    if record is None:  # rejected; its other fields (a label) still count
        return Document(doc_id, None, hashlib.sha256(raw_line).hexdigest(), 0, error or "", where), jsonl_line_fields(raw_line)
    return checked_id(_jsonl_document(path, str(record["id"]), record, max_doc_bytes, where)), record


def _jsonl_document(path: Path, doc_id: str, record: dict, max_doc_bytes: int, where: str) -> Document:
    if "text" in record:
        return document_from_text(doc_id, record["text"], max_doc_bytes, where)
    if isinstance(record.get("path"), str):
        target = (path.parent / record["path"]).resolve()
        if not target.is_relative_to(path.parent.resolve()):
            reason = f"`path` {record['path']!r} leaves the folder of {path.name} (only relative paths inside it)"
            return Document(doc_id, None, "", 0, reason, where)
        return read_file_document(doc_id, target, max_doc_bytes)
    return Document(doc_id, None, "", 0, "record has neither `text` nor `path`", where)
