"""Merging a batch's shard files into ``results.jsonl`` + ``results.parquet``, and re-checking a copy.

Merging and checking stream: one shard file at a time, ids checked against the plan's per-shard
``ids_sha256`` (:func:`batch.layout.check_shard_ids`) and for uniqueness with
:class:`batch.corpus.plan.IdHashBuckets`; every result is counted and checked by the one accounting
check (:class:`classify.accounting.Ledger`). The run folder layout is :mod:`batch.layout`'s.

The re-check of a copied run folder (:func:`check_export`, then :func:`check_export_rows`): fast path
(every shard clean): ``results.jsonl`` is compared byte for byte with the shard files in plan order,
each shard is counted by Arrow (:func:`batch.run.arrow.tally_table`) and ``results.parquet`` is compared
with the shards' tables batch by batch. Any difference sends the check down the per-row path, which
names the first differing row, file and field. Both read one shard (and one Parquet batch) at a time.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from batch.layout import (
    MANIFEST,
    RESULT_COLUMNS,
    RESULTS,
    RESULTS_PARQUET,
    SUMMARY,
    check_shard_ids,
    result_lines,
    shard_path,
    streaming_parquet,
)
from batch.run.arrow import (
    REVIEW_COLUMN,
    RowMatcher,
    has_review,
    parsed_shards,
    results_schema,
    tally_table,
)
from batch.runfiles import Manifest
from classify.accounting import Ledger, account, recount_mismatches
from classify.errors import VerificationError
from classify.records import Result


def check_results(rows: list[Result], expected_ids: list[str] | None, categories: list[str]) -> list[str]:
    """The batch invariants over merged results (:func:`classify.accounting.account`).

    Args:
        rows: result records.
        expected_ids: the corpus's distinct ids (``None``: only checks that need no corpus).
        categories: the allowed categories.

    Returns:
        Problems found (empty list = all invariants hold).
    """
    return account(rows, expected_ids, categories).problems()


def summarize(rows: list[Result], corpus: dict[str, Any], categories: list[str]) -> dict[str, Any]:
    """Counts over merged results (throughput and wall time are added by the driver).

    Args:
        rows: merged result records.
        corpus: :meth:`batch.corpus.plan.Corpus.describe`.
        categories: allowed categories.

    Returns:
        ``{total, accepted, rejected, input_rows, duplicate_rows, by_category, reject_reasons, ...}``.
    """
    acc = account(rows, None, categories)
    return _summary_counts(acc.ledger, corpus, acc.duplicate_ids)


def _summary_counts(ledger: Ledger, corpus: dict[str, Any], duplicate_ids: list[str]) -> dict[str, Any]:
    c = ledger.counts()
    return {"total": c["total"], "distinct_ids": corpus["distinct_ids"], "accepted": c["accepted"],
            "rejected": c["rejected"], "input_rows": corpus["input_rows"], "duplicate_rows": corpus["duplicate_rows"],
            "duplicate_ids": duplicate_ids, "by_category": c["by_category"], "reject_reasons": c["reject_reasons"],
            "n_tokens": c["n_tokens"]}


def check_export(export_dir: Path) -> list[str]:
    """Recompute the summary invariants from an export copy (for :func:`classify.export.verify_export`).

    Streams the copy (one shard file and one results line at a time): ids unique (hashes on disk);
    each shard file holds exactly its planned ids; ``results.jsonl`` is the shard files' rows in plan
    order; accepted + rejected == total == distinct ids of the corpus; summary counts equal the
    recount; ``results.parquet`` equals ``results.jsonl`` row for row (required from manifest version 2).

    Returns:
        Problems found (empty list = verified).
    """
    try:
        manifest = Manifest.of(json.loads((export_dir / MANIFEST).read_text(encoding="utf-8")))
        summary = json.loads((export_dir / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # json.JSONDecodeError and pydantic's ValidationError are ValueErrors
        return [f"cannot read the copy: {err}"]

    return check_export_rows(export_dir, manifest, summary)


class Tally(Ledger):
    """:class:`classify.accounting.Ledger` with the batch's id-uniqueness check on disk (the streaming form of
    :func:`summarize` and :func:`check_results`; at most 100 problems kept).

    Args:
        categories: the allowed categories.
    """

    def __init__(self, categories: list[str]):
        super().__init__(categories, max_problems=100)
        from batch.corpus.plan import IdHashBuckets

        self.ids = IdHashBuckets()

    def add(self, r: Result) -> None:
        """Count one result and note what is wrong with it."""
        self.ids.add(str(r.id), self.total)
        super().add(r)

    def duplicate_ids(self, results: Path) -> list[str]:
        """Ids given more than once among the counted rows; ``results`` (the JSONL just counted) is re-read
        only for the rows whose id hash repeats."""
        rows = set(self.ids.candidate_rows())
        if not rows:
            return []
        seen: Counter[str] = Counter()
        with results.open("rb") as fh:
            for n, line in enumerate(ln for ln in fh if ln.strip()):
                if n in rows:
                    seen[str(json.loads(line).get("id"))] += 1
        return sorted(i for i, c in seen.items() if c > 1)

    def summary(self, corpus: dict[str, Any], duplicate_ids: list[str]) -> dict[str, Any]:
        """The counts of :func:`summarize`."""
        return _summary_counts(self, corpus, duplicate_ids)


class _ParquetRows:
    """Rows appended in batches to a Parquet file (one row group per ~64k rows); ``review``: add that column."""

    def __init__(self, path: Path, review: bool = False):
        import pyarrow.parquet as pq

        self.schema = results_schema(review)
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self.columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        self.tables: list[Any] = []  # whole shards (fast path) and converted row columns, in order
        self.rows = 0

    def add(self, r: Result) -> None:
        for name, col in self.columns.items():
            col.append(getattr(r, name))
        if len(self.columns["id"]) >= 65_536:
            self.flush()

    def add_table(self, table: Any) -> None:
        """Append a shard table of :func:`results_schema` (after the rows added before it)."""
        self._columns_to_table()
        self.tables.append(table)
        self.rows += table.num_rows
        if self.rows >= 65_536:
            self.flush()

    def _columns_to_table(self) -> None:
        import pyarrow as pa

        if self.columns["id"]:
            self.tables.append(pa.table(self.columns, schema=self.schema))
            self.rows += len(self.columns["id"])
            self.columns = {name: [] for name in self.columns}

    def flush(self) -> None:
        import pyarrow as pa

        self._columns_to_table()
        if self.tables:
            self.writer.write_table(pa.concat_tables(self.tables))
            self.tables, self.rows = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


def merge_results(run_dir: Path, manifest: Manifest, write: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Merge the shard files in plan order into ``results.jsonl`` and ``results.parquet``, in bounded memory.

    Each shard file is read once, its ids checked against the plan's ``ids_sha256`` (so no id is
    missing or unknown), every row checked (status, category, reason) and counted, and copied to
    both result files; ids are checked for uniqueness across the whole batch with 64-bit hashes on
    disk. Both files are written to temporary names, fsynced and renamed, so a crash leaves no half file.

    Args:
        run_dir: the run folder.
        manifest: its manifest (version 2).
        write: ``False``: only check and count (a finished batch re-checked, nothing written).

    Returns:
        ``(summary counts as :func:`summarize`, problems)``; problems empty = every invariant holds.

    Raises:
        VerificationError: a shard file whose ids differ from its plan.
    """
    version = manifest.version
    tally = Tally(manifest.categories)
    problems: list[str] = []
    review = has_review(manifest)
    tmp_jsonl = tmp_parquet = None
    out = pq_rows = None
    if write:
        fd, name = tempfile.mkstemp(prefix=f".{RESULTS}.", suffix=".tmp", dir=run_dir)
        tmp_jsonl, out = Path(name), os.fdopen(fd, "wb")
        tmp_parquet = run_dir / f".{RESULTS_PARQUET}.tmp"
        pq_rows = _ParquetRows(tmp_parquet, review)
    counted = run_dir / RESULTS if not write else tmp_jsonl
    try:
        paths = [shard_path(run_dir, shard.index, version) for shard in manifest.shards]
        for shard, path, (body, table, error) in zip(manifest.shards, paths, parsed_shards(paths, review), strict=True):
            if not path.is_file():
                problems.append(f"shard {shard.index} has no file ({shard.n_docs} ids missing from results)")
                continue
            if error is not None:
                raise error
            ids = tally_table(tally, table) if table is not None else None
            if ids is not None:  # columnar: the bytes are the rows, Arrow counted them
                if out is not None and pq_rows is not None:
                    out.write(body)
                    pq_rows.add_table(table)
            else:
                ids = []
                for line, row in result_lines(path):
                    ids.append(row.id)
                    tally.add(row)
                    if out is not None and pq_rows is not None:
                        out.write(line if line.endswith(b"\n") else line + b"\n")
                        pq_rows.add(row)
            check_shard_ids(path, shard, ids)
        if out is not None and pq_rows is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            pq_rows.close()
        duplicates = tally.duplicate_ids(counted) if counted and counted.is_file() else []
    except BaseException:
        if out is not None:
            for closing in (out.close, pq_rows.writer.close if pq_rows is not None else None):
                try:  # closed before the unlink, so a full disk gets its space back (an open file keeps it)
                    if closing is not None:
                        closing()
                except Exception:  # noqa: BLE001 - a full disk fails the close's last write too
                    pass
            Path(tmp_jsonl).unlink(missing_ok=True)  # type: ignore[arg-type]
            Path(tmp_parquet).unlink(missing_ok=True)  # type: ignore[arg-type]
        tally.ids.close()
        raise
    if duplicates:
        problems.insert(0, f"duplicate ids in results: {duplicates[:10]}{' ...' if len(duplicates) > 10 else ''}")
    problems += tally.problems
    if tally.accepted + tally.rejected != manifest.corpus["distinct_ids"]:
        problems.append(f"accepted + rejected = {tally.accepted + tally.rejected} "
                        f"!= corpus distinct ids {manifest.corpus['distinct_ids']}")
    if write and tmp_jsonl is not None and tmp_parquet is not None:
        with tmp_parquet.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_jsonl, run_dir / RESULTS)
        os.replace(tmp_parquet, run_dir / RESULTS_PARQUET)
    return tally.summary(manifest.corpus, duplicates), problems


def check_export_rows(export_dir: Path, manifest: Manifest, summary: dict[str, Any]) -> list[str]:
    """Re-read a copied run folder's shards, ``results.jsonl`` and ``results.parquet`` against its summary.

    Args:
        export_dir: the copy.
        manifest: its manifest.
        summary: its ``summary.json``.

    Returns:
        Problems; empty when every row, count and file agrees.
    """
    fast = _check_export_fast(export_dir, manifest, summary)
    return fast if fast is not None else _check_export_streaming(export_dir, manifest, summary)


def _check_export_fast(export_dir: Path, manifest: Manifest, summary: dict[str, Any]) -> list[str] | None:
    """The columnar check, or ``None`` when any shard or file needs the per-row check to name a problem."""
    review = has_review(manifest)
    matcher = _parquet_matcher(export_dir / RESULTS_PARQUET, manifest, review)
    if matcher is False:
        return None
    tally = Tally(manifest.categories)
    results = export_dir / RESULTS
    try:
        paths = [shard_path(export_dir, shard.index, manifest.version) for shard in manifest.shards]
        with results.open("rb") as fh:
            for shard, path, (body, table, error) in zip(manifest.shards, paths, parsed_shards(paths, review), strict=True):
                if error is not None or body is None or fh.read(len(body)) != body:
                    return _abandon(tally)
                ids = tally_table(tally, table) if table is not None else None
                if ids is None or (matcher is not None and matcher.take(table) is not None):
                    return _abandon(tally)
                check_shard_ids(path, shard, ids)
            if fh.read(1) or (matcher is not None and matcher.finish() is not None):
                return _abandon(tally)
        duplicates = tally.duplicate_ids(results)
    except (OSError, VerificationError):
        return _abandon(tally)
    problems = [f"duplicate ids in results: {duplicates[:10]}"] if duplicates else []
    problems += _recount(tally, manifest, summary, duplicates)
    return None if problems else []  # problems: the per-row check words them (and finds any other)


def _parquet_matcher(parquet: Path, manifest: Manifest, review: bool) -> RowMatcher | None | bool:
    """A :class:`RowMatcher` over ``results.parquet``; ``None`` when the copy needs none (a version 1 folder
    without one), ``False`` when the file is unreadable or has other columns (the per-row check words it)."""
    if manifest.version < 2 and not parquet.exists():
        return None
    try:
        pf = streaming_parquet(parquet)
    except Exception:  # noqa: BLE001 - pyarrow's errors
        return False
    if pf.schema_arrow.names != [name for name, _ in RESULT_COLUMNS] + ([REVIEW_COLUMN[0]] if review else []):
        return False
    return RowMatcher(pf.iter_batches(batch_size=65_536))


def _abandon(tally: Tally) -> None:
    tally.ids.close()
    return None


def _recount(tally: Tally, manifest: Manifest, summary: dict[str, Any], duplicates: list[str]) -> list[str]:
    problems = list(tally.problems)
    recount = tally.summary(manifest.corpus, duplicates)
    problems += recount_mismatches(summary, recount, ("total", "accepted", "rejected", "input_rows", "duplicate_rows"))
    if recount["accepted"] + recount["rejected"] != manifest.corpus["distinct_ids"]:
        problems.append(f"accepted + rejected = {recount['accepted'] + recount['rejected']} "
                        f"!= corpus distinct ids {manifest.corpus['distinct_ids']}")
    return problems


def _parquet_equals_jsonl(parquet: Path, jsonl: Path) -> list[str]:
    """Compare ``results.parquet`` with ``results.jsonl`` row for row, streaming both."""
    try:
        pf = streaming_parquet(parquet)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors
        return [f"{RESULTS_PARQUET}: cannot read: {err}"]
    names = [name for name, _ in RESULT_COLUMNS]
    if pf.schema_arrow.names == [*names, REVIEW_COLUMN[0]]:  # a batch with classify.review_below_score
        names.append(REVIEW_COLUMN[0])
    if pf.schema_arrow.names != names:
        return [f"{RESULTS_PARQUET}: columns {pf.schema_arrow.names} != {names}"]
    with jsonl.open("rb") as fh:
        lines = (json.loads(ln) for ln in fh if ln.strip())
        n = 0
        for batch in pf.iter_batches(batch_size=65_536):
            for prow in batch.to_pylist():
                jrow = next(lines, None)
                if jrow is None:
                    return [f"{RESULTS_PARQUET} has more rows than {RESULTS} ({n} there)"]
                if {k: jrow.get(k) for k in names} != prow:
                    return [f"{RESULTS_PARQUET} row {n} differs from {RESULTS}: {prow} != {jrow}"]
                n += 1
        if next(lines, None) is not None:
            return [f"{RESULTS_PARQUET} has fewer rows ({n}) than {RESULTS}"]
    return []


def _check_export_streaming(export_dir: Path, manifest: Manifest, summary: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    version = manifest.version
    tally = Tally(manifest.categories)
    shard_rows = 0
    results = export_dir / RESULTS
    try:
        with results.open("rb") as fh:
            merged = (Result.from_json(ln) for ln in fh if ln.strip())
            for shard in manifest.shards:
                path = shard_path(export_dir, shard.index, version)
                ids = []
                for _, row in result_lines(path):
                    ids.append(row.id)
                    shard_rows += 1
                    copied = next(merged, None)
                    if copied is not None:
                        tally.add(copied)
                        if copied != row and len(problems) < 10:
                            problems.append(f"{RESULTS} row {tally.total - 1} differs from {path.relative_to(export_dir)}")
                check_shard_ids(path, shard, ids)
            for copied in merged:
                tally.add(copied)
        duplicates = tally.duplicate_ids(results)
    except (OSError, json.JSONDecodeError, VerificationError) as err:
        tally.ids.close()
        return [f"cannot read the copy: {err}"]
    if duplicates:
        problems.append(f"duplicate ids in results: {duplicates[:10]}")
    problems += _recount(tally, manifest, summary, duplicates)
    if shard_rows != tally.total:
        problems.append(f"shard files hold {shard_rows} rows but results.jsonl {tally.total}")
    if version >= 2 or (export_dir / RESULTS_PARQUET).exists():
        problems += _parquet_equals_jsonl(export_dir / RESULTS_PARQUET, results)
    return problems
