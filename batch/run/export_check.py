"""The row-level part of :func:`batch.run.merge.check_export`: a copied run folder re-read and re-counted.

Fast path (every shard clean): ``results.jsonl`` is compared byte for byte with the shard files in
plan order, each shard is counted by Arrow (:func:`batch.run.arrow.tally_table`) and
``results.parquet`` is compared with the shards' tables batch by batch. Any difference sends the
check down the per-row path, which names the first differing row, file and field as before.
Both read one shard (and one Parquet batch) at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batch.layout import RESULT_COLUMNS, RESULTS, RESULTS_PARQUET, check_shard_ids, result_lines, shard_path
from batch.run.arrow import (
    REVIEW_COLUMN,
    RowMatcher,
    has_review,
    parsed_shards,
    streaming_parquet,
    tally_table,
)
from batch.run.merge import Tally
from batch.run.runfiles import Manifest
from classify.accounting import recount_mismatches
from classify.errors import VerificationError
from classify.records import Result


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
        paths = [shard_path(export_dir, shard["index"], manifest.version) for shard in manifest.shards]
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
                path = shard_path(export_dir, shard["index"], version)
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
