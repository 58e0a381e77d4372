"""Document reading for pilot, batch and serve: folders, JSONL and CSV, with a reason for every reject.

Nothing is dropped: an unreadable, empty, invisible-only, binary, non-UTF-8 or oversize
document becomes a :class:`~classify.records.Document` with ``reject_reason`` set, and a
repeated id is reported by :func:`find_duplicate_ids` (pilot refuses it, batch
rejects the id with a reason naming every occurrence). Mojibake (``Â£``) is valid
UTF-8 and stays text.

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

import csv
import hashlib
import json
import re
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from classify.errors import InputError
from classify.records import Document

CONTROL_SHARE_LIMIT = 0.10
"""Above this share of control characters (other than tab/newline/CR) a text counts as binary."""

_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
"""The control characters counted by :func:`check_text` (below U+0020, except tab, newline and CR)."""

LABEL_FILES = ("labels.json", "labels.csv")

INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Cs", "Zs", "Zl", "Zp"})
"""General categories with no glyph of their own: format, control, surrogate, space, line and paragraph separators."""

DEFAULT_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
"""Default_Ignorable_Code_Point, inclusive ranges, from the Unicode Character Database file
``DerivedCoreProperties.txt`` (https://www.unicode.org/Public/UCD/latest/ucd/DerivedCoreProperties.txt;
the property is defined in UAX #44, https://www.unicode.org/reports/tr44/#Default_Ignorable_Code_Point,
and its rendering in The Unicode Standard, section 5.21 "Ignoring Characters in Processing").
It adds fillers that are letters by category (U+115F, U+1160, U+3164, U+FFA0), variation selectors
(U+180B..U+180D, U+180F, U+FE00..U+FE0F, U+E0100..U+E01EF) and reserved ignorables to the
format characters."""

_NOT_UTF8_HINT = "; the file is not UTF-8: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT"

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (b"\x00\x00\xfe\xff", "UTF-32 BE", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32 LE", "UTF-32"),
    (b"\xfe\xff", "UTF-16 BE", "UTF-16"),
    (b"\xff\xfe", "UTF-16 LE", "UTF-16"),
)


def escape_surrogates(text: str) -> str:
    """``text`` with every lone surrogate written as the literal text ``\\udXXX`` (other text unchanged).

    This is Python's ``backslashreplace`` error handler applied while encoding to UTF-8, so the
    result is always encodable, the same input always gives the same result, and text without
    surrogates comes back unchanged. Two ids that differ only in that one has a surrogate where the
    other has its escape text end up equal and are then rejected as duplicates, never merged silently.

    Args:
        text: any Python string (from JSON, a file name decoded with ``surrogateescape``...).

    Returns:
        A string that encodes as UTF-8, e.g. ``"a\\ud83d"`` (backslash, ``ud83d``) for ``"a\ud83d"``.

    Example:
        >>> escape_surrogates("x\ud83d")
        'x\\\\ud83d'
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def lone_surrogate(text: str) -> tuple[int, int] | None:
    """Where ``text`` first holds a lone surrogate (U+D800..U+DFFF), which UTF-8 cannot encode.

    Returns:
        ``(index, code point)`` of the first one, or ``None`` when ``text`` encodes as UTF-8.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start, ord(text[err.start])
    return None


def _surrogate_reason(what: str, text: str) -> str | None:
    found = lone_surrogate(text)
    if found is None:
        return None
    index, cp = found
    return (f"{what} is not valid Unicode: lone surrogate U+{cp:04X} at character {index} (half of a UTF-16 pair, "
            "e.g. a JSON \\u escape without its partner); write whole characters as UTF-8")


def has_visible_char(text: str) -> bool:
    """Whether ``text`` holds at least one character that is drawn.

    Invisible are the general categories Cf, Cc, Cs, Zs, Zl and Zp (:data:`INVISIBLE_CATEGORIES`)
    and the Default_Ignorable_Code_Point set (:data:`DEFAULT_IGNORABLE_RANGES`, from the Unicode
    Character Database's ``DerivedCoreProperties.txt``). Right-to-left letters, emoji (even in
    sequences joined by U+200D or styled by U+FE0F) and combining marks on a base are visible.

    Args:
        text: decoded text.

    Returns:
        ``True`` when one character is neither in those categories nor default-ignorable.
    """
    for ch in text:
        cp = ord(ch)
        if unicodedata.category(ch) in INVISIBLE_CATEGORIES:
            continue
        if any(lo <= cp <= hi for lo, hi in DEFAULT_IGNORABLE_RANGES):
            continue
        return True
    return False


def wide_encoding(head: bytes) -> tuple[str, str] | None:
    """Recognise UTF-16 or UTF-32 from a file's first bytes (its byte-order mark, or UTF-16 without one).

    Args:
        head: the first 4 bytes (or more) of the file.

    Returns:
        ``(description, iconv source encoding)``, e.g. ``("UTF-16 LE (byte-order mark FF FE)", "UTF-16")``;
        ``None`` when the bytes do not look like UTF-16 or UTF-32. Without a byte-order mark only UTF-16
        whose first two characters are ASCII is recognised (a zero byte beside each ASCII byte).
    """
    for bom, name, iconv in _BOMS:
        if head.startswith(bom):
            return f"{name} (byte-order mark {bom.hex(' ').upper()})", iconv
    if len(head) >= 4 and head[0] and head[2] and not head[1] and not head[3] and head[0] < 0x80 and head[2] < 0x80:
        return "UTF-16 LE without a byte-order mark", "UTF-16LE"
    if len(head) >= 4 and head[1] and head[3] and not head[0] and not head[2] and head[1] < 0x80 and head[3] < 0x80:
        return "UTF-16 BE without a byte-order mark", "UTF-16BE"
    return None


def refuse_wide_file(path: Path) -> None:
    """Refuse a UTF-16/UTF-32 input file by name, with the command that converts it to UTF-8.

    Args:
        path: a CSV, JSONL or labels file about to be read as UTF-8.

    Raises:
        InputError: the file starts like UTF-16 or UTF-32 (:func:`wide_encoding`), e.g.
            ``c.csv is UTF-16 LE (byte-order mark FF FE), not UTF-8; convert it: iconv -f UTF-16 -t UTF-8 ...``.
    """
    try:
        with path.open("rb") as fh:
            found = wide_encoding(fh.read(4))
    except OSError:
        return  # the reader that follows reports the OS error in its own words
    if found is not None:
        name, iconv = found
        converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
        raise InputError(f"{path} is {name}, not UTF-8; convert it: iconv -f {iconv} -t UTF-8 {path} > {converted}")


def checked_id(doc: Document) -> Document:
    """``doc`` with an id (and source) that can be written as UTF-8; a lone surrogate in the id rejects it.

    Args:
        doc: a document as a reader built it, with the id given by the input.

    Returns:
        ``doc`` itself when its id and source encode as UTF-8; otherwise a rejected document whose
        id and source are :func:`escape_surrogates` of the given ones and whose reason says why
        (keeping any earlier reason after it).
    """
    reason = _surrogate_reason("id", doc.id)
    source = escape_surrogates(doc.source)
    if reason is None:
        return doc if source == doc.source else Document(doc.id, doc.text, doc.input_sha256, doc.n_chars, doc.reject_reason, source)
    safe = escape_surrogates(doc.id)
    reason += f"; recorded as {safe!r}"
    if doc.reject_reason:
        reason += f"; the document is also rejected: {doc.reject_reason}"
    return Document(safe, None, doc.input_sha256, 0, reason, source)


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
    if (wide := wide_encoding(raw[:4])) is not None:
        return None, f"not UTF-8: the document is {wide[0]}; convert it: iconv -f {wide[1]} -t UTF-8"
    if b"\x00" in raw:
        return None, "binary content: contains NUL bytes (not a text document)"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return None, f"not valid UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start} (re-encode the file as UTF-8)"
    return check_text(text)


def check_text(text: str) -> tuple[str | None, str | None]:
    """Check decoded text: empty, mostly control characters, or with no visible character is rejected.

    Args:
        text: decoded text (see :func:`check_bytes` for the bytes).

    Returns:
        ``(text, None)`` for a usable document, ``(None, reason)`` otherwise; a text of only
        zero-width, format or filler characters (:func:`has_visible_char`) is an empty document.
    """
    if not text.strip():
        return None, "empty document: only whitespace"
    control = len(_CONTROL_RE.findall(text))
    if control / len(text) > CONTROL_SHARE_LIMIT:
        return None, f"binary content: {100 * control / len(text):.0f}% control characters"
    if not has_visible_char(text):
        shown = ", ".join(f"U+{ord(ch):04X}" for ch in dict.fromkeys(text[:200]))
        return None, f"empty document: no visible character ({len(text)} invisible characters: {shown[:120]})"
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
    raw = text.encode("utf-8", errors="surrogatepass")
    reason = _surrogate_reason("text", text)
    if reason is not None:
        return checked_id(Document(doc_id, None, hashlib.sha256(raw).hexdigest(), 0, reason, source))
    return checked_id(document_from_bytes(doc_id, raw, max_doc_bytes, source))


def _read_file(doc_id: str, path: Path, max_doc_bytes: int) -> Document:
    try:
        size = path.stat().st_size
        if size > max_doc_bytes:
            return Document(doc_id, None, "", 0, f"over size limit: {size} bytes > classify.max_doc_bytes {max_doc_bytes}", str(path))
        raw = path.read_bytes()
    except OSError as err:
        return Document(doc_id, None, "", 0, f"unreadable: {err.strerror or err}", str(path))
    except UnicodeEncodeError:  # a JSONL `path` with a lone surrogate has no file name on disk
        return Document(doc_id, None, "", 0, f"unreadable: path {str(path)!r} holds a lone surrogate", str(path))
    return document_from_bytes(doc_id, raw, max_doc_bytes, str(path))


def iter_directory(folder: Path, max_doc_bytes: int, exclude: tuple[str, ...] = LABEL_FILES) -> Iterator[Document]:
    """Yield one document per file under ``folder`` (recursive, sorted); id = relative POSIX path.

    Hidden files (``.name``) and top-level label files are skipped. A file name that is not UTF-8
    (decoded by the OS with lone surrogates) gives an escaped id and a rejected row (:func:`checked_id`).
    """
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or path.is_dir():
            continue
        if len(rel.parts) == 1 and rel.name in exclude:
            continue
        yield checked_id(_read_file(rel.as_posix(), path, max_doc_bytes))


_JSON_TYPES = {bool: "boolean", float: "number", type(None): "null", list: "array", dict: "object"}


def _id_type_error(value: object) -> str | None:
    """Why a JSON ``id`` value is not an id (``None`` for a string or an integer; ``bool`` is not an integer here)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    shown = "" if isinstance(value, (list, dict)) or value is None else f" {json.dumps(value)}"
    return f"`id` must be a string or an integer, got {kind}{shown}"


def iter_jsonl(path: Path, max_doc_bytes: int) -> Iterator[tuple[Document, dict]]:
    """Yield ``(document, record)`` per line of a JSONL file with ``id`` and ``text`` or ``path``.

    ``path`` is read relative to the JSONL file's folder. A line that is not a JSON object, has
    no ``id``, or whose ``id`` is neither a string nor an integer (``true``, ``1.5``, ``null``, a list
    or an object: the reason names the type) is yielded as a rejected document with id
    ``<file name>#L<line>`` so it is still accounted for. An id with a lone surrogate is escaped
    and rejected (:func:`checked_id`). Blank lines are skipped.

    Args:
        path: the JSONL file (UTF-8).
        max_doc_bytes: size limit per document in bytes.

    Yields:
        ``(document, record)``; ``record`` is ``{}`` for a line that is not a JSON object or has no id.

    Raises:
        InputError: the file is UTF-16 or UTF-32 (the message names the encoding and the ``iconv`` fix).
    """
    refuse_wide_file(path)
    name = escape_surrogates(path.name)
    with path.open("rb") as fh:
        for lineno, raw_line in enumerate(fh, start=1):
            if raw_line.strip():
                yield jsonl_line_document(path, name, lineno, raw_line, max_doc_bytes)


def jsonl_line_id(name: str, lineno: int, raw_line: bytes) -> tuple[str, dict | None, str | None]:
    """The id one JSONL line gives its document, without reading the document (the batch plan pass).

    Args:
        name: the JSONL file's name (escaped: :func:`escape_surrogates`).
        lineno: the line's number, from 1.
        raw_line: the line's bytes (not blank).

    Returns:
        ``(id, record, error)``: ``record`` is the parsed object when the line has a usable id
        (``None`` otherwise) and ``error`` the reject reason of a line without one (``None`` otherwise);
        the id is what :func:`iter_jsonl` gives the same line (``<name>#L<line>`` when there is no usable id).
    """
    where = f"{name}#L{lineno}"
    try:
        record = json.loads(raw_line)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return where, None, f"line {lineno} is not valid JSON: {err}"
    if not isinstance(record, dict) or "id" not in record or record["id"] == "":
        return where, None, f"line {lineno} has no `id` (string or integer)"
    if (type_error := _id_type_error(record["id"])) is not None:
        return where, None, f"{type_error} (line {lineno})"
    return escape_surrogates(str(record["id"])), record, None


def jsonl_line_document(path: Path, name: str, lineno: int, raw_line: bytes, max_doc_bytes: int) -> tuple[Document, dict]:
    """The ``(document, record)`` of one non-blank JSONL line (see :func:`iter_jsonl` for the rules).

    Args:
        path: the JSONL file (a ``path`` field is read relative to its folder).
        name: the file's name, escaped (:func:`escape_surrogates`).
        lineno: the line's number, from 1.
        raw_line: the line's bytes.
        max_doc_bytes: size limit per document in bytes.

    Returns:
        ``(document, record)``; ``record`` is ``{}`` for a line that is not a JSON object or has no id.
    """
    where = f"{name}#L{lineno}"
    doc_id, record, error = jsonl_line_id(name, lineno, raw_line)
    if record is None:
        parsed: dict = {}
        if error and error.startswith("`id` must be"):  # a JSON object whose id has the wrong type
            parsed = json.loads(raw_line)
        return Document(where, None, hashlib.sha256(raw_line).hexdigest(), 0, error or "", where), parsed
    return checked_id(_jsonl_document(path, str(record["id"]), record, max_doc_bytes, where)), record


def _jsonl_document(path: Path, doc_id: str, record: dict, max_doc_bytes: int, where: str) -> Document:
    if "text" in record:
        return document_from_text(doc_id, record["text"], max_doc_bytes, where)
    if isinstance(record.get("path"), str):
        target = (path.parent / record["path"]).resolve()
        if not target.is_relative_to(path.parent.resolve()):
            reason = f"`path` {record['path']!r} leaves the folder of {path.name} (only relative paths inside it)"
            return Document(doc_id, None, "", 0, reason, where)
        return _read_file(doc_id, target, max_doc_bytes)
    return Document(doc_id, None, "", 0, "record has neither `text` nor `path`", where)


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
        InputError: the file is UTF-16 or UTF-32 (the message names the encoding and the ``iconv`` fix),
            cannot be decoded, is malformed (an unclosed quote: the error names the line) or lacks
            ``text_column``.
    """
    for row in iter_csv_rows(path, text_column, id_column, id_prefix):
        yield csv_row_document(row, max_doc_bytes), row.values


class CsvRow:
    """One CSV record as :func:`iter_csv_rows` reads it (no document built yet).

    Attributes:
        index: the data row's index, from 0 (the header is not a row; blank lines are skipped).
        doc_id: the id the row's document gets (generated, from the id column, or ``<file>#row<index>``).
        values: ``{column: value}`` as :class:`csv.DictReader` gives it (a missing value is ``None``).
        end: byte offset just after the record in the file (where the next record starts).
        where: ``<file name>#row<index>``.
        error: the reject reason of a row whose id column is empty, else ``None``.
        text_column: the column holding the text.
    """

    __slots__ = ("index", "doc_id", "values", "end", "where", "error", "text_column")

    def __init__(self, index: int, doc_id: str, values: dict, end: int, where: str, error: str | None, text_column: str):
        self.index, self.doc_id, self.values, self.end = index, doc_id, values, end
        self.where, self.error, self.text_column = where, error, text_column

    @property
    def text_bytes(self) -> int:
        """Length of the text value in UTF-8 bytes (0 when missing); used to size shards."""
        value = self.values.get(self.text_column)
        return len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else 0


def csv_row_document(row: CsvRow, max_doc_bytes: int) -> Document:
    """The document of one CSV record (the rules of :func:`iter_csv`)."""
    if row.error is not None:
        return Document(row.doc_id, None, "", 0, row.error, row.where)
    return document_from_text(row.doc_id, row.values[row.text_column] or "", max_doc_bytes, row.where)


def csv_header(path: Path) -> tuple[list[str], int]:
    """The header of a CSV file and the byte offset where its first data record starts.

    Raises:
        InputError: a UTF-16/UTF-32 file, bytes that are not UTF-8, or a malformed header.
    """
    csv.field_size_limit(sys.maxsize)
    refuse_wide_file(path)
    try:
        with path.open("rb") as fh:
            end = [0]
            reader = csv.reader(_decoded_lines(fh, end, first=True), strict=True)
            header = next(reader, [])
            return header, end[0]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InputError(f"{path}: cannot read CSV: {err}{_NOT_UTF8_HINT if isinstance(err, UnicodeDecodeError) else ''}") from None


def _decoded_lines(fh: Any, end: list[int], first: bool) -> Iterator[str]:
    """Lines of a binary file decoded as UTF-8 (the first one as ``utf-8-sig``); ``end[0]`` follows the byte offset."""
    for raw in fh:
        end[0] += len(raw)
        yield raw.decode("utf-8-sig" if first else "utf-8")
        first = False


def iter_csv_rows(
    path: Path,
    text_column: str = "text",
    id_column: str | None = "id",
    id_prefix: str | None = None,
    offset: int | None = None,
    first_index: int = 0,
    max_rows: int | None = None,
    header: list[str] | None = None,
) -> Iterator[CsvRow]:
    """Read CSV records with the byte offset after each one, from the start or from a known record.

    Reads the file in binary and decodes line by line, so each record's end offset is known and a
    batch shard can be read again later from its offset alone (:mod:`batch.corpus`).

    Args:
        path: the CSV file (UTF-8, header row).
        text_column: column holding the text.
        id_column: column holding the id (``None`` or absent from the header: generated ids).
        id_prefix: prefix for generated ids (default: the file's stem).
        offset: byte offset of the first record to read (``None``: the first data record).
        first_index: the row index of the record at ``offset``.
        max_rows: stop after this many records (``None``: to the end).
        header: the header when it is already known (with ``offset``).

    Yields:
        :class:`CsvRow` per record, blank lines skipped.

    Raises:
        InputError: as :func:`iter_csv`.
    """
    csv.field_size_limit(sys.maxsize)
    from_start = header is None or offset is None
    if from_start:
        refuse_wide_file(path)
        offset = 0
    end = [offset]
    try:
        fh = path.open("rb")
        fh.seek(offset)
        reader = csv.reader(_decoded_lines(fh, end, first=offset == 0), strict=True)
        if from_start:
            header = next(reader, [])
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InputError(f"{path}: cannot read CSV: {err}{_NOT_UTF8_HINT if isinstance(err, UnicodeDecodeError) else ''}") from None
    assert header is not None
    with fh:
        if text_column not in header:
            raise InputError(f"{path}: text column {text_column!r} not in header {header}")
        use_ids = id_column is not None and id_column in header
        prefix = escape_surrogates(id_prefix or path.stem)
        name = escape_surrogates(path.name)
        width = len(header)
        index = first_index
        good_line = reader.line_num  # lines of the records read whole so far (relative to ``offset``)
        try:  # only the reader raises these: the loop body does no CSV or decoding of its own
            for fields in reader:
                good_line = reader.line_num
                if max_rows is not None and index - first_index >= max_rows:
                    return
                if not fields:
                    continue  # a blank line, as csv.DictReader skips it
                values = dict(zip(header, fields, strict=False))
                if len(fields) < width:
                    values.update((key, None) for key in header[len(fields):])
                elif len(fields) > width:
                    values[None] = fields[width:]  # type: ignore[index]  # DictReader's restkey
                where = f"{name}#row{index}"
                error = None
                if use_ids:
                    doc_id = str(values[id_column])
                    if not doc_id or values[id_column] is None:
                        doc_id, error = where, f"row {index} has an empty `{id_column}`"
                else:
                    doc_id = f"{prefix}-{index:04d}"
                yield CsvRow(index, escape_surrogates(doc_id), values, end[0], where, error, text_column)
                index += 1
        except csv.Error as err:
            raise InputError(f"{path}: malformed CSV in the record starting at line {good_line + 1}: {err} "
                             "(an unclosed quote would merge every following row into one document); fix the file") from None
        except UnicodeDecodeError as err:
            raise InputError(f"{path}: cannot read CSV: {err}{_NOT_UTF8_HINT}") from None


def parquet_columns(path: Path, text_column: str, id_column: str | None) -> tuple[Any, bool]:
    """Open a Parquet corpus and check its columns.

    Args:
        path: the Parquet file.
        text_column: the column holding the text.
        id_column: the column holding the id (``None`` or absent: generated ids, as for CSV).

    Returns:
        ``(pyarrow.parquet.ParquetFile, whether the id column is used)``.

    Raises:
        InputError: not a Parquet file, or no ``text_column``.
    """
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError...
        raise InputError(f"{path}: cannot read Parquet: {err}") from None
    names = pf.schema_arrow.names
    if text_column not in names:
        raise InputError(f"{path}: text column {text_column!r} not in the Parquet columns {names}")
    return pf, id_column is not None and id_column in names


def parquet_row_id(value: object, index: int, use_ids: bool, prefix: str, where: str) -> tuple[str, str | None]:
    """The id of Parquet row ``index`` and the reject reason of a row without one (``None`` when it has one)."""
    if not use_ids:
        return f"{prefix}-{index:04d}", None
    if value is None or value == "":
        return where, f"row {index} has an empty id"
    return escape_surrogates(str(value)), None


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
