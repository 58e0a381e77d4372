"""Tabular corpus readers: CSV (streamed, byte-offset resumable) and Parquet columns, with the text rules of
:mod:`classify.documents.text` applied to every row through :func:`classify.documents.read.document_from_text`.
"""

from __future__ import annotations

import csv
import datetime as dt
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from classify.documents.read import document_from_bytes, document_from_text
from classify.documents.text import checked_id, escape_surrogates, refuse_wide_file, surrogate_reason
from classify.errors import InputError
from classify.records import Document

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
    for row in iter_csv_rows(path, text_column, id_column=id_column, id_prefix=id_prefix):
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

    def __init__(self, index: int, doc_id: str, values: dict, *, end: int, where: str, error: str | None,
                 text_column: str):
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
    *,
    id_column: str | None = "id",
    id_prefix: str | None = None,
    offset: int | None = None,
    first_index: int = 0,
    max_rows: int | None = None,
    header: list[str] | None = None,
) -> Iterator[CsvRow]:
    """Read CSV records with the byte offset after each one, from the start or from a known record.

    Reads the file in binary and decodes line by line, so each record's end offset is known and a
    batch shard can be read again later from its offset alone (:mod:`batch.corpus.plan`).

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
        if not header:
            raise InputError(f"{path}: the file is empty: a CSV corpus starts with a header row naming its text column "
                             f"({text_column!r})")
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
                if len(fields) > width or values[text_column] is None:  # never a silently dropped or missing text
                    error = error or (f"row {index} has {len(fields)} field{'s' * (len(fields) != 1)} where the header has {width} "
                                      f"({', '.join(header)}): an unquoted comma, or a missing `{text_column}`?")
                yield CsvRow(index, escape_surrogates(doc_id), values, end=end[0], where=where, error=error,
                             text_column=text_column)
                index += 1
        except csv.Error as err:
            raise InputError(f"{path}: malformed CSV in the record starting at line {good_line + 1}: {err} "
                             "(an unclosed quote would merge every following row into one document); fix the file") from None


PARQUET_BATCH_ROWS = 2048
"""Rows per Arrow batch when a Parquet corpus is read (plan pass, shards, labels): memory and speed do not depend
on the file's row-group size (a single 200k-row group is read 2048 rows at a time, like small groups)."""


def parquet_columns(path: Path, text_column: str, id_column: str | None) -> tuple[Any, bool]:
    """Open a Parquet corpus for streaming reads and check its columns.

    The file is opened without pre-buffering and with a 1 MiB read buffer
    (:func:`batch.layout.streaming_parquet`'s settings), so reading it batch by batch holds one batch.

    Args:
        path: the Parquet file.
        text_column: the column holding the text.
        id_column: the column holding the id (``None`` or absent: generated ids, as for CSV).

    Returns:
        ``(pyarrow.parquet.ParquetFile, whether the id column is used)``.

    Raises:
        InputError: not a Parquet file (a damaged footer), or no ``text_column``.
    """
    import pyarrow.parquet as pq

    try:
        source = path if isinstance(path, str | Path) else path.open("rb")  # a store object: its streamed file object
        pf = pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError...
        raise InputError(f"{path}: cannot read Parquet: {err}") from None
    names = pf.schema_arrow.names
    if text_column not in names:
        raise InputError(f"{path}: text column {text_column!r} not in the Parquet columns {names}")
    return pf, id_column is not None and id_column in names


def parquet_group_starts(pf: Any) -> list[int]:
    """Row index of the first row of each row group, plus the total row count at the end."""
    starts = [0]
    for g in range(pf.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    return starts


def iter_parquet_batches(pf: Any, path: Path, columns: list[str], first_group: int = 0,
                         batch_rows: int = PARQUET_BATCH_ROWS) -> Iterator[tuple[int, Any]]:
    """``(index of the batch's first row, record batch)`` from row group ``first_group`` to the end, in bounded batches.

    Args:
        pf: the file (:func:`parquet_columns`).
        path: its path, for messages.
        columns: the columns read.
        first_group: the row group to start at.
        batch_rows: rows per batch.

    Raises:
        InputError: a row group cannot be read (a bad page header, a damaged or cut-short column chunk):
            the message names the file and the row group.
    """
    starts = parquet_group_starts(pf)
    row = starts[first_group]
    batches = pf.iter_batches(batch_size=batch_rows, row_groups=list(range(first_group, pf.num_row_groups)),
                              columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid, ArrowException...
            group = _failing_group(pf, columns, starts, row, batch_rows)
            raise InputError(f"{path}: cannot read Parquet row group {group} (rows {starts[group]}..{starts[group + 1] - 1}): "
                             f"{type(err).__name__}: {err}; the file is damaged: write it again from its source") from None
        yield row, batch
        row += batch.num_rows


def _failing_group(pf: Any, columns: list[str], starts: list[int], row: int, batch_rows: int) -> int:
    """The row group a failed batch read stumbled on: a batch may span groups, so each group it covers is
    read alone (only on this error path) until one fails; the first covered group when none does."""
    covered = [g for g in range(pf.num_row_groups) if starts[g + 1] > row and starts[g] < row + batch_rows]
    for g in covered:
        try:
            pf.read_row_group(g, columns=columns, use_threads=False)
        except Exception:  # noqa: BLE001 - pyarrow's errors: this is the damaged group
            return g
    return covered[0] if covered else 0


def _is_string(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def parquet_text_values(column: Any) -> tuple[list[Any], bool]:
    """The values of a text column batch and whether they are the bytes of a string column.

    A string column is read as its bytes (Arrow does not check UTF-8 when it reads Parquet; Python would raise
    on the first bad byte), so an undecodable text is a rejected row (:func:`parquet_document`), not a crash.
    """
    import pyarrow as pa

    if _is_string(column.type):
        return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist(), True
    return column.to_pylist(), False


def parquet_id_values(column: Any) -> list[Any]:
    """The values of an id column batch: a string column's bytes decoded as UTF-8 with bad bytes as lone surrogates
    (the row is then rejected, its id escaped: :func:`classify.documents.text.checked_id`), other types as Arrow gives them."""
    import pyarrow as pa

    if _is_string(column.type):
        raw = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist()
        return [None if v is None else v.decode("utf-8", "surrogateescape") for v in raw]
    return column.to_pylist()


_PY_KINDS = {bytes: "binary", float: "floating point number", bool: "boolean", list: "list", dict: "struct",
             dt.datetime: "timestamp", dt.date: "date", dt.time: "time", dt.timedelta: "duration", Decimal: "decimal"}


def parquet_row_id(value: object, index: int, use_ids: bool, prefix: str, where: str) -> tuple[str, str | None]:
    """The id of Parquet row ``index`` and the reject reason of a row without a usable one (``None`` when it has one).

    The JSONL and CSV id rule: a string or an integer. Any other value (``b'doc-000'``, ``1.0``, ``nan``, ``True``,
    ``[1, 2]``, a timestamp...) is a rejected row with id ``<file>#row<index>`` whose reason names the type.
    """
    if not use_ids:
        return f"{prefix}-{index:04d}", None
    if value is None or value == "":
        return where, f"row {index} has an empty id"
    if isinstance(value, str) and (reason := surrogate_reason("id", value)) is not None:  # bytes that are not UTF-8
        safe = escape_surrogates(value)
        return safe, f"{reason}; recorded as {safe!r}"
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return escape_surrogates(str(value)), None
    kind = _PY_KINDS.get(type(value), type(value).__name__)
    shown = repr(value)
    return where, f"`id` must be a string or an integer, got {kind} {shown[:60]}{'...' if len(shown) > 60 else ''} (row {index})"


def parquet_document(doc_id: str, value: Any, is_bytes: bool, max_doc_bytes: int, where: str) -> Document:
    """The document of one Parquet row's text: a string column's bytes through the text rules of
    :func:`classify.documents.read.document_from_bytes` (invalid UTF-8 is a rejected row naming the byte), any other
    value through :func:`classify.documents.read.document_from_text` (a non-string is a rejected row naming its type)."""
    if is_bytes and value is not None:
        return checked_id(document_from_bytes(doc_id, value, max_doc_bytes, where))
    return document_from_text(doc_id, value, max_doc_bytes, where)
