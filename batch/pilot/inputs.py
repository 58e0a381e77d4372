"""The pilot set read by the batch's own reader: where its documents are, its labels, and its size checks.

The documents are planned and read by :mod:`batch.corpus.plan` (:func:`~batch.corpus.plan.locate_corpus`,
:func:`~batch.corpus.plan.plan_corpus`, :meth:`~batch.corpus.plan.CorpusPlan.read_shard`), exactly as
``make batch`` reads a corpus: a folder (``documents/`` beside ``labels.json``/``labels.csv``), JSONL,
CSV or Parquet. Only the labels are the pilot's own: the labels file of a folder, or the first of
:data:`LABEL_KEYS` that is a column/key of a file (read by :mod:`batch.corpus.labels`, the batch's label reader).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from batch.corpus.labels import has_labels, iter_labels
from batch.corpus.plan import CorpusPlan, locate_corpus, plan_corpus
from classify.config.batch import BatchConfig
from classify.config.sections import ClassifyConfig
from classify.documents.read import LABEL_FILES
from classify.documents.text import escape_surrogates, refuse_wide_file
from classify.errors import InputError
from classify.records import Document

REJECT_LABEL = "reject"
LABEL_KEYS = ("label", "category", "expected")
"""The column (CSV, Parquet) or key (JSONL) of a pilot file's labels: the first one the file has."""


def pilot_corpus(input_path: Path, cfg: BatchConfig) -> tuple[BatchConfig, Path, str]:
    """The batch config the pilot runs under, with its ``corpus`` section pointed at the pilot set.

    The corpus reading options (``text_column``) are the batch config's; the pilot's files carry
    their ids in an ``id`` column/key (generated ids as the batch makes them when there is none), and
    labels are never read as ``corpus.label_column`` (the pilot reads its own, :func:`pilot_labels`).

    Args:
        input_path: the pilot set: a folder holding ``documents/`` and a labels file, or a
            ``.jsonl``, ``.csv`` or ``.parquet`` file.
        cfg: the batch config the pilot gates.

    Returns:
        ``(config, corpus path, format)`` as :func:`batch.corpus.plan.locate_corpus` checked them.

    Raises:
        InputError: a missing path, a folder without ``documents/``, or a file the batch reader refuses
            (unknown suffix, UTF-16/UTF-32 text).
    """
    if not input_path.exists():
        raise InputError(f"pilot input {input_path} does not exist")
    docs = input_path
    if input_path.is_dir():
        if (input_path / "documents").is_dir():
            docs = input_path / "documents"
        elif any((input_path / name).is_file() for name in LABEL_FILES):
            raise InputError(f"pilot input folder {input_path}: put the documents in {input_path / 'documents'}/ beside "
                             "the labels file (a folder corpus is every file in it, as `make batch` reads it)")
    corpus = cfg.corpus.model_copy(update={"path": str(docs), "format": "auto", "id_column": "id", "id_prefix": None,
                                           "label_column": None})
    run = cfg.model_copy(update={"corpus": corpus})
    where, fmt = locate_corpus(corpus, docs)
    return run, where, fmt


def _read_labels_file(folder: Path) -> dict[str, str]:
    for name in LABEL_FILES:
        path = folder / name
        if not path.is_file():
            continue
        refuse_wide_file(path)
        if name.endswith(".json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise InputError(f"{path}: not valid JSON: {err}") from None
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise InputError(f"{path}: must be a JSON object mapping each id to a category or 'reject'")
            return {escape_surrogates(str(k)): v for k, v in data.items()}  # keyed like the documents' ids
        with path.open(encoding="utf-8-sig", newline="") as fh:
            try:
                rows = list(csv.DictReader(fh, strict=True))
            except (csv.Error, UnicodeDecodeError) as err:
                raise InputError(f"{path}: malformed CSV or not UTF-8: {err}") from None
        if rows and not {"id", "label"} <= set(rows[0]):
            raise InputError(f"{path}: needs columns `id` and `label`, got {list(rows[0])}")
        return {r["id"]: r["label"] for r in rows}
    raise InputError(f"no labels file in {folder} (expected one of {', '.join(LABEL_FILES)})")


def pilot_labels(input_path: Path, plan: CorpusPlan) -> dict[str, str]:
    """The pilot set's expected labels: the folder's labels file, else the file's first :data:`LABEL_KEYS` column.

    Args:
        input_path: the pilot set as given.
        plan: its corpus plan (:func:`batch.corpus.plan.plan_corpus`).

    Returns:
        id -> category or ``"reject"``; ids without a label are missing (the ``labels_complete`` check names them).

    Raises:
        InputError: no or an unreadable labels file (a UTF-16/UTF-32 one is named with its ``iconv`` fix).
    """
    if plan.format == "dir":
        return _read_labels_file(input_path)
    for key in LABEL_KEYS:
        if has_labels(plan, key):
            return {i: lab for i, lab in iter_labels(plan, key) if lab is not None}
    return {}


def pilot_documents(plan: CorpusPlan, path: Path, cfg: ClassifyConfig, expected_documents: int) -> list[Document]:
    """Read the planned pilot set (:meth:`batch.corpus.plan.CorpusPlan.read_shard`) and check its size and ids.

    Args:
        plan: the pilot set's corpus plan.
        path: the pilot set as given (for messages).
        cfg: classify config (size limit).
        expected_documents: exact number of documents required (``thresholds.expected_documents``).

    Returns:
        The documents in plan order (the rows of ``results.jsonl``).

    Raises:
        InputError: duplicate ids, or not exactly ``expected_documents`` documents.
    """
    docs = [d for shard in plan.shards for d in plan.read_shard(shard, cfg.max_doc_bytes)]
    dups = [d for d in docs if (d.reject_reason or "").startswith("duplicate id:")]
    if dups:
        shown = "; ".join(f"{d.id!r} at {d.reject_reason}" for d in dups[:5])
        raise InputError(f"duplicate ids in pilot input {path}: {shown}; every document needs a unique id")
    if plan.input_rows != expected_documents:
        raise InputError(
            f"pilot input {path} holds {plan.input_rows} documents; the pilot needs exactly {expected_documents} "
            "(thresholds.expected_documents)"
        )
    return docs


def check_labels(labels: dict[str, str], cfg: ClassifyConfig) -> None:
    """Refuse a label that is neither an allowed category nor ``reject``.

    Raises:
        InputError: names the first such label and the allowed ones.
    """
    allowed = set(cfg.categories) | {REJECT_LABEL}
    bad = {k: v for k, v in labels.items() if v not in allowed}
    if bad:
        k, v = next(iter(bad.items()))
        raise InputError(f"label {v!r} for {k!r} is not an allowed category (allowed: {', '.join(sorted(allowed))})")


def read_pilot_set(path: Path, cfg: ClassifyConfig, expected_documents: int, batch_cfg: BatchConfig | None = None
                   ) -> tuple[list[Document], dict[str, str], BatchConfig, CorpusPlan]:
    """The pilot's ``read-inputs`` stage: the pilot set planned and read by the batch's reader, with its labels.

    Args:
        path: the pilot set (see :func:`pilot_corpus`).
        cfg: classify config (size limit, allowed categories).
        expected_documents: exact number of documents required.
        batch_cfg: the batch config the pilot gates (default: the defaults with ``cfg`` as ``classify``).

    Returns:
        ``(documents, labels, config, plan)``: the documents in plan order, id -> category or
        ``"reject"`` (may miss ids: the ``labels_complete`` check names them), the batch config with its
        corpus pointed at the pilot set, and the corpus plan the run uses.

    Raises:
        InputError: as :func:`pilot_corpus`, :func:`batch.corpus.plan.plan_corpus`, :func:`pilot_documents`,
            :func:`pilot_labels` and :func:`check_labels` (a label outside the allowed categories).
    """
    run_cfg, where, _ = pilot_corpus(Path(path), batch_cfg or BatchConfig(classify=cfg))
    plan = plan_corpus(run_cfg.corpus, run_cfg.batch.shard_docs, run_cfg.batch.shard_target_bytes, where,
                       cfg.max_doc_bytes)
    docs = pilot_documents(plan, Path(path), cfg, expected_documents)
    labels = pilot_labels(Path(path), plan)
    check_labels(labels, cfg)
    return docs, labels, run_cfg, plan
