"""The batch run folder: manifest, shard plan, atomic shard files, merge and summary.

Layout of ``runs/<batch-id>/``::

    manifest.json           corpus fingerprint, config sha256, model + adapter fingerprints,
                            shard plan, pilot-gate outcome, one entry per attempt
    shards/GGG/NNNNNN.jsonl one result line per id of shard NNNNNN (group GGG = NNNNNN // 1000),
                            written atomically when complete
    progress.json           done/total, rejected, docs/s, ETA, last error (read by ``docpilot status``)
    results.jsonl           merged results, one line per distinct id (written at the end)
    results.parquet         the same rows in the same order (written at the end)
    summary.json            counts and invariants, throughput, wall time (written at the end)

A shard file exists only when its shard is complete (temporary file, fsync, rename), so a
resumed batch runs exactly the shards without a file: every id lands in exactly one shard file.
Shard files are grouped 1,000 to a folder, so no folder of a run holds more than about 1,000 files.
Run folders of ``manifest_version`` 1 (``shards/NNNNN.jsonl``, a plan of positions in a corpus
read into memory) are still read by ``docpilot status`` and the export re-check, but not resumed.

Merging and checking stream: one shard file at a time, ids checked against the plan's
per-shard ``ids_sha256`` and for uniqueness with :class:`batch.corpus.IdHashBuckets`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from classify.accounting import Ledger, account, recount_mismatches
from classify.errors import InputError, VerificationError
from classify.records import Document, Result, read_results
from classify.runrecords import write_json_atomic, write_jsonl_atomic

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
RESULTS = "results.jsonl"
RESULTS_PARQUET = "results.parquet"
SUMMARY = "summary.json"
SHARDS = "shards"
MANIFEST_VERSION = 2
SHARDS_PER_FOLDER = 1000
RESULT_COLUMNS = (("id", "string"), ("status", "string"), ("category", "string"), ("score", "float64"),
                  ("reason", "string"), ("input_sha256", "string"), ("n_chars", "int64"), ("n_tokens", "int64"))
"""The columns of ``results.parquet`` (the fields of :class:`classify.records.Result`) and their Arrow types."""

RESUME_KEYS = ("corpus_fingerprint", "config_sha256", "model_fingerprint", "adapter_sha256")
"""Manifest fields that must be unchanged for a batch id to resume."""


def ids_sha256(ids: list[str]) -> str:
    """sha256 hex digest of ids joined by newlines (a shard's identity in the plan)."""
    return hashlib.sha256("\n".join(ids).encode("utf-8", "surrogatepass")).hexdigest()


def plan_shards(docs: list[Document] | tuple[Document, ...], shard_docs: int) -> list[dict[str, Any]]:
    """Cut the corpus into consecutive shards of ``shard_docs`` documents.

    Args:
        docs: one document per distinct id, in corpus order.
        shard_docs: documents per shard (the last one may be shorter).

    Returns:
        One ``{index, start, n_docs, first_id, last_id, ids_sha256}`` per shard.
    """
    plan = []
    for index, start in enumerate(range(0, len(docs), shard_docs)):
        ids = [d.id for d in docs[start:start + shard_docs]]
        plan.append({"index": index, "start": start, "n_docs": len(ids), "first_id": ids[0],
                     "last_id": ids[-1], "ids_sha256": ids_sha256(ids)})
    return plan


def shard_path(run_dir: Path, index: int, version: int = 1) -> Path:
    """The file of shard ``index``: ``shards/GGG/NNNNNN.jsonl`` (version 2) or ``shards/NNNNN.jsonl`` (version 1)."""
    if version >= 2:
        return run_dir / SHARDS / f"{index // SHARDS_PER_FOLDER:03d}" / f"{index:06d}.jsonl"
    return run_dir / SHARDS / f"{index:05d}.jsonl"


def manifest_version(manifest: dict[str, Any]) -> int:
    """The run folder layout of a manifest (1 when the field is absent: the first layout)."""
    return int(manifest.get("manifest_version") or 1)


def shard_files(run_dir: Path, version: int) -> Iterator[tuple[int, Path]]:
    """``(index, path)`` of every shard file in a run folder (temporary files skipped), in index order."""
    folder = run_dir / SHARDS
    if not folder.is_dir():
        return
    found = []
    if version >= 2:
        for group in sorted(folder.iterdir()):
            if group.is_dir() and group.name.isdigit():
                found += [(int(p.stem), p) for p in group.glob("*.jsonl") if p.stem.isdigit()]
    else:
        found = [(int(p.stem), p) for p in folder.glob("*.jsonl") if p.stem.isdigit()]
    yield from sorted(found)


def complete_shard_indexes(run_dir: Path, manifest: dict[str, Any]) -> list[int]:
    """Indexes of the planned shards whose file exists (a cheap listing; contents are checked by :func:`scan_done`)."""
    planned = {s["index"] for s in manifest["shards"]}
    return [i for i, _ in shard_files(run_dir, manifest_version(manifest)) if i in planned]


def _ids_of_lines(path: Path) -> Iterator[tuple[bytes, Result]]:
    """``(raw line, its result)`` of each line of a shard or results file (bad records kept: :meth:`Result.from_json`)."""
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    yield line, Result.from_json(line)
                except json.JSONDecodeError as err:
                    raise VerificationError(f"{path}:{n}: not valid JSON: {err}") from None


def _check_shard_ids(path: Path, shard: dict[str, Any], ids: list[str]) -> None:
    if ids_sha256(ids) != shard["ids_sha256"]:
        raise VerificationError(
            f"{path}: its {len(ids)} ids differ from the planned shard ({shard['n_docs']} ids "
            f"{shard['first_id']}..{shard['last_id']}); remove the file to redo the shard"
        )


def scan_done(run_dir: Path, manifest: dict[str, Any]) -> dict[int, dict[str, int]]:
    """Check every complete shard file against the plan, one file at a time (the resume scan).

    Args:
        run_dir: the run folder.
        manifest: its manifest.

    Returns:
        ``{shard index: {"docs", "accepted", "rejected"}}`` for the shards whose file exists.

    Raises:
        VerificationError: a shard file that is not in the plan, or whose ids differ from the plan.
    """
    planned = {s["index"]: s for s in manifest["shards"]}
    done: dict[int, dict[str, int]] = {}
    for index, path in shard_files(run_dir, manifest_version(manifest)):
        if index not in planned:
            raise VerificationError(f"{path}: not a shard of this batch's plan ({len(planned)} shards); remove it")
        ids, accepted, rejected = [], 0, 0
        for _, row in _ids_of_lines(path):
            ids.append(row.id)
            accepted += row.status == "accepted"
            rejected += row.status == "rejected"
        _check_shard_ids(path, planned[index], ids)
        done[index] = {"docs": len(ids), "accepted": accepted, "rejected": rejected}
    return done


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """The run folder's manifest, or ``None`` when the folder has none yet."""
    path = run_dir / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically."""
    write_json_atomic(run_dir / MANIFEST, manifest)


def _dotted_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _dotted_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {json.dumps(old)} -> {json.dumps(new)}"]


def resume_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between a stored manifest and the one this run would write.

    Args:
        old: the manifest found in the run folder.
        new: the manifest built from the current corpus, config, model and adapter.

    Returns:
        One human-readable line per change (empty: the batch may resume).
    """
    changes = []
    if old.get("corpus_fingerprint") != new.get("corpus_fingerprint"):
        o, n = old.get("corpus", {}), new.get("corpus", {})
        changes.append(
            f"corpus changed: fingerprint {old.get('corpus_fingerprint')} -> {new.get('corpus_fingerprint')} "
            f"({o.get('input_rows')} -> {n.get('input_rows')} rows; {o.get('path')} -> {n.get('path')})"
        )
    if old.get("config_sha256") != new.get("config_sha256"):
        fields = _dotted_diff(old.get("config"), new.get("config"))
        changes.append(f"config changed: {'; '.join(fields) or 'sha256 differs'}")
    if old.get("model_fingerprint") != new.get("model_fingerprint"):
        changes.append(f"model changed: {old.get('model', {}).get('path')} {old.get('model_fingerprint')} -> "
                       f"{new.get('model', {}).get('path')} {new.get('model_fingerprint')}")
    if old.get("adapter_sha256") != new.get("adapter_sha256"):
        changes.append(f"adapter changed: {old.get('adapter') or 'none'} ({old.get('adapter_sha256')}) -> "
                       f"{new.get('adapter') or 'none'} ({new.get('adapter_sha256')})")
    return changes


def check_resume(run_dir: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse to resume a batch whose corpus, config, model or adapter changed.

    Raises:
        InputError: naming every change and what to do instead.
    """
    changes = resume_changes(old, new)
    if changes:
        raise InputError(
            f"batch {run_dir.name} cannot resume: " + "; ".join(changes)
            + ". Rerun with the original corpus, config, model and adapter, or start a new batch id"
        )


def completed_shards(run_dir: Path, plan: list[dict[str, Any]], version: int = 1) -> dict[int, list[Result]]:
    """Read every complete shard file and check it holds exactly its planned ids (small runs; see :func:`scan_done`).

    Args:
        run_dir: the run folder.
        plan: the manifest's shard plan.
        version: the run folder's layout.

    Returns:
        ``{shard index: its results}`` for the shards whose file exists.

    Raises:
        VerificationError: a shard file that is not in the plan, or whose ids differ from the plan.
    """
    planned = {s["index"]: s for s in plan}
    done: dict[int, list[Result]] = {}
    for index, path in shard_files(run_dir, version):
        if index not in planned:
            raise VerificationError(f"{path}: not a shard of this batch's plan ({len(plan)} shards); remove it")
        rows = read_results(path)
        if ids_sha256([r.id for r in rows]) != planned[index]["ids_sha256"]:
            raise VerificationError(
                f"{path}: its {len(rows)} ids differ from the planned shard ({planned[index]['n_docs']} ids "
                f"{planned[index]['first_id']}..{planned[index]['last_id']}); remove the file to redo the shard"
            )
        done[index] = rows
    return done


def write_shard(run_dir: Path, index: int, rows: list[Result], version: int = 1) -> Path:
    """Write one complete shard atomically (temporary file, fsync, rename).

    Args:
        run_dir: the run folder.
        index: the shard's index in the plan.
        rows: its results (one JSON line each: :meth:`classify.records.Result.row`, keys sorted).
        version: the run folder's layout (:func:`manifest_version`).

    Returns:
        The shard file's path.
    """
    path = shard_path(run_dir, index, version)
    write_jsonl_atomic(path, (r.row() for r in rows))
    return path


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
        corpus: :meth:`batch.corpus.Corpus.describe`.
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
    """Recompute the summary invariants from an export copy (for :func:`classify.runrecords.verify_export`).

    Streams the copy (one shard file and one results line at a time): ids unique (hashes on disk);
    each shard file holds exactly its planned ids; ``results.jsonl`` is the shard files' rows in plan
    order; accepted + rejected == total == distinct ids of the corpus; summary counts equal the
    recount; ``results.parquet`` equals ``results.jsonl`` row for row (required from manifest version 2).

    Returns:
        Problems found (empty list = verified).
    """
    try:
        manifest = json.loads((export_dir / MANIFEST).read_text(encoding="utf-8"))
        summary = json.loads((export_dir / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        return [f"cannot read the copy: {err}"]
    return _check_export_streaming(export_dir, manifest, summary)


class Tally(Ledger):
    """:class:`classify.accounting.Ledger` with the batch's id-uniqueness check on disk (the streaming form of
    :func:`summarize` and :func:`check_results`; at most 100 problems kept).

    Args:
        categories: the allowed categories.
    """

    def __init__(self, categories: list[str]):
        super().__init__(categories, max_problems=100)
        from batch.corpus import IdHashBuckets

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


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in RESULT_COLUMNS])


class _ParquetRows:
    """Rows appended in batches to a Parquet file (one row group per ~64k rows)."""

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self.schema = _parquet_schema()
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self.columns: dict[str, list[Any]] = {name: [] for name, _ in RESULT_COLUMNS}

    def add(self, r: Result) -> None:
        for name, col in self.columns.items():
            col.append(getattr(r, name))
        if len(self.columns["id"]) >= 65_536:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.columns["id"]:
            self.writer.write_table(pa.table(self.columns, schema=self.schema))
            self.columns = {name: [] for name in self.columns}

    def close(self) -> None:
        self.flush()
        self.writer.close()


def merge_results(run_dir: Path, manifest: dict[str, Any], write: bool = True) -> tuple[dict[str, Any], list[str]]:
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
    version = manifest_version(manifest)
    tally = Tally(list(manifest["config"]["classify"]["categories"]))
    problems: list[str] = []
    tmp_jsonl = tmp_parquet = None
    out = pq_rows = None
    if write:
        fd, name = tempfile.mkstemp(prefix=f".{RESULTS}.", suffix=".tmp", dir=run_dir)
        tmp_jsonl, out = Path(name), os.fdopen(fd, "wb")
        tmp_parquet = run_dir / f".{RESULTS_PARQUET}.tmp"
        pq_rows = _ParquetRows(tmp_parquet)
    counted = run_dir / RESULTS if not write else tmp_jsonl
    try:
        for shard in manifest["shards"]:
            path = shard_path(run_dir, shard["index"], version)
            if not path.is_file():
                problems.append(f"shard {shard['index']} has no file ({shard['n_docs']} ids missing from results)")
                continue
            ids = []
            for line, row in _ids_of_lines(path):
                ids.append(row.id)
                tally.add(row)
                if out is not None and pq_rows is not None:
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                    pq_rows.add(row)
            _check_shard_ids(path, shard, ids)
        if out is not None and pq_rows is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            pq_rows.close()
        duplicates = tally.duplicate_ids(counted) if counted and counted.is_file() else []
    except BaseException:
        if out is not None:
            out.close()
            Path(tmp_jsonl).unlink(missing_ok=True)  # type: ignore[arg-type]
            Path(tmp_parquet).unlink(missing_ok=True)  # type: ignore[arg-type]
        tally.ids.close()
        raise
    if duplicates:
        problems.insert(0, f"duplicate ids in results: {duplicates[:10]}{' ...' if len(duplicates) > 10 else ''}")
    problems += tally.problems
    if tally.accepted + tally.rejected != manifest["corpus"]["distinct_ids"]:
        problems.append(f"accepted + rejected = {tally.accepted + tally.rejected} "
                        f"!= corpus distinct ids {manifest['corpus']['distinct_ids']}")
    if write and tmp_jsonl is not None and tmp_parquet is not None:
        with tmp_parquet.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_jsonl, run_dir / RESULTS)
        os.replace(tmp_parquet, run_dir / RESULTS_PARQUET)
    return tally.summary(manifest["corpus"], duplicates), problems


def _parquet_equals_jsonl(parquet: Path, jsonl: Path) -> list[str]:
    """Compare ``results.parquet`` with ``results.jsonl`` row for row, streaming both."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(parquet)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors
        return [f"{RESULTS_PARQUET}: cannot read: {err}"]
    names = [name for name, _ in RESULT_COLUMNS]
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


def _check_export_streaming(export_dir: Path, manifest: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    version = manifest_version(manifest)
    categories = list(manifest["config"]["classify"]["categories"])
    tally = Tally(categories)
    shard_rows = 0
    results = export_dir / RESULTS
    try:
        with results.open("rb") as fh:
            merged = (Result.from_json(ln) for ln in fh if ln.strip())
            for shard in manifest["shards"]:
                path = shard_path(export_dir, shard["index"], version)
                ids = []
                for _, row in _ids_of_lines(path):
                    ids.append(row.id)
                    shard_rows += 1
                    copied = next(merged, None)
                    if copied is not None:
                        tally.add(copied)
                        if copied != row and len(problems) < 10:
                            problems.append(f"{RESULTS} row {tally.total - 1} differs from {path.relative_to(export_dir)}")
                _check_shard_ids(path, shard, ids)
            for copied in merged:
                tally.add(copied)
        duplicates = tally.duplicate_ids(results)
    except (OSError, json.JSONDecodeError, VerificationError) as err:
        tally.ids.close()
        return [f"cannot read the copy: {err}"]
    if duplicates:
        problems.append(f"duplicate ids in results: {duplicates[:10]}")
    problems += tally.problems
    recount = tally.summary(manifest["corpus"], duplicates)
    problems += recount_mismatches(summary, recount, ("total", "accepted", "rejected", "input_rows", "duplicate_rows"))
    if recount["accepted"] + recount["rejected"] != manifest["corpus"]["distinct_ids"]:
        problems.append(f"accepted + rejected = {recount['accepted'] + recount['rejected']} "
                        f"!= corpus distinct ids {manifest['corpus']['distinct_ids']}")
    if shard_rows != tally.total:
        problems.append(f"shard files hold {shard_rows} rows but results.jsonl {tally.total}")
    if version >= 2 or (export_dir / RESULTS_PARQUET).exists():
        problems += _parquet_equals_jsonl(export_dir / RESULTS_PARQUET, results)
    return problems
