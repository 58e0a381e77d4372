"""Private corpus scanners for :mod:`batch.corpus.plan`: one streaming pass per format yields each row's id,
size and position (never its text), feeding the content fingerprint; Parquet shards are read back by row range.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from batch.corpus.source import sha256_of
from batch.corpus.tabular import (
    csv_header,
    iter_csv_rows,
    iter_parquet_batches,
    parquet_columns,
    parquet_document,
    parquet_group_starts,
    parquet_id_values,
    parquet_row_id,
    parquet_text_values,
)
from classify.config.batch import CorpusConfig
from classify.documents.read import jsonl_line_id
from classify.documents.text import escape_surrogates, refuse_compressed, refuse_wide_file
from classify.errors import InputError
from classify.records import Document
from classify.runs.files import NotRegularFile, regular_file_sha256


def detect_format(path: Path, fmt: str) -> str:
    """Resolve ``format: auto`` from the path.

    Args:
        path: corpus file or folder.
        fmt: the configured format.

    Returns:
        ``jsonl``, ``csv``, ``parquet`` or ``dir``.

    Raises:
        InputError: a compressed file (``.jsonl.gz``: :func:`classify.documents.text.refuse_compressed`), or ``auto``
            cannot tell the format (the caller, :func:`batch.corpus.plan.locate_corpus`, has
            checked that the path exists).
    """
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "dir"
    suffix = path.suffix.lower()
    if fmt == "auto" and suffix not in (".parquet", ".pq"):
        refuse_compressed(path, b"")  # `.jsonl.gz`, `.csv.bz2`...: named as compressed, not as an unknown suffix
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InputError(
        f"corpus {path}: cannot tell the format from suffix {suffix!r} (allowed: .jsonl, .ndjson, .csv, .parquet, "
        "a folder); set `corpus.format`"
    )


@dataclass
class Row:
    key: int  # line number (JSONL), row index (CSV, Parquet), file index (folder)
    doc_id: str
    size: int
    end: int = 0  # byte offset after the row (JSONL, CSV)
    rel: str = ""  # folder: the file's relative path
    next_key: int | None = None  # the key at ``end`` (JSONL: the next line's number, blank lines counted)


def parquet_ranges(pf: Any, path: Path) -> list[list[int]]:
    """``[start, end)`` byte ranges of each row group's column chunks, then of the footer (metadata + length + magic)."""
    out = []
    for g in range(pf.num_row_groups):
        rg = pf.metadata.row_group(g)
        cols = [rg.column(c) for c in range(rg.num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
                  for c in cols]
        out.append([min(starts), max(st + c.total_compressed_size for st, c in zip(starts, cols, strict=True))])
    size = path.stat().st_size
    out.append([size - 8 - pf.metadata.serialized_size, size])
    return out


def parquet_ranges_sha256(path: Path, ranges: list[list[int]]) -> tuple[str, list[list[Any]]]:
    """sha256 of the whole file and ``[start, end, sha256]`` of each byte range, in one sequential read.

    Ranges that overlap or are out of order are hashed on their own (a second read of those bytes).
    """
    whole = hashlib.sha256()
    out: list[list[Any]] = []
    with path.open("rb") as fh:
        pos = 0
        for start, end in ranges:
            part = hashlib.sha256()
            if start < pos:  # out of order: its own read, the whole-file digest goes on below
                fh.seek(start)
                part.update(fh.read(end - start))
                fh.seek(pos)
                out.append([start, end, part.hexdigest()])
                continue
            while pos < end:
                block = fh.read(min(8 << 20, end - pos))
                if not block:
                    break
                whole.update(block)
                if pos + len(block) > start:
                    part.update(block[max(start - pos, 0):])
                pos += len(block)
            out.append([start, end, part.hexdigest()])
        while block := fh.read(8 << 20):
            whole.update(block)
    return whole.hexdigest(), out


def _check_parquet_range(path: Path, recorded: list[Any], what: str) -> None:
    start, end, want = recorded
    with path.open("rb") as fh:
        fh.seek(start)
        got = hashlib.sha256(fh.read(end - start)).hexdigest()
    if got != want:
        raise InputError(f"corpus {path} changed while the batch ran: {what} (bytes {start}..{end}) no longer holds the "
                         "bytes the plan read; nothing of it was classified. Restore the corpus and rerun the same command "
                         "(complete shards are kept), or start a new batch id for the edited corpus")


class _ParquetCursor:
    """A streaming reader over one Parquet corpus that remembers where it stopped.

    Shards are dispatched in plan order, so the next shard usually starts where the last one ended: the
    cursor goes on from there, one bounded batch at a time, and each row is decoded once whatever the
    row-group size (a shard of a single 200k-row group no longer reads the whole group). A shard before
    the cursor (a retry) starts again at its row group.
    """

    def __init__(self, path: Path, reading: dict[str, Any]):
        self.path, self.reading = path, reading
        self.pf, self.use_ids = parquet_columns(path, reading["text_column"], reading["id_column"])
        self.starts = parquet_group_starts(self.pf)
        self.columns = [reading["text_column"]] + ([reading["id_column"]] if self.use_ids else [])
        self.batches: Iterator[tuple[int, Any]] | None = None
        self.row0 = 0  # index of the first row of the current batch
        self.texts: list[Any] = []
        self.ids: list[Any] = []
        self.is_bytes = False
        self.checked: set[int] = set()
        recorded = reading.get("row_group_sha256")  # absent in plans made before this check existed
        if recorded:
            _check_parquet_range(path, recorded[-1], "its footer")

    def _check_groups(self, start: int, n_rows: int) -> None:
        """Re-hash each row group the rows fall in against the plan, once per group (a corpus edited mid-run)."""
        recorded = self.reading.get("row_group_sha256")
        if not recorded:
            return
        first = max(bisect.bisect_right(self.starts, start) - 1, 0)
        last = max(bisect.bisect_right(self.starts, start + n_rows - 1) - 1, 0)
        for g in range(first, min(last, len(recorded) - 2) + 1):
            if g not in self.checked:
                _check_parquet_range(self.path, recorded[g], f"row group {g}")
                self.checked.add(g)

    def _reset(self, start: int) -> None:
        group = max(bisect.bisect_right(self.starts, start) - 1, 0)
        self.batches = iter_parquet_batches(self.pf, self.path, self.columns, min(group, max(self.pf.num_row_groups - 1, 0)))
        self.row0, self.texts, self.ids = self.starts[group], [], []

    def rows(self, start: int, n_rows: int) -> list[tuple[int, Any, Any]]:
        """``(row index, raw id, raw text)`` for rows ``start .. start + n_rows - 1``."""
        self._check_groups(start, n_rows)
        if self.batches is None or start < self.row0:
            self._reset(start)
        out = []
        for index in range(start, start + n_rows):
            while index >= self.row0 + len(self.texts):
                assert self.batches is not None
                nxt = next(self.batches, None)
                if nxt is None:
                    raise InputError(f"{self.path}: the Parquet file ends before row {index} (the plan counted "
                                     f"{self.starts[-1]} rows); the corpus changed: start a new batch id")
                self.row0, batch = nxt
                self.texts, self.is_bytes = parquet_text_values(batch.column(0))
                self.ids = parquet_id_values(batch.column(1)) if self.use_ids else [None] * batch.num_rows
            k = index - self.row0
            out.append((index, self.ids[k], self.texts[k]))
        return out


_CURSOR_LOCK = threading.Lock()
_CURSOR: dict[tuple[Any, ...], _ParquetCursor] = {}


def parquet_docs(path: Path, reading: dict[str, Any], start: int, n_rows: int,
                  max_doc_bytes: int) -> Iterator[tuple[int, Document]]:
    """``(row index, document)`` of Parquet rows ``start .. start + n_rows - 1`` (one shard), read in bounded batches."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, reading["text_column"], reading["id_column"], reading["id_prefix"])
    with _CURSOR_LOCK:
        cursor = _CURSOR.get(key)
        if cursor is None:
            _CURSOR.clear()  # one corpus at a time: a driver reads one
            cursor = _CURSOR[key] = _ParquetCursor(path, reading)
        rows = cursor.rows(start, n_rows)
        is_bytes, use_ids = cursor.is_bytes, cursor.use_ids
    name = escape_surrogates(path.name)
    for index, raw_id, text in rows:
        where = f"{name}#row{index}"
        doc_id, error = parquet_row_id(raw_id, index, use_ids, reading["id_prefix"], where)
        if error is not None:
            yield index, Document(doc_id, None, "", 0, error, where)
        else:
            yield index, parquet_document(doc_id, text, is_bytes, max_doc_bytes, where)


def jsonl_rows(path: Path, digest: Any, reading: dict[str, Any]) -> Iterator[Row]:
    refuse_wide_file(path)
    name = escape_surrogates(path.name)
    pos = 0
    extra = hashlib.sha256()  # files named by `path` records
    for lineno, raw in enumerate(_lines(path, digest), start=1):
        pos += len(raw)
        if not raw.strip():
            continue
        doc_id = fast_line_id(raw)
        record = None
        if doc_id is None:  # anything unusual: the full reader (its id rules and reasons)
            doc_id, record, _ = jsonl_line_id(name, lineno, raw)
        size = len(raw)
        if record is not None and "text" not in record and isinstance(record.get("path"), str):
            if not isinstance(path, Path):
                raise InputError(f"corpus {path}: line {lineno} is a `path` record; a JSONL corpus in object storage "
                                 "carries each document's `text` (a `path` would name a file on this machine)")
            reading["has_path_records"] = True
            size, sha = _path_record_digest(path, record["path"], size)
            extra.update(f"{lineno}\t{sha}\n".encode())
        yield Row(lineno, doc_id, size, pos, next_key=lineno + 1)
    if reading.get("has_path_records"):
        digest.update(b"\npath records\n" + extra.hexdigest().encode())


def _path_record_digest(jsonl: Path, rel: str, line_bytes: int) -> tuple[int, str]:
    """``(size for the shard plan, what the fingerprint records)`` for a JSONL ``path`` record: its file's size and
    sha256, or ``line_bytes`` and why it is not read.

    A path that leaves the JSONL file's folder is refused here before anything is opened (its row is
    rejected by the reader, :func:`classify.documents.read.jsonl_line_document`), and only a regular file is
    opened (:func:`classify.runs.files.regular_file_sha256`: a FIFO or ``/dev/zero`` is never read).
    """
    try:
        target = (jsonl.parent / rel).resolve()
        if not target.is_relative_to(jsonl.parent.resolve()):
            return line_bytes, "outside the corpus folder"
        return regular_file_sha256(target)
    except NotRegularFile as err:
        return line_bytes, err.strerror
    except (OSError, UnicodeEncodeError, RuntimeError) as err:  # RuntimeError: a symlink loop in resolve()
        return line_bytes, type(err).__name__


CHUNK_BYTES = 8 << 20
"""Bytes read (and hashed) at a time by the JSONL scan."""


def _lines(path: Path, digest: Any) -> Iterator[bytes]:
    """The file's lines (with their ``\\n``), read and fed to ``digest`` in :data:`CHUNK_BYTES` blocks."""
    rest = b""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
    if rest:
        yield rest


class _LineKeys(msgspec.Struct):
    """The keys the plan pass needs from a JSONL line; ``text`` and ``path`` stay undecoded."""

    id: Any = msgspec.UNSET
    text: msgspec.Raw = msgspec.Raw(b"")
    path: msgspec.Raw = msgspec.Raw(b"")


_KEYS = msgspec.json.Decoder(_LineKeys)


def fast_line_id(raw: bytes) -> str | None:
    """The id of a plain JSONL record (an object with a string or integer ``id`` and a ``text``), without
    decoding its text; ``None`` for any other line, which :func:`classify.documents.read.jsonl_line_id` then reads
    (it gives the same id for the lines answered here: ``str(id)`` with lone surrogates escaped)."""
    try:
        keys = _KEYS.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    value = keys.id
    if not keys.text or value == "" or not (type(value) is str or type(value) is int):
        return None
    return escape_surrogates(str(value))


def tabular_fingerprint(file_sha: str) -> str:
    """The corpus fingerprint of a CSV or Parquet file: ``sha256:`` + sha256 of its bytes' sha256 hex.

    The one form of both the planning pass (:func:`csv_rows`, :func:`parquet_rows` feed ``file_sha`` to the
    plan's digest) and the resume's quick check (:func:`batch.corpus.plan.quick_fingerprint`), so a resumed
    CSV or Parquet batch whose file is unchanged reuses its stored plan.

    Args:
        file_sha: sha256 hex of the whole file (:func:`classify.runs.files.file_sha256`).
    """
    return f"sha256:{hashlib.sha256(file_sha.encode()).hexdigest()}"


def csv_rows(path: Path, cfg: CorpusConfig, digest: Any, reading: dict[str, Any]) -> Iterator[Row]:
    header, data_offset = csv_header(path)
    reading.update(header=header, data_offset=data_offset, text_column=cfg.text_column, id_column=cfg.id_column,
                   id_prefix=cfg.id_prefix or path.stem)
    digest.update(sha256_of(path).encode())  # the plan's fingerprint is then tabular_fingerprint(file sha256)
    for row in iter_csv_rows(path, cfg.text_column, id_column=cfg.id_column, id_prefix=reading["id_prefix"]):
        yield Row(row.index, row.doc_id, row.text_bytes or 1, row.end)


def parquet_rows(path: Path, cfg: CorpusConfig, digest: Any, reading: dict[str, Any]) -> Iterator[Row]:
    import pyarrow.compute as pc

    pf, use_ids = parquet_columns(path, cfg.text_column, cfg.id_column)
    reading.update(text_column=cfg.text_column, id_column=cfg.id_column, id_prefix=escape_surrogates(cfg.id_prefix or path.stem))
    file_sha, reading["row_group_sha256"] = parquet_ranges_sha256(path, parquet_ranges(pf, path))
    digest.update(file_sha.encode())  # the plan's fingerprint is then tabular_fingerprint(file_sha)
    name = escape_surrogates(path.name)
    columns = [cfg.text_column] + ([cfg.id_column] if use_ids else [])
    for row0, batch in iter_parquet_batches(pf, path, columns):
        text = batch.column(0)
        sizes = pc.fill_null(pc.binary_length(text), 0).to_pylist() if text.type in _string_types() else [1] * len(text)
        ids = parquet_id_values(batch.column(1)) if use_ids else [None] * len(sizes)
        for index, (size, raw_id) in enumerate(zip(sizes, ids, strict=True), start=row0):
            doc_id, _ = parquet_row_id(raw_id, index, use_ids, reading["id_prefix"], f"{name}#row{index}")
            yield Row(index, doc_id, size or 1)


def _string_types() -> tuple[Any, ...]:
    import pyarrow as pa

    return (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def walk_files(folder: Path) -> Iterator[Path]:
    """Every non-hidden file under ``folder`` in the order of ``sorted(folder.rglob("*"))``, one directory at a time.

    Path order compares path parts, so a depth-first walk with each directory's entries sorted by
    name gives the same order without listing the whole tree first.
    """
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=True):
            if not entry.is_symlink():  # as rglob: a link to a folder is neither walked nor a document
                yield from walk_files(Path(entry.path))
        else:
            yield Path(entry.path)


def dir_rows(folder: Path, digest: Any) -> Iterator[Row]:
    for index, path in enumerate(walk_files(folder)):
        rel = path.relative_to(folder).as_posix()
        try:
            size, sha = regular_file_sha256(path)  # a FIFO or a device is never opened: its row is rejected
        except OSError as err:
            size, sha = 1, f"unreadable {err.strerror}"
        digest.update(f"{rel}\t{sha}\n".encode("utf-8", "surrogateescape"))
        yield Row(index, escape_surrogates(rel), max(size, 1), rel=rel)
