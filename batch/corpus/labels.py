"""Labels of a batch corpus, read again after the merge in the order of ``results.jsonl``.

A corpus is labelled when ``corpus.label_column`` (default ``"category"``) is a column of its CSV
header or Parquet schema, or a key of at least one JSONL record; ``null`` turns labels off. A
folder corpus has no labels. Rows without a value are unlabelled rows.

The merge writes one row per distinct id in plan order (shard by shard, corpus order inside a
shard, later duplicates skipped), so the labels are streamed in that same order and zipped with
the results: memory does not grow with the corpus.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batch.corpus.plan import CorpusPlan
from batch.corpus.shard import jsonl_lines
from batch.corpus.tabular import (
    csv_header,
    iter_csv_rows,
    iter_parquet_batches,
    parquet_columns,
    parquet_id_values,
    parquet_row_id,
)
from classify.documents.read import jsonl_line_fields, jsonl_line_id
from classify.documents.text import escape_surrogates


def _label(value: Any) -> str | None:
    return escape_surrogates(value.strip()) if isinstance(value, str) and value.strip() else None  # a line not UTF-8


def has_labels(plan: CorpusPlan, column: str | None) -> bool:
    """Whether the planned corpus carries labels in ``column`` (see the module docstring).

    JSONL is searched for the key's bytes in 8 MiB blocks; each line holding them is parsed until one is a
    record with the key (a whole pass, near the speed of the disk, when none has it).
    """
    if column is None or plan.format == "dir":
        return False
    path: Any = plan.file()
    if plan.format == "csv":
        return column in (plan.reading.get("header") or csv_header(path)[0])
    if plan.format == "parquet":

        return column in parquet_columns(path, plan.reading["text_column"], None)[0].schema_arrow.names
    key = column.encode()
    carry = b""
    with path.open("rb") as fh:
        while True:  # 8 MiB blocks cut at a line end; bytes.find, not a Python loop per line
            block = fh.read(8 << 20)
            data = carry + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            if block and cut == 0:
                carry = data  # one line longer than the block: read on
                continue
            part, carry = data[:cut], data[cut:]
            at = part.find(key)
            while at != -1:
                first, end = part.rfind(b"\n", 0, at) + 1, part.find(b"\n", at)
                end = len(part) if end == -1 else end
                try:
                    record = json.loads(part[first:end])
                except (ValueError, UnicodeDecodeError):
                    record = None
                if isinstance(record, dict) and column in record:
                    return True
                at = part.find(key, end)
            if not block:
                break
    return False


def iter_labels(plan: CorpusPlan, column: str) -> Iterator[tuple[str, str | None]]:
    """``(id, label or None)`` for every result row of the batch, in ``results.jsonl`` order.

    Args:
        plan: the batch's corpus plan (the manifest's shards: duplicates folded, later ones skipped).
        column: the label column or JSONL key.

    Yields:
        One pair per distinct id; the label is the stripped string value, ``None`` when missing or empty.
    """
    path: Any = plan.file()
    if plan.format == "jsonl":
        name = escape_surrogates(path.name)
        for shard in plan.shards:
            skip = set(shard.skip)
            with path.open("rb") as fh:
                fh.seek(shard.offset)
                data = fh.read(shard.end - shard.offset)
            for lineno, raw in enumerate(jsonl_lines(data), start=shard.row):
                if not raw.strip() or lineno in skip:
                    continue
                doc_id, record, _ = jsonl_line_id(name, lineno, raw)
                yield doc_id, _label((record if record is not None else jsonl_line_fields(raw)).get(column))
    elif plan.format == "csv":
        r = plan.reading
        for shard in plan.shards:
            skip = set(shard.skip)
            for row in iter_csv_rows(path, r["text_column"], id_column=r["id_column"], id_prefix=r["id_prefix"],
                                     offset=shard.offset, first_index=shard.row, max_rows=shard.n_rows, header=r["header"]):
                if row.index not in skip:
                    yield row.doc_id, _label(row.values.get(column))
    elif plan.format == "parquet":
        yield from _parquet_labels(plan, path, column)


def _parquet_labels(plan: CorpusPlan, path: Path, column: str) -> Iterator[tuple[str, str | None]]:
    r = plan.reading
    pf, use_ids = parquet_columns(path, r["text_column"], r["id_column"])
    skip = {k for s in plan.shards for k in s.skip}
    name = escape_surrogates(path.name)
    columns = [column] + ([r["id_column"]] if use_ids else [])
    for row0, batch in iter_parquet_batches(pf, path, columns):  # bounded batches, whatever the row-group size
        labels = batch.column(0).to_pylist()
        ids = parquet_id_values(batch.column(1)) if use_ids else [None] * len(labels)
        for index, (label, raw_id) in enumerate(zip(labels, ids, strict=True), start=row0):
            if index not in skip:
                doc_id, _ = parquet_row_id(raw_id, index, use_ids, r["id_prefix"], f"{name}#row{index}")
                yield doc_id, _label(label)
