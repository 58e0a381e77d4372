"""Merging a batch's shard files into ``results.jsonl`` + ``results.parquet``, and re-checking a copy: one columnar pass.

Both stream one shard file at a time, parsed into an Arrow table (:func:`batch.rows.read_rows`):
ids are checked against the plan's per-shard ``ids_sha256`` (:func:`batch.layout.check_shard_ids`) and
for uniqueness with :class:`batch.corpus.plan.IdHashBuckets`; every row is counted and checked by the one
accounting check (:class:`Tally`, Arrow kernels, the rules of :class:`classify.runs.accounting.Ledger`).
The merge writes each shard's lines and table; the re-check of a copied run folder
(:func:`check_export`) compares ``results.jsonl`` with the shard files' bytes and ``results.parquet``
with their tables, and words the first differing row, file and field. The run folder layout is
:mod:`batch.layout`'s.
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
    shard_path,
    streaming_parquet,
)
from batch.rows import REVIEW_COLUMN, RowMatcher, has_review, parsed_shards, read_rows, results_schema
from batch.runfiles import Manifest
from classify.errors import InputError, VerificationError
from classify.records import Result
from classify.runs.accounting import Ledger, account, recount_mismatches


def check_results(rows: list[Result], expected_ids: list[str] | None, categories: list[str]) -> list[str]:
    """The batch invariants over merged results (:func:`classify.runs.accounting.account`).

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
        corpus: :meth:`batch.corpus.plan.CorpusPlan.describe`.
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
            "n_tokens": c["n_tokens"], "truncated": c["truncated"], "n_windows": c["n_windows"]}


def check_export(export_dir: Path) -> list[str]:
    """Recompute the summary invariants from an export copy (for :func:`classify.runs.export.verify_export`).

    Streams the copy (one shard file at a time, :func:`check_export_rows`): ids unique (hashes on disk);
    each shard file holds exactly its planned ids; ``results.jsonl`` is the shard files' rows in plan
    order; accepted + rejected == total == distinct ids of the corpus; summary counts equal the
    recount; ``results.parquet`` equals ``results.jsonl`` row for row.

    Returns:
        Problems found (empty list = verified).
    """
    try:
        manifest = Manifest.of(json.loads((export_dir / MANIFEST).read_text(encoding="utf-8")))
        summary = json.loads((export_dir / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError, InputError) as err:  # JSONDecodeError and ValidationError are ValueErrors; an
        return [f"cannot read the copy: {err}"]  # earlier layout is batch.runfiles.EarlierRunFolder (an InputError)
    if not isinstance(summary, dict):
        return [f"cannot read the copy: {SUMMARY} is not a JSON object"]
    return check_export_rows(export_dir, manifest, summary)


class Tally(Ledger):
    """:class:`classify.runs.accounting.Ledger` counted a table at a time, with the batch's id-uniqueness check on
    disk (the streaming form of :func:`summarize` and :func:`check_results`; at most 100 problems kept).

    Args:
        categories: the allowed categories.
    """

    def __init__(self, categories: list[str]):
        super().__init__(categories, max_problems=100)
        from batch.corpus.plan import IdHashBuckets

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
            from classify.runs.accounting import row_problem

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
        """The counts of :func:`summarize`."""
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


def _shard_paths(run_dir: Path, manifest: Manifest) -> list[Path]:
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
        ``(summary counts as :func:`summarize`, problems)``; problems empty = every invariant holds.

    Raises:
        VerificationError: a shard file whose ids differ from its plan, or a line that is not a result row.
        OSError: a shard file that exists but cannot be read.
    """
    tally = Tally(manifest.categories)
    missing: list[str] = []
    out = _Outputs(run_dir, has_review(manifest)) if write else None
    try:
        paths = _shard_paths(run_dir, manifest)
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


LATER_COLUMNS = ("n_doc_tokens", "n_windows", "truncated")
"""``results.parquet`` columns added by issue 41 (long documents): a run folder written before them is re-checked on
the columns it has."""
DROPPED_COLUMNS = ("dropped",)
"""``results.parquet`` columns added by issue 55 (what padding was not scored): likewise."""


def check_export_rows(export_dir: Path, manifest: Manifest, summary: dict[str, Any]) -> list[str]:
    """Re-read a copied run folder's shards, ``results.jsonl`` and ``results.parquet`` against its summary.

    One pass, a shard at a time: the shard file is parsed (:func:`batch.rows.read_rows`) and its ids
    checked against the plan; the same number of rows of ``results.jsonl`` must be the same bytes (else
    they are parsed and each row that differs as a record is named, at most 10); the ``results.jsonl`` rows
    are counted (:class:`Tally`) and compared with the next rows of ``results.parquet``
    (:class:`batch.rows.RowMatcher`, the first difference named).

    Args:
        export_dir: the copy.
        manifest: its manifest.
        summary: its ``summary.json``.

    Returns:
        Problems; empty when every row, count and file agrees.
    """
    results = export_dir / RESULTS
    review = has_review(manifest)
    tally = Tally(manifest.categories)
    parquet = _ParquetCheck(export_dir / RESULTS_PARQUET, review)
    problems: list[str] = []
    shard_rows = 0
    try:
        paths = _shard_paths(export_dir, manifest)
        line = 1  # results.jsonl's line number at fh (for messages)
        with results.open("rb") as fh:
            for shard, path, parsed in zip(manifest.shards, paths, parsed_shards(paths, review), strict=True):
                if isinstance(parsed, Exception):
                    raise parsed
                lines, table = parsed
                copied, copied_table, read = _copied_rows(fh, lines, table, review, line)
                line += read
                if copied_table is not table:
                    check_shard_ids(path, shard, table.column("id").to_pylist())
                    problems += _differing_rows(lines, copied, tally.total, path.relative_to(export_dir),
                                                10 - len(problems))
                parquet.take(copied_table, copied)
                ids = tally.add_table(copied_table)
                if copied_table is table:  # the same rows: their ids are the shard file's
                    check_shard_ids(path, shard, ids)
                shard_rows += table.num_rows
            rest, rest_table = read_rows(fh.read(), review, str(results), line)
            if rest_table.num_rows:
                parquet.take(rest_table, rest)
                tally.add_table(rest_table)
        duplicates = tally.duplicate_ids(results)
    except (OSError, VerificationError) as err:
        tally.ids.close()
        return [f"cannot read the copy: {err}"]
    if duplicates:
        problems.append(f"duplicate ids in results: {duplicates[:10]}")
    problems += _recount(tally, manifest, summary, duplicates)
    if shard_rows != tally.total:
        problems.append(f"shard files hold {shard_rows} rows but results.jsonl {tally.total}")
    return problems + parquet.finish()


def _copied_rows(fh: Any, lines: bytes, table: Any, review: bool, first_line: int) -> tuple[bytes, Any, int]:
    """The next rows of ``results.jsonl`` (open as ``fh``, at line ``first_line``) that should be the shard's
    ``lines``: when they are the same bytes, ``lines`` and the shard's own ``table`` (the caller tests ``is``);
    else as many non-blank lines (fewer at the end of the file), parsed by :func:`batch.rows.read_rows`.
    The third value: the lines of the file read (blank ones too)."""
    start = fh.tell()
    if fh.read(len(lines)) == lines:
        return lines, table, lines.count(b"\n")
    fh.seek(start)
    want, got, read = lines.count(b"\n"), 0, []
    while got < want and (line := fh.readline()):
        read.append(line)
        got += bool(line.strip())
    if not got:
        return b"", read_rows(b"", review)[1], len(read)
    return (*read_rows(b"".join(read), review, RESULTS, first_line), len(read))


def _differing_rows(lines: bytes, copied: bytes, first_row: int, shard_file: Path, room: int) -> list[str]:
    """``"results.jsonl row N differs from <shard file>"`` for each copied line that is another record than the
    shard file's (at most ``room``; a line that differs only in its JSON spelling is the same record)."""
    out: list[str] = []
    for n, (mine, theirs) in enumerate(zip(lines.splitlines(), copied.splitlines(), strict=False)):
        if len(out) >= room:
            break
        if mine != theirs and Result.from_json(mine) != Result.from_json(theirs):
            out.append(f"{RESULTS} row {first_row + n} differs from {shard_file}")
    return out


class _ParquetCheck:
    """``results.parquet`` compared with the ``results.jsonl`` rows, a table at a time; the first problem is kept
    (later tables are not compared).

    Args:
        path: the copy's ``results.parquet``.
        review: the batch has the ``review`` column.
    """

    def __init__(self, path: Path, review: bool):
        self.problem: str | None = None
        self.matcher: RowMatcher | None = None
        self.columns: list[str] | None = None
        try:
            pf = streaming_parquet(path)
        except Exception as err:  # noqa: BLE001 - pyarrow's errors
            self.problem = f"{RESULTS_PARQUET}: cannot read: {err}"
            return
        names = [name for name, _ in RESULT_COLUMNS] + ([REVIEW_COLUMN[0]] if review else [])
        earlier = [[n for n in names if n not in added]  # a run written before issue 55's, or issue 41's, columns
                   for added in (DROPPED_COLUMNS, LATER_COLUMNS + DROPPED_COLUMNS)]
        if pf.schema_arrow.names != names and pf.schema_arrow.names not in earlier:
            self.problem = f"{RESULTS_PARQUET}: columns {pf.schema_arrow.names} != {names}"
            return
        self.columns = None if pf.schema_arrow.names == names else pf.schema_arrow.names
        self.matcher = RowMatcher(pf.iter_batches(batch_size=65_536))

    def take(self, table: Any, lines: bytes) -> None:
        """Compare the next ``table.num_rows`` rows of the file with ``table`` (``lines``: the same rows as JSON)."""
        if self.problem is not None or self.matcher is None:
            return
        row = self.matcher.row
        diff = self.matcher.take(table if self.columns is None else table.select(self.columns))
        if diff is None:
            return
        at, prow = diff
        if prow is None:
            self.problem = f"{RESULTS_PARQUET} has fewer rows ({row + at}) than {RESULTS}"
        else:
            jrow = json.loads(lines.splitlines()[at])
            self.problem = f"{RESULTS_PARQUET} row {row + at} differs from {RESULTS}: {prow} != {jrow}"

    def finish(self) -> list[str]:
        """The problem found, or that the file holds rows past ``results.jsonl``'s."""
        if self.problem is None and self.matcher is not None and not self.matcher.finish():
            self.problem = f"{RESULTS_PARQUET} has more rows than {RESULTS} ({self.matcher.row} there)"
        return [self.problem] if self.problem else []


def _recount(tally: Tally, manifest: Manifest, summary: dict[str, Any], duplicates: list[str]) -> list[str]:
    problems = list(tally.problems)
    recount = tally.summary(manifest.corpus, duplicates)
    problems += recount_mismatches(summary, recount, ("total", "accepted", "rejected", "input_rows", "duplicate_rows"))
    return problems + tally.balance(manifest)
