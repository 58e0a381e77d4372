"""The batch export: the copy of a run folder off the pod with ``SHA256SUMS``, and the batch's one re-check of a copy.

:func:`check_export_root` refuses an export folder that cannot be written before any work; :func:`export_batch`
copies a finished run (:func:`classify.runs.export.export_run`) and re-checks the copy where it landed with
:func:`check_export`, the batch's counts recomputed from the copy: ``results.jsonl`` compared with the shard files'
bytes and ``results.parquet`` with their tables, the first differing row, file and field worded
(:func:`check_export_rows`). :func:`export_dest` is where the copy goes; :func:`export_partial` copies a batch
as it is now (``docpilot status --export-partial``, the wrap-up of an unfinished batch). The shards copied while
the batch runs are :mod:`batch.run.offpod`'s; one writer per export location is :mod:`batch.run.owner`'s.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from batch.layout import (
    MANIFEST,
    RESULT_COLUMNS,
    RESULTS,
    RESULTS_PARQUET,
    SUMMARY,
    check_shard_ids,
    streaming_parquet,
)
from batch.rows import REVIEW_COLUMN, RowMatcher, has_review, parsed_shards, read_rows
from batch.run.hooks import RunHooks
from batch.run.merge import Tally, shard_paths
from batch.runfiles import Manifest
from classify.errors import EnvironmentCheckError, InputError, VerificationError
from classify.paths import exports_dir
from classify.records import Result
from classify.runs import storage
from classify.runs.accounting import recheck_export, recount_mismatches
from classify.runs.disk import DISK_FULL_ERRNOS as FULL_ERRNOS
from classify.runs.export import SHA256SUMS, export_complete, export_run

log = logging.getLogger("docpilot.batch")  # the batch's own log lines, as the attempt's


def export_dest(export_root: str | None, batch_id: str) -> storage.Dest:
    """Where a batch's export copy goes: ``<export root>/<batch id>``, the root ``--export-dir``, else
    ``batch.export_dir``, else :func:`classify.paths.exports_dir` (a folder, or an object-storage URL)."""
    return storage.join(storage.as_dest(export_root or exports_dir()), batch_id)


def check_export_root(dest: storage.Dest) -> None:
    """Make sure a local export copy can be written: its parent folder is made (as the copy would) and a file is
    created and removed there, and nothing but an earlier complete copy (with its ``SHA256SUMS``, re-checked at the
    end) is where the copy goes. A URL is checked by the copy itself (:mod:`batch.run.offpod` while the batch runs).

    Raises:
        EnvironmentCheckError: the folder cannot be made or written (a path under a file, a read-only or
            virtual file system, no permission), or ``dest`` holds something else (a file, a folder without
            ``SHA256SUMS``), exit 6 naming it.
    """
    if not isinstance(dest, Path):
        return
    root = dest.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".docpilot-probe-"):
            pass
    except OSError as err:
        raise EnvironmentCheckError(f"the export folder {root} cannot be written: {err.strerror or err}; "
                                    "choose another with --export-dir (or batch.export_dir)") from err
    if (dest.exists() or dest.is_symlink()) and not (dest / SHA256SUMS).is_file():  # a finished copy has its sums
        raise EnvironmentCheckError(f"{dest} exists and is not an export copy (no {SHA256SUMS}): the batch's copy "
                                    "goes there; move it away, or choose another --export-dir (or batch.export_dir)")


def export_batch(run_dir: Path, dest: storage.Dest, hooks: RunHooks | None = None,
                 reuse: dict[str, str] | None = None) -> storage.Dest:
    """Copy the finished run with SHA256SUMS and re-check the copy (an earlier attempt's copy is re-checked, not overwritten).

    ``dest`` is a folder or an object-storage URL; a URL copy is read back from the store for the
    re-check, and an incomplete one (an interrupted upload: no SHA256SUMS) is completed. The re-check is
    :func:`check_export`, the one re-check of batch and pilot.

    Args:
        run_dir: the finished run folder.
        dest: where the copy goes.
        hooks: told the ``export`` and ``verify`` stages.
        reuse: ``{relative path: sha256}`` of files already at a URL ``dest`` (shards copied off the pod while
            the batch ran, :mod:`batch.run.offpod`): not sent again, re-checked with the rest.

    Raises:
        VerificationError: the copy fails its re-check.
    """
    hooks = hooks or RunHooks()
    hooks.stage("export")
    if export_complete(dest):
        log.info("export %s exists (an earlier attempt); re-checking it", dest)
    else:
        try:
            export_run(run_dir, dest, reuse)
        except OSError as err:
            if not isinstance(dest, Path) or isinstance(err, EnvironmentCheckError) or err.errno in FULL_ERRNOS:
                raise  # a store's own error kind, or a full disk (classify.runs.disk says which folder)
            raise EnvironmentCheckError(f"cannot write the export copy {dest}: {err.strerror or err}; the run folder "
                                        f"{run_dir} is complete: run the same command again with a writable "
                                        "--export-dir") from err
    hooks.stage("verify")
    recheck_export(dest, check_export, f"export {dest}")
    return dest


def export_partial(st: dict[str, Any], dest_root: str) -> Any:
    """Copy a batch's run folder as it is now to ``<dest_root>/<batch-id>-partial-<utc>/`` and re-check it
    (``...-<utc>-2/`` and so on for another copy within the same second).

    Complete shard files are final (written atomically), so the copy holds every finished shard;
    the temporary file of a shard being written is hidden and skipped.

    Args:
        st: :func:`batch.lot.status.batch_status` output.
        dest_root: a folder or an object-storage URL.

    Returns:
        The copy's destination.

    Raises:
        VerificationError: the copy fails its re-check (names the file).
    """
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = storage.join(storage.as_dest(dest_root), f"{st['batch_id']}-partial-{stamp}")
    n = 1
    while export_complete(dest):  # a second copy within the same second (a wrap-up rerun): never overwritten
        n += 1
        dest = storage.join(storage.as_dest(dest_root), f"{st['batch_id']}-partial-{stamp}-{n}")
    with storage.local_copy_dir("partial") as tmp:  # a snapshot first: progress.json is rewritten while it runs
        snapshot = Path(tmp) / st["batch_id"]
        shutil.copytree(st["run_dir"], snapshot, ignore=shutil.ignore_patterns(".*"))
        export_run(snapshot, dest)
    recheck_export(dest, None, f"partial export {dest}")
    return dest


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
    are counted (:class:`batch.run.merge.Tally`) and compared with the next rows of ``results.parquet``
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
        paths = shard_paths(export_dir, manifest)
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
