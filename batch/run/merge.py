"""Merging a batch's shard files into ``results.jsonl`` + ``results.parquet``: one columnar pass.

It streams one shard file at a time, parsed into an Arrow table (:func:`batch.rows.read_rows`):
ids are checked against the plan's per-shard ``ids_sha256`` (:func:`batch.layout.check_shard_ids`) and
for uniqueness with :class:`batch.corpus.plan.IdHashBuckets`; every row is counted and checked by the one
accounting check (:class:`Tally`, Arrow kernels, the rules of :class:`classify.runs.accounting.Ledger`), and
each shard's lines and table are written. The re-check of a copied run folder takes the same pass with the same
:class:`Tally` (:func:`batch.run.export.check_export`). The run folder layout is :mod:`batch.layout`'s.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from batch.corpus.plan import IdHashBuckets
from batch.layout import (
    RESULTS,
    RESULTS_PARQUET,
    check_shard_ids,
    shard_path,
)
from batch.rows import has_review, parsed_shards, results_schema
from batch.runfiles import Manifest
from classify.records import Result
from classify.runs.accounting import Ledger, row_problem


def _summary_counts(ledger: Ledger, corpus: dict[str, Any], duplicate_ids: list[str]) -> dict[str, Any]:
    c = ledger.counts()
    return {"total": c["total"], "distinct_ids": corpus["distinct_ids"], "accepted": c["accepted"],
            "rejected": c["rejected"], "input_rows": corpus["input_rows"], "duplicate_rows": corpus["duplicate_rows"],
            "duplicate_ids": duplicate_ids, "by_category": c["by_category"], "reject_reasons": c["reject_reasons"],
            "n_tokens": c["n_tokens"], "truncated": c["truncated"], "n_windows": c["n_windows"]}


class Tally(Ledger):
    """:class:`classify.runs.accounting.Ledger` counted a table at a time, with the batch's id-uniqueness check on
    disk (the streaming form of :func:`classify.runs.accounting.account`; at most 100 problems kept).

    Args:
        categories: the allowed categories.
    """

    def __init__(self, categories: list[str]):
        super().__init__(categories, max_problems=100)
        self.ids = IdHashBuckets()

    def add_table(self, table: Any) -> list[str]:
        """Count a table of result rows (:func:`batch.rows.results_schema`) as :meth:`Ledger.add` counts
        each row, with Arrow kernels; the rows the accounting check flags (a status other than accepted or
        rejected, an accepted category outside the allowed ones, a rejection without a reason) are noted in
        row order with :func:`classify.runs.accounting.row_problem`'s words.

        Args:
            table: a ``pyarrow.Table`` with at least ``id``, ``status``, ``category``, ``reason``, ``n_tokens``.

        Returns:
            The table's ids, in order (for the plan's ``ids_sha256``).
        """
        import pyarrow.compute as pc

        status, category, reason = table.column("status"), table.column("category"), table.column("reason")
        accepted, rejected = pc.equal(status, "accepted"), pc.equal(status, "rejected")
        n_acc, n_rej = pc.sum(accepted).as_py() or 0, pc.sum(rejected).as_py() or 0
        column = table.column("id")
        ids = column.to_pylist()
        self.ids.add_many(ids if not column.null_count else [str(i) for i in ids], self.total)
        self.total += table.num_rows
        self.accepted += n_acc
        self.rejected += n_rej
        flagged = n_acc + n_rej != table.num_rows
        for item in pc.value_counts(pc.filter(category, accepted)).to_pylist():  # first-seen order, as Counter keeps
            self.per_category[item["values"]] += item["counts"]
            flagged = flagged or item["values"] not in self.by_category
        for item in pc.value_counts(category).to_pylist():
            if item["values"] in self.by_category:
                self.by_category[item["values"]] += item["counts"]
        for item in pc.value_counts(pc.filter(reason, rejected)).to_pylist():
            self.reasons[(item["values"] or "").split(":")[0]] += item["counts"]
            flagged = flagged or not item["values"]
        self.n_tokens += pc.sum(table.column("n_tokens")).as_py() or 0
        self.truncated += pc.sum(pc.cast(pc.fill_null(table.column("truncated"), False), "int64")).as_py() or 0
        self.n_windows += pc.sum(table.column("n_windows")).as_py() or 0
        if flagged:  # name each flagged row, in row order (few rows: Python over them alone)
            for row in table.select(["id", "status", "category", "reason"]).to_pylist():
                r = Result.model_construct(**row)
                if row_problem(r, self.categories) is not None:
                    kind = (self.bad_category if r.status == "accepted" else self.no_reason if r.status == "rejected"
                            else self.bad_status)
                    self._note(kind, r)
        return ids

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
                    row = json.loads(line)
                    seen[str(row.get("id") if isinstance(row, dict) else None)] += 1  # as Tally.add_table hashes it
        return sorted(i for i, c in seen.items() if c > 1)

    def summary(self, corpus: dict[str, Any], duplicate_ids: list[str]) -> dict[str, Any]:
        """``{total, accepted, rejected, input_rows, duplicate_rows, by_category, reject_reasons, ...}``."""
        return _summary_counts(self, corpus, duplicate_ids)

    def check(self, manifest: Manifest, results: Path) -> tuple[list[str], list[str]]:
        """The batch-wide checks once every row is counted: ``(duplicate ids, problems)``.

        Problems: the duplicate ids, the per-row problems, and accepted + rejected against the corpus's
        distinct ids. ``results``: the JSONL file holding the counted rows, in order.
        """
        duplicates = self.duplicate_ids(results) if results.is_file() else []
        problems = list(self.problems)
        if duplicates:
            problems.insert(0, f"duplicate ids in results: {duplicates[:10]}{' ...' if len(duplicates) > 10 else ''}")
        return duplicates, problems + self.balance(manifest)

    def balance(self, manifest: Manifest) -> list[str]:
        """``"accepted + rejected = N != corpus distinct ids M"`` when the counted rows do not cover the corpus."""
        distinct = manifest.corpus["distinct_ids"]
        if self.accepted + self.rejected == distinct:
            return []
        return [f"accepted + rejected = {self.accepted + self.rejected} != corpus distinct ids {distinct}"]


def shard_paths(run_dir: Path, manifest: Manifest) -> list[Path]:
    return [shard_path(run_dir, shard.index) for shard in manifest.shards]


class _Outputs:
    """``results.jsonl`` and ``results.parquet`` written under temporary names (one Parquet row group per
    ~64k rows), fsynced and renamed by :meth:`commit`; :meth:`discard` removes them."""

    def __init__(self, run_dir: Path, review: bool):
        import pyarrow.parquet as pq

        fd, name = tempfile.mkstemp(prefix=f".{RESULTS}.", suffix=".tmp", dir=run_dir)
        self.run_dir, self.jsonl_path, self.jsonl = run_dir, Path(name), os.fdopen(fd, "wb")
        self.parquet_path = run_dir / f".{RESULTS_PARQUET}.tmp"
        self.parquet = pq.ParquetWriter(self.parquet_path, results_schema(review), compression="zstd")
        self.tables: list[Any] = []
        self.rows = 0

    def add(self, lines: bytes, table: Any) -> None:
        import pyarrow as pa

        self.jsonl.write(lines)
        self.tables.append(table)
        self.rows += table.num_rows
        if self.rows >= 65_536:
            self.parquet.write_table(pa.concat_tables(self.tables))
            self.tables, self.rows = [], 0

    def close(self) -> None:
        import pyarrow as pa

        if self.tables:
            self.parquet.write_table(pa.concat_tables(self.tables))
            self.tables = []
        self.jsonl.flush()
        os.fsync(self.jsonl.fileno())
        self.jsonl.close()
        self.parquet.close()

    def commit(self) -> None:
        with self.parquet_path.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self.jsonl_path, self.run_dir / RESULTS)
        os.replace(self.parquet_path, self.run_dir / RESULTS_PARQUET)

    def discard(self) -> None:
        for closing in (self.jsonl.close, self.parquet.close):
            try:  # closed before the unlink, so a full disk gets its space back (an open file keeps it)
                closing()
            except Exception:  # noqa: BLE001 - a full disk fails the close's last write too
                pass
        self.jsonl_path.unlink(missing_ok=True)
        self.parquet_path.unlink(missing_ok=True)


def merge_results(run_dir: Path, manifest: Manifest, write: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Merge the shard files in plan order into ``results.jsonl`` and ``results.parquet``, in bounded memory.

    Each shard file is read once and parsed into a table (:func:`batch.rows.read_rows`), its ids
    checked against the plan's ``ids_sha256`` (so no id is missing or unknown), its rows checked (status,
    category, reason) and counted (:meth:`Tally.add_table`), and its lines and table copied to both result
    files; ids are checked for uniqueness across the whole batch with 64-bit hashes on disk. Both files
    are written to temporary names, fsynced and renamed, so a crash leaves no half file.

    Args:
        run_dir: the run folder.
        manifest: its manifest.
        write: ``False``: only check and count (a finished batch re-checked, nothing written).

    Returns:
        ``(summary counts, problems)``: ``{total, accepted, rejected, input_rows, duplicate_rows, by_category,
        reject_reasons, ...}``; problems empty = every invariant holds.

    Raises:
        VerificationError: a shard file whose ids differ from its plan, or a line that is not a result row.
        OSError: a shard file that exists but cannot be read.
    """
    tally = Tally(manifest.categories)
    missing: list[str] = []
    out = _Outputs(run_dir, has_review(manifest)) if write else None
    try:
        paths = shard_paths(run_dir, manifest)
        for shard, path, parsed in zip(manifest.shards, paths, parsed_shards(paths, has_review(manifest)), strict=True):
            if not path.is_file():
                missing.append(f"shard {shard.index} has no file ({shard.n_docs} ids missing from results)")
                continue
            if isinstance(parsed, Exception):
                raise parsed
            lines, table = parsed
            check_shard_ids(path, shard, tally.add_table(table))
            if out is not None:
                out.add(lines, table)
        if out is not None:
            out.close()
        duplicates, problems = tally.check(manifest, out.jsonl_path if out is not None else run_dir / RESULTS)
        problems = [*problems[:1], *missing, *problems[1:]] if duplicates else [*missing, *problems]
    except BaseException:
        if out is not None:
            out.discard()
        tally.ids.close()
        raise
    if out is not None:
        out.commit()
    return tally.summary(manifest.corpus, duplicates), problems
