"""The batch run folder: manifest, shard plan, atomic shard files, merge and summary.

Layout of ``runs/<batch-id>/``::

    manifest.json      corpus fingerprint, config sha256, model + adapter fingerprints,
                       shard plan, pilot-gate outcome, one entry per attempt
    shards/NNNNN.jsonl one result line per id of shard NNNNN, written atomically when complete
    progress.json      done/total, rejected, docs/s, ETA, last error (read by ``docpilot status``)
    results.jsonl      merged results, one line per distinct id (written at the end)
    summary.json       counts and invariants, throughput, wall time (written at the end)

A shard file exists only when its shard is complete (temporary file, fsync, rename), so a
resumed batch runs exactly the shards without a file: every id lands in exactly one shard file.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from classify.errors import InputError, VerificationError
from classify.records import Document
from classify.runrecords import read_jsonl, write_json_atomic, write_jsonl_atomic

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
SHARDS = "shards"
MANIFEST_VERSION = 1

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


def shard_path(run_dir: Path, index: int) -> Path:
    """``<run_dir>/shards/NNNNN.jsonl`` for shard ``index``."""
    return run_dir / SHARDS / f"{index:05d}.jsonl"


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


def completed_shards(run_dir: Path, plan: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Read every complete shard file and check it holds exactly its planned ids.

    Args:
        run_dir: the run folder.
        plan: the manifest's shard plan.

    Returns:
        ``{shard index: result rows}`` for the shards whose file exists.

    Raises:
        VerificationError: a shard file that is not in the plan, or whose ids differ from the plan.
    """
    planned = {s["index"]: s for s in plan}
    done: dict[int, list[dict[str, Any]]] = {}
    folder = run_dir / SHARDS
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        index = int(path.stem) if path.stem.isdigit() else -1
        if index not in planned:
            raise VerificationError(f"{path}: not a shard of this batch's plan ({len(plan)} shards); remove it")
        rows = read_jsonl(path)
        if ids_sha256([r.get("id") for r in rows]) != planned[index]["ids_sha256"]:
            raise VerificationError(
                f"{path}: its {len(rows)} ids differ from the planned shard ({planned[index]['n_docs']} ids "
                f"{planned[index]['first_id']}..{planned[index]['last_id']}); remove the file to redo the shard"
            )
        done[index] = rows
    return done


def write_shard(run_dir: Path, index: int, rows: list[dict[str, Any]]) -> Path:
    """Write one complete shard atomically (temporary file, fsync, rename).

    Returns:
        The shard file's path.
    """
    path = shard_path(run_dir, index)
    write_jsonl_atomic(path, rows)
    return path


def check_results(rows: list[dict[str, Any]], expected_ids: list[str] | None, categories: list[str]) -> list[str]:
    """The batch invariants over merged results.

    Args:
        rows: result records.
        expected_ids: the corpus's distinct ids (``None``: only checks that need no corpus).
        categories: the allowed categories.

    Returns:
        Problems found (empty list = all invariants hold).
    """
    problems = []
    counts = Counter(r.get("id") for r in rows)
    dups = sorted(i for i, n in counts.items() if n > 1)
    if dups:
        problems.append(f"duplicate ids in results: {dups[:10]}{' ...' if len(dups) > 10 else ''}")
    if expected_ids is not None:
        expected = set(expected_ids)
        unknown = sorted(set(counts) - expected)
        missing = sorted(expected - set(counts))
        if unknown:
            problems.append(f"unknown ids in results: {unknown[:10]}")
        if missing:
            problems.append(f"ids missing from results: {missing[:10]} ({len(missing)} in all)")
    for r in rows:
        if r.get("status") == "accepted" and r.get("category") not in categories:
            problems.append(f"id {r.get('id')}: accepted with category {r.get('category')!r} not in {categories}")
        elif r.get("status") == "rejected" and not r.get("reason"):
            problems.append(f"id {r.get('id')}: rejected without a reason")
        elif r.get("status") not in ("accepted", "rejected"):
            problems.append(f"id {r.get('id')}: status {r.get('status')!r} (allowed: accepted, rejected)")
    return problems


def summarize(rows: list[dict[str, Any]], corpus: dict[str, Any], categories: list[str]) -> dict[str, Any]:
    """Counts over merged results (throughput and wall time are added by the driver).

    Args:
        rows: merged result records.
        corpus: :meth:`batch.corpus.Corpus.describe`.
        categories: allowed categories.

    Returns:
        ``{total, accepted, rejected, input_rows, duplicate_rows, by_category, reject_reasons, ...}``.
    """
    counts = Counter(r["id"] for r in rows)
    reasons = Counter((r.get("reason") or "").split(":")[0] for r in rows if r["status"] == "rejected")
    return {
        "total": len(rows),
        "distinct_ids": corpus["distinct_ids"],
        "accepted": sum(r["status"] == "accepted" for r in rows),
        "rejected": sum(r["status"] == "rejected" for r in rows),
        "input_rows": corpus["input_rows"],
        "duplicate_rows": corpus["duplicate_rows"],
        "duplicate_ids": sorted(i for i, n in counts.items() if n > 1),
        "by_category": {c: sum(r.get("category") == c for r in rows) for c in categories},
        "reject_reasons": dict(sorted(reasons.items())),
        "n_tokens": sum(int(r.get("n_tokens") or 0) for r in rows),
    }


def check_export(export_dir: Path) -> list[str]:
    """Recompute the summary invariants from an export copy (for :func:`classify.runrecords.verify_export`).

    Checks: ids unique; accepted + rejected == total == distinct ids of the corpus; the shard files
    together hold exactly the merged results; summary counts equal the recount.

    Returns:
        Problems found (empty list = verified).
    """
    problems: list[str] = []
    try:
        manifest = json.loads((export_dir / MANIFEST).read_text(encoding="utf-8"))
        summary = json.loads((export_dir / SUMMARY).read_text(encoding="utf-8"))
        rows = read_jsonl(export_dir / RESULTS)
    except (OSError, json.JSONDecodeError, VerificationError) as err:
        return [f"cannot read the copy: {err}"]
    categories = manifest["config"]["classify"]["categories"]
    shard_rows = [r for s in manifest["shards"] for r in read_jsonl(shard_path(export_dir, s["index"]))]
    problems += check_results(rows, [r["id"] for r in shard_rows], categories)
    recount = summarize(rows, manifest["corpus"], categories)
    for key in ("total", "accepted", "rejected", "input_rows", "duplicate_rows"):
        if recount[key] != summary.get(key):
            problems.append(f"summary.json `{key}` is {summary.get(key)} but the copied results give {recount[key]}")
    if recount["accepted"] + recount["rejected"] != manifest["corpus"]["distinct_ids"]:
        problems.append(f"accepted + rejected = {recount['accepted'] + recount['rejected']} "
                        f"!= corpus distinct ids {manifest['corpus']['distinct_ids']}")
    if len(shard_rows) != len(rows):
        problems.append(f"shard files hold {len(shard_rows)} rows but results.jsonl {len(rows)}")
    return problems
