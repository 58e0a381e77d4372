"""The one columnar pass over result rows: shard files parsed by Arrow, counted with Arrow kernels, compared as tables.

A shard file (or a slice of ``results.jsonl``) is parsed whole by ``pyarrow.json.read_json`` with the
results schema (:func:`read_rows`); a file Arrow's reader refuses as it is (a blank line, a missing last
newline, a field of another type, an unknown field, a row without ``id``) is normalized line by line
into the same table, or refused naming the line. The merge (:func:`batch.run.merge.merge_results`), the
accounting (:meth:`batch.run.merge.Tally.add_table`), the quality report
(:meth:`batch.report.quality.QualityTally.add_table`) and the export re-check
(:func:`batch.run.export.check_export_rows`) all take these tables: there is no second, per-row path.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from batch.layout import RESULT_COLUMNS
from classify.errors import VerificationError
from classify.records import Result

REVIEW_COLUMN = ("review", "bool_")
"""The extra ``results.parquet`` column of a batch with ``classify.review_below_score`` (null on rejected rows)."""


def has_review(manifest: Any) -> bool:
    """Whether a batch's rows carry ``review`` (its config sets ``classify.review_below_score``)."""
    return (manifest.config.get("classify") or {}).get("review_below_score") is not None


def results_schema(review: bool = False) -> Any:
    """The Arrow schema of result rows (``results.parquet``'s columns), with ``review`` when the batch sets it."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in (*RESULT_COLUMNS, *([REVIEW_COLUMN] if review else []))])


def _arrow_table(body: bytes, schema: Any) -> Any | None:
    """``body`` parsed by Arrow's JSON reader as it is, or ``None`` when the reader or the schema refuses it."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not body.endswith(b"\n") or not body.startswith(b"{"):
        return None  # pyarrow 26's reader crashes the process (SIGSEGV) on a body whose first value is ``null``
    try:
        table = pj.read_json(pa.BufferReader(body),
                             read_options=pj.ReadOptions(block_size=max(1 << 20, len(body) + 1)),
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != body.count(b"\n") or table.schema.names != schema.names:
        return None
    if any(table.column(name).null_count for name in ("id", "status", "n_chars", "n_tokens")):
        return None
    try:
        table.validate(full=True)  # the reader copies a string's bytes unchecked: one not UTF-8 is read line by line
    except pa.ArrowInvalid:
        return None
    return table.combine_chunks()


def read_rows(body: bytes, review: bool, name: str = "<rows>", first_line: int = 1) -> tuple[bytes, Any]:
    """The result rows of a shard file's (or a ``results.jsonl`` slice's) bytes, as JSON lines and as a table.

    Arrow parses the bytes whole when they are clean lines of the schema (the batch's own files always
    are). Otherwise each non-blank line is read as :meth:`classify.records.Result.from_json` does (a bad
    record kept as read, unknown fields dropped, so the accounting check names what is wrong) and the
    table built from those rows; the lines are the non-blank lines, each ending in a newline.

    Args:
        body: the file's bytes (lines split on ``\\n`` only).
        review: the batch has ``classify.review_below_score`` (rows may carry ``review``).
        name: the file, for messages.
        first_line: the file's line number of ``body``'s first line (a slice of a longer file), for messages.

    Returns:
        ``(lines, table)``: the bytes to copy into ``results.jsonl`` (``body`` itself when clean) and a
        ``pyarrow.Table`` of :func:`results_schema`'s columns, one row per line.

    Raises:
        VerificationError: ``"{name}:{n}: not valid JSON: ..."`` for a line that is not JSON, or
            ``"{name}:{n}: not a result row: ..."`` for a field whose value does not fit its column.
    """
    import pyarrow as pa

    schema = results_schema(review)
    table = _arrow_table(body, schema)
    if table is not None:
        return body, table
    lines, rows = [], []
    for n, line in enumerate(body.split(b"\n"), start=first_line):
        if not line.strip():
            continue
        try:
            row = Result.from_json(line)
        except json.JSONDecodeError as err:
            raise VerificationError(f"{name}:{n}: not valid JSON: {err}") from None
        values = {field: getattr(row, field, None) for field in schema.names}
        try:
            pa.Table.from_pylist([values], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError) as err:  # a lone surrogate
            raise VerificationError(f"{name}:{n}: not a result row: {err}") from None
        lines.append(line + b"\n")
        rows.append(values)
    return b"".join(lines), pa.Table.from_pylist(rows, schema=schema)


READ_AHEAD = 4
"""Shard files read and parsed ahead of the one being counted (:func:`parsed_shards`)."""


def parsed_shards(paths: Iterable[Path], review: bool) -> Iterator[tuple[bytes, Any] | Exception]:
    """Each shard file's :func:`read_rows` ``(lines, table)``, in order, or the ``OSError`` /
    :class:`VerificationError` that reading it raised.

    Up to :data:`READ_AHEAD` files are read and parsed ahead on two threads (Arrow's JSON reader releases
    the GIL), so a second core parses while the caller counts and writes; memory holds those few shards.

    Args:
        paths: the shard files, in plan order.
        review: the batch has ``classify.review_below_score`` (:func:`read_rows`).
    """
    from concurrent.futures import ThreadPoolExecutor

    def load(path: Path) -> tuple[bytes, Any] | Exception:
        try:
            return read_rows(path.read_bytes(), review, str(path))
        except (OSError, VerificationError) as err:
            return err

    todo = iter(paths)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="docpilot-shard-read") as pool:
        ahead = deque(pool.submit(load, p) for _, p in zip(range(READ_AHEAD), todo, strict=False))
        while ahead:
            done = ahead.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(pool.submit(load, nxt))
            yield done.result()


def first_difference(a: Any, b: Any) -> int | None:
    """The first row at which two tables of the same schema differ (nulls equal nulls), or ``None``.

    Args:
        a, b: ``pyarrow.Table`` s; rows past the shorter one count as different.
    """
    if a.num_rows == b.num_rows and a.equals(b):
        return None
    n = min(a.num_rows, b.num_rows)
    lo, hi = 0, n  # the first differing row lies in [lo, hi]: halve the slices compared
    while lo < hi:
        mid = (lo + hi) // 2
        if a.slice(lo, mid + 1 - lo).equals(b.slice(lo, mid + 1 - lo)):
            lo = mid + 1
        else:
            hi = mid
    return lo


class RowMatcher:
    """Follows a Parquet file's record batches and compares them with tables of the same rows, one at a time,
    in bounded memory (one Parquet batch and one table).

    Args:
        parquet_batches: the file's record batches, in order.
    """

    def __init__(self, parquet_batches: Iterator[Any]):
        self.batches = parquet_batches
        self.pending: list[Any] = []
        self.have = 0
        self.row = 0

    def take(self, table: Any) -> tuple[int, dict[str, Any] | None] | None:
        """Compare the next ``table.num_rows`` rows of the file with ``table``.

        Returns:
            ``None`` when equal, else ``(row of table, the file's row there or None past its end)``.
        """
        import pyarrow as pa

        while self.have < table.num_rows:
            batch = next(self.batches, None)
            if batch is None:
                break
            self.pending.append(batch)
            self.have += batch.num_rows
        got = pa.Table.from_batches(self.pending).combine_chunks() if self.pending else table.slice(0, 0)
        mine = got.slice(0, table.num_rows)
        at = first_difference(mine, table)
        if at is not None:
            return at, (mine.slice(at, 1).to_pylist()[0] if at < mine.num_rows else None)
        rest = got.slice(table.num_rows)
        self.pending, self.have = ([*rest.to_batches()] if rest.num_rows else []), rest.num_rows
        self.row += table.num_rows
        return None

    def finish(self) -> bool:
        """Whether the file holds no row past those compared."""
        return not self.have and next(self.batches, None) is None
