"""Tabular corpus readers: CSV (streamed, byte-offset resumable) and Parquet columns, with the text rules of
:mod:`classify.textcheck` applied to every row through :func:`classify.documents.document_from_text`.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from classify.documents import document_from_text
from classify.errors import InputError
from classify.records import Document
from classify.textcheck import escape_surrogates, refuse_wide_file

_NOT_UTF8_HINT = "; the file is not UTF-8: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT"


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

    A row whose bytes are not UTF-8 is a rejected document whose reason names the byte and its offset
    in the file; the rows around it are read as usual.

    Raises:
        InputError: the file is UTF-16 or UTF-32 (the message names the encoding and the ``iconv`` fix),
            its header is not UTF-8, it is malformed (an unclosed quote: the error names the line) or
            it lacks ``text_column``.
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


def _decoded_lines(fh: Any, end: list[int], first: bool, bad: list[tuple[int, UnicodeDecodeError]] | None = None) -> Iterator[str]:
    """Lines of a binary file decoded as UTF-8 (the first one as ``utf-8-sig``); ``end[0]`` follows the byte offset.

    Args:
        fh: the file, opened in binary and positioned at a line start.
        end: ``[byte offset]`` of ``fh``'s position, advanced past each line yielded.
        first: the first line may start with a UTF-8 byte order mark.
        bad: ``None``: a line that is not UTF-8 raises. A list: such a line is decoded with
            ``surrogateescape`` (each bad byte becomes U+DC80..U+DCFF, which valid UTF-8 never gives)
            and ``(its byte offset, the decode error)`` is appended, for the caller to reject its record.

    Raises:
        UnicodeDecodeError: a line is not UTF-8 and ``bad`` is ``None``; its reason names the line's byte offset.
    """
    for raw in fh:
        start = end[0]
        end[0] += len(raw)
        codec = "utf-8-sig" if first else "utf-8"
        try:
            text = raw.decode(codec)
        except UnicodeDecodeError as err:
            err.reason = f"{err.reason} (in the line at byte offset {start} of the file)"
            if bad is None:
                raise
            bad.append((start, err))
            text = raw.decode(codec, errors="surrogateescape")
        yield text
        first = False


def _not_utf8_reason(index: int, bad: list[tuple[int, UnicodeDecodeError]]) -> str:
    """The reject reason of CSV record ``index`` whose lines ``bad`` were not UTF-8."""
    start, err = bad[0]
    byte = err.object[err.start]
    return (f"row {index} is not valid UTF-8: byte 0x{byte:02X} at byte offset {start + err.start} of the file "
            "(the file, or this row, is in another encoding: convert it, e.g. iconv -f <its encoding> -t UTF-8 IN > OUT)")


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
    bad: list[tuple[int, UnicodeDecodeError]] = []  # lines of the record being read that were not UTF-8
    try:
        fh = path.open("rb")
        fh.seek(offset)
        reader = csv.reader(_decoded_lines(fh, end, first=offset == 0, bad=bad), strict=True)
        if from_start:
            header = next(reader, [])
            if bad:  # a header that is not UTF-8: the whole file is suspect, and no column can be found
                raise bad[0][1]
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
                if bad:  # rejected with the byte named; its id (escaped if the bad byte is in it) is kept
                    error = error or _not_utf8_reason(index, bad)
                    bad.clear()
                yield CsvRow(index, escape_surrogates(doc_id), values, end[0], where, error, text_column)
                index += 1
        except csv.Error as err:
            raise InputError(f"{path}: malformed CSV in the record starting at line {good_line + 1}: {err} "
                             "(an unclosed quote would merge every following row into one document); fix the file") from None


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
