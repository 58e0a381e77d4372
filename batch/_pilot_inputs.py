"""Reading a pilot set: a folder (``documents/`` + ``labels.json``), a JSONL or a CSV file, with its labels."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from classify.config import ClassifyConfig
from classify.documents import LABEL_FILES, find_duplicate_ids, iter_directory, iter_jsonl
from classify.errors import InputError
from classify.records import Document
from classify.tabular import iter_csv
from classify.textcheck import escape_surrogates, refuse_wide_file

REJECT_LABEL = "reject"
LABEL_KEYS = ("label", "category", "expected")


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


def _label_of(record: dict) -> str | None:
    for key in LABEL_KEYS:
        if isinstance(record.get(key), str) and record[key]:
            return escape_surrogates(record[key])  # a line that is not UTF-8 is read with its bad bytes escaped
    return None


def read_pilot_set(path: Path, cfg: ClassifyConfig, expected_documents: int) -> tuple[list[Document], dict[str, str]]:
    """Read the pilot documents and their expected labels.

    Args:
        path: a folder (documents in ``documents/`` or the folder itself, labels in
            ``labels.json``/``labels.csv``), a ``.jsonl`` file (``id``, ``text`` or ``path``, ``label``)
            or a ``.csv`` file (``id``, ``text``, ``label`` columns).
        cfg: classify config (size limit, allowed categories).
        expected_documents: exact number of documents required.

    Returns:
        ``(documents, labels)``; ``labels`` maps ids to a category or ``"reject"`` and may miss ids
        (the pilot's ``labels_complete`` check then fails and names them).

    Raises:
        InputError: missing path, empty folder, unsupported file type, wrong count, duplicate ids,
            an unreadable labels file (a UTF-16/UTF-32 one is named with its ``iconv`` fix), or a label
            outside the allowed categories.
    """
    if not path.exists():
        raise InputError(f"pilot input {path} does not exist")
    labels: dict[str, str] = {}
    if path.is_dir():
        docs_dir = path / "documents" if (path / "documents").is_dir() else path
        docs = list(iter_directory(docs_dir, cfg.max_doc_bytes))
        if not docs:
            raise InputError(f"pilot input folder {docs_dir} holds no documents")
        labels = _read_labels_file(path)
    elif path.suffix == ".jsonl":
        pairs = list(iter_jsonl(path, cfg.max_doc_bytes))
        docs = [d for d, _ in pairs]
        labels = {d.id: lab for d, rec in pairs if (lab := _label_of(rec)) is not None}
    elif path.suffix == ".csv":
        pairs = list(iter_csv(path, cfg.max_doc_bytes, text_column="text", id_column="id"))
        docs = [d for d, _ in pairs]
        labels = {d.id: lab for d, rec in pairs if (lab := _label_of(rec)) is not None}
    else:
        raise InputError(f"pilot input {path} must be a folder, a .jsonl or a .csv file")
    if not docs:
        raise InputError(f"pilot input {path} holds no documents")
    dups = find_duplicate_ids(docs)
    if dups:
        shown = "; ".join(f"{k!r} at {', '.join(v)}" for k, v in list(dups.items())[:5])
        raise InputError(f"duplicate ids in pilot input {path}: {shown}; every document needs a unique id")
    if len(docs) != expected_documents:
        raise InputError(
            f"pilot input {path} holds {len(docs)} documents; the pilot needs exactly {expected_documents} "
            "(thresholds.expected_documents)"
        )
    allowed = set(cfg.categories) | {REJECT_LABEL}
    bad = {k: v for k, v in labels.items() if v not in allowed}
    if bad:
        k, v = next(iter(bad.items()))
        raise InputError(f"label {v!r} for {k!r} is not an allowed category (allowed: {', '.join(sorted(allowed))})")
    return docs, labels
