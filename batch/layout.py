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
Run folders of an earlier layout (``manifest_version`` 1: ``shards/NNNNN.jsonl``, a plan of positions
in a corpus read into memory) are refused by every reader (:func:`batch.runfiles.earlier_run_folder`).

This module holds the layout, the shard plan and shard files, and the manifest's resume rules
(``manifest.json`` and ``progress.json`` themselves are :mod:`batch.runfiles` models); merging the
shard files into the results and re-checking them is :mod:`batch.run.merge`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from batch.runfiles import (
    MANIFEST_VERSION as MANIFEST_VERSION,  # the layout version, defined with the model
)
from batch.runfiles import EarlierRunFolder, Manifest, Shard, earlier_run_folder
from classify.errors import InputError, VerificationError
from classify.records import Result
from classify.runs.accounting import row_problem
from classify.runs.files import ids_sha256
from classify.runs.records import write_jsonl_atomic

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
RESULTS = "results.jsonl"
RESULTS_PARQUET = "results.parquet"
SUMMARY = "summary.json"
ENVIRONMENT = "environment.json"  # the pilot's record of the machine: the doctor's findings, the cluster check
SHARDS = "shards"
SHARDS_PER_FOLDER = 1000
RESULT_COLUMNS = (("id", "string"), ("status", "string"), ("category", "string"), ("score", "float64"),
                  ("reason", "string"), ("input_sha256", "string"), ("n_chars", "int64"), ("n_tokens", "int64"),
                  ("n_doc_tokens", "int64"), ("n_windows", "int64"), ("truncated", "bool_"), ("dropped", "string"))
"""The columns of ``results.parquet`` (the fields of :class:`classify.records.Result`) and their Arrow types
(``dropped``: null on a row that does not carry it)."""


def shard_path(run_dir: Path, index: int) -> Path:
    """The file of shard ``index``: ``shards/GGG/NNNNNN.jsonl`` (``GGG`` = ``index // 1000``)."""
    return run_dir / SHARDS / f"{index // SHARDS_PER_FOLDER:03d}" / f"{index:06d}.jsonl"


def shard_files(run_dir: Path) -> Iterator[tuple[int, Path]]:
    """``(index, path)`` of every shard file in a run folder (temporary files skipped), in index order."""
    folder = run_dir / SHARDS
    if not folder.is_dir():
        return
    found = []
    for group in sorted(folder.iterdir()):
        if group.is_dir() and group.name.isdigit():
            found += [(int(p.stem), p) for p in group.glob("*.jsonl") if p.stem.isdigit()]
    yield from sorted(found)


def complete_shard_indexes(run_dir: Path, manifest: Manifest) -> list[int]:
    """Indexes of the planned shards whose file exists (a cheap listing; contents are checked by :func:`scan_done`)."""
    planned = {s.index for s in manifest.shards}
    return [i for i, _ in shard_files(run_dir) if i in planned]


def result_lines(path: Path) -> Iterator[tuple[bytes, Result]]:
    """``(raw line, its result)`` of each line of a shard or results file (bad records kept: :meth:`Result.from_json`)."""
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    yield line, Result.from_json(line)
                except json.JSONDecodeError as err:
                    raise VerificationError(f"{path}:{n}: not valid JSON: {err}") from None


def check_shard_ids(path: Path, shard: Shard, ids: list[str]) -> None:
    """Refuse a shard file whose ids are not its planned ones.

    Raises:
        VerificationError: naming the file, the counts and the planned id range; or the file and the row
            (1-based, blank lines not counted) of a row without a string id.
    """
    try:
        digest = ids_sha256(ids)
    except TypeError:  # a row without an id (None), or with a number or object for one
        n, bad = next((n, i) for n, i in enumerate(ids, start=1) if not isinstance(i, str))
        raise VerificationError(f"{path}: row {n} has no id (a string, not {bad!r}); remove the file to redo the shard") from None
    if digest != shard.ids_sha256:
        raise VerificationError(
            f"{path}: its {len(ids)} ids differ from the planned shard ({shard.n_docs} ids "
            f"{shard.first_id}..{shard.last_id}); remove the file to redo the shard"
        )


def scan_done(run_dir: Path, manifest: Manifest) -> dict[int, dict[str, int]]:
    """Check every complete shard file against the plan, one file at a time (the resume scan).

    Each row is checked on its own too (:func:`classify.runs.accounting.row_problem`: an accepted category outside the
    batch's allowed set, a rejection without a reason, an unknown status), so that a shard restored from an export
    (``--resume-from``) or left by an earlier attempt is refused now, not at the merge after the whole run.

    Args:
        run_dir: the run folder.
        manifest: its manifest.

    Returns:
        ``{shard index: {"docs", "accepted", "rejected"}}`` for the shards whose file exists.

    Raises:
        VerificationError: a shard file that is not in the plan, whose ids differ from the plan, or holding a row
            that breaks the batch's rules (the file, the row and its problem named).
    """
    planned = {s.index: s for s in manifest.shards}
    categories = manifest.categories
    done: dict[int, dict[str, int]] = {}
    for index, path in shard_files(run_dir):
        if index not in planned:
            raise VerificationError(f"{path}: not a shard of this batch's plan ({len(planned)} shards); remove it")
        ids, accepted, rejected = [], 0, 0
        for n, (_, row) in enumerate(result_lines(path), start=1):
            problem = row_problem(row, categories) if isinstance(row.id, str) else None  # no id: check_shard_ids says so
            if problem is not None:
                raise VerificationError(f"{path}: row {n}: {problem}: not written by this batch's engines (a damaged or "
                                        "altered shard); remove the file to redo the shard")
            ids.append(row.id)
            accepted += row.status == "accepted"
            rejected += row.status == "rejected"
        check_shard_ids(path, planned[index], ids)
        done[index] = {"docs": len(ids), "accepted": accepted, "rejected": rejected}
    return done


def read_manifest(run_dir: Path, doing: str = "read") -> Manifest | None:
    """The run folder's manifest, or ``None`` when the folder has none yet.

    Args:
        run_dir: the run folder.
        doing: what the caller would do with it, a verb for the refusal of an earlier layout (``"resume"``).

    Raises:
        InputError: a damaged manifest (:meth:`batch.runfiles.Manifest.read`).
        EarlierRunFolder: a run folder of an earlier layout (:func:`batch.runfiles.earlier_run_folder`,
            naming the folder when its manifest names no batch).
    """
    try:
        return Manifest.read(run_dir / MANIFEST)
    except EarlierRunFolder as err:
        raise earlier_run_folder(err.batch_id or run_dir.name, err.version, doing) from None


def write_manifest(run_dir: Path, manifest: Manifest | Mapping[str, Any]) -> None:
    """Write ``manifest.json`` atomically (a :class:`~batch.runfiles.Manifest` or its JSON object)."""
    Manifest.of(manifest).write(run_dir / MANIFEST)


def _dotted_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _dotted_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {json.dumps(old)} -> {json.dumps(new)}"]


def resume_changes(old: Manifest | Mapping[str, Any], new: Manifest | Mapping[str, Any]) -> list[str]:
    """What differs between a stored manifest and the one this run would write.

    Args:
        old: the manifest found in the run folder.
        new: the manifest built from the current corpus, config, model and adapter.

    Returns:
        One human-readable line per change (empty: the batch may resume).
    """
    old, new = Manifest.of(old), Manifest.of(new)
    changes = []
    if old.corpus_fingerprint != new.corpus_fingerprint:
        o, n = old.corpus, new.corpus
        changes.append(
            f"corpus changed: fingerprint {old.corpus_fingerprint} -> {new.corpus_fingerprint} "
            f"({o.get('input_rows')} -> {n.get('input_rows')} rows; {o.get('path')} -> {n.get('path')})"
        )
    if old.config_sha256 != new.config_sha256:
        fields = _dotted_diff(old.config, new.config)
        changes.append(f"config changed: {'; '.join(fields) or 'sha256 differs'}")
    if old.model_fingerprint != new.model_fingerprint:
        changes.append(f"model changed: {old.model.get('path')} {old.model_fingerprint} -> "
                       f"{new.model.get('path')} {new.model_fingerprint}")
    if old.adapter_sha256 != new.adapter_sha256:
        changes.append(f"adapter changed: {old.adapter or 'none'} ({old.adapter_sha256}) -> "
                       f"{new.adapter or 'none'} ({new.adapter_sha256})")
    return changes


def check_resume(run_dir: Path, old: Manifest | Mapping[str, Any], new: Manifest | Mapping[str, Any]) -> None:
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


def write_shard(run_dir: Path, index: int, rows: list[Result]) -> Path:
    """Write one complete shard atomically (temporary file, fsync, rename).

    Args:
        run_dir: the run folder.
        index: the shard's index in the plan.
        rows: its results (one JSON line each: :meth:`classify.records.Result.row`, keys sorted).

    Returns:
        The shard file's path.
    """
    path = shard_path(run_dir, index)
    write_jsonl_atomic(path, (r.row() for r in rows))
    return path


def streaming_parquet(path: Path) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` for reading a whole results file batch by batch in bounded memory.

    ``pre_buffer=False`` with a 1 MiB read buffer: with pyarrow's default pre-buffering, ``iter_batches``
    over a 3M-row ``results.parquet`` held about 0.13 GiB of Arrow memory (0.2 GiB of RSS), and more
    the larger the file; with these settings it stays near 0.03 GiB whatever the size.

    Raises:
        OSError, pyarrow.ArrowInvalid: the file cannot be opened or is not Parquet.
    """
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
