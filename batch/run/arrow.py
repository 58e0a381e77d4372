"""The columnar fast path of the merge and of the export re-check (Arrow's C++ JSON reader, no per-row Python).

A shard file is parsed whole by ``pyarrow.json.read_json`` with the results schema; its rows are
counted with Arrow compute kernels into the same :class:`classify.accounting.Ledger` counts the
per-row reader gives, and the table goes to ``results.parquet`` as it is. Whenever a shard does
not fit the fast path (a line that is not a clean result row of the schema, a blank line, a row
the accounting check would flag), :func:`shard_table` or :func:`tally_table` says so and the
caller takes the per-row path, which names the problem exactly as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from batch.layout import RESULT_COLUMNS

REVIEW_COLUMN = ("review", "bool_")
"""The extra ``results.parquet`` column of a batch with ``classify.review_below_score`` (null on rejected rows)."""


def has_review(manifest: Any) -> bool:
    """Whether a batch's rows carry ``review`` (its config sets ``classify.review_below_score``)."""
    return (manifest.config.get("classify") or {}).get("review_below_score") is not None


def results_schema(review: bool = False) -> Any:
    """The Arrow schema of result rows (``results.parquet``'s columns), with ``review`` when the batch sets it."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in (*RESULT_COLUMNS, *([REVIEW_COLUMN] if review else []))])


def shard_table(body: bytes, review: bool) -> Any | None:
    """Parse a shard file's bytes into an Arrow table of results, or ``None`` when the fast path does not apply.

    ``None``: a line that is not JSON or not an object of the schema's fields and types, an unknown
    field, a blank line, a missing last newline, or a null ``id``/``status``/``n_chars``/``n_tokens``.

    Args:
        body: the file's bytes.
        review: the batch has ``classify.review_below_score`` (rows may carry ``review``).

    Returns:
        A ``pyarrow.Table`` with :func:`results_schema`'s columns, one row per line, or ``None``.
    """
    import pyarrow as pa
    import pyarrow.json as pj

    if not body.endswith(b"\n"):
        return None
    schema = results_schema(review)
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
    return table.combine_chunks()


READ_AHEAD = 4
"""Shard files read and parsed ahead of the one being counted (:func:`parsed_shards`)."""


def parsed_shards(paths: Iterable[Path], review: bool) -> Iterator[tuple[bytes | None, Any | None, OSError | None]]:
    """Each shard file's ``(bytes, shard_table(bytes) or None, None)``, in order; ``(None, None, error)`` when it
    cannot be read.

    Up to :data:`READ_AHEAD` files are read and parsed ahead on two threads (Arrow's JSON reader releases
    the GIL), so a second core parses while the caller counts and writes; memory holds those few shards.

    Args:
        paths: the shard files, in plan order.
        review: the batch has ``classify.review_below_score`` (:func:`shard_table`).
    """
    from concurrent.futures import ThreadPoolExecutor

    def load(path: Path) -> tuple[bytes | None, Any | None, OSError | None]:
        try:
            body = path.read_bytes()
        except OSError as err:
            return None, None, err
        return body, shard_table(body, review), None

    todo = iter(paths)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="docpilot-shard-read") as pool:
        ahead = deque(pool.submit(load, p) for _, p in zip(range(READ_AHEAD), todo, strict=False))
        while ahead:
            done = ahead.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(pool.submit(load, nxt))
            yield done.result()


def tally_table(tally: Any, table: Any) -> list[str] | None:
    """Count a shard table into ``tally`` (a :class:`batch.run.merge.Tally`) as ``tally.add`` would, row by row.

    Returns:
        The table's ids (for the plan's ``ids_sha256``), or ``None``, counting nothing, when a row would be
        a problem for the accounting check (a status other than accepted/rejected, an accepted category
        outside the allowed ones, a rejection without a reason): the caller then counts row by row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    status, category, reason = table.column("status"), table.column("category"), table.column("reason")
    accepted, rejected = pc.equal(status, "accepted"), pc.equal(status, "rejected")
    allowed = pa.array(tally.categories, pa.string())
    n_acc, n_rej = pc.sum(accepted).as_py() or 0, pc.sum(rejected).as_py() or 0
    if n_acc + n_rej != table.num_rows:
        return None
    acc_cats = pc.filter(category, accepted)
    if acc_cats.null_count or (len(acc_cats) and not pc.all(pc.is_in(acc_cats, value_set=allowed)).as_py()):
        return None
    rej_reasons = pc.filter(reason, rejected)
    if rej_reasons.null_count or (len(rej_reasons) and pc.any(pc.equal(rej_reasons, "")).as_py()):
        return None
    ids = table.column("id").to_pylist()
    tally.ids.add_many(ids, tally.total)
    tally.total += table.num_rows
    tally.accepted += n_acc
    tally.rejected += n_rej
    for item in pc.value_counts(acc_cats).to_pylist():  # first-seen order, as Counter updates keep
        tally.per_category[item["values"]] += item["counts"]
    for item in pc.value_counts(category.drop_null()).to_pylist():
        if item["values"] in tally.by_category:
            tally.by_category[item["values"]] += item["counts"]
    for text in rej_reasons.to_pylist():
        tally.reasons[text.split(":")[0]] += 1
    tally.n_tokens += pc.sum(table.column("n_tokens")).as_py() or 0
    return ids


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

    def take(self, table: Any) -> str | None:
        """Compare the next ``table.num_rows`` rows of the file with ``table``: ``None`` when equal, else what differs."""
        import pyarrow as pa

        while self.have < table.num_rows:
            batch = next(self.batches, None)
            if batch is None:
                return f"the Parquet file ends before row {self.row + table.num_rows}"
            self.pending.append(batch)
            self.have += batch.num_rows
        got = pa.Table.from_batches(self.pending).combine_chunks()
        if not got.slice(0, table.num_rows).equals(table):
            return f"rows {self.row}..{self.row + table.num_rows - 1} differ"
        rest = got.slice(table.num_rows)
        self.pending, self.have = ([*rest.to_batches()] if rest.num_rows else []), rest.num_rows
        self.row += table.num_rows
        return None

    def finish(self) -> str | None:
        """``None`` when the file holds no row past those compared."""
        return "the Parquet file has more rows" if self.have or next(self.batches, None) is not None else None
