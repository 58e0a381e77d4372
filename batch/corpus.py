"""Corpus readers for ``make batch``: JSONL, CSV and a folder of files, one document per distinct id.

Built on :mod:`classify.documents`, so a problem document (unreadable, empty, binary,
non-UTF-8, over the size limit) is a rejected document with a reason, never dropped;
an id given more than once becomes ONE rejected document naming every occurrence
(:func:`classify.documents.collapse_duplicates`). The corpus fingerprint covers every
input row (id, sha256 of its bytes, reject reason) in order, so any change to the
content, the ids or the reading options shows up on resume.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from batch._config import CorpusConfig
from classify.documents import collapse_duplicates, iter_csv, iter_directory, iter_jsonl
from classify.errors import InputError
from classify.records import Document


@dataclass(frozen=True)
class Corpus:
    """A corpus read into memory.

    Attributes:
        path: the corpus file or folder (absolute).
        format: ``jsonl``, ``csv`` or ``dir``.
        docs: one document per distinct id, in first-seen order (duplicates already rejected).
        input_rows: documents (rows, lines, files) read, duplicates included.
        fingerprint: ``sha256:<hex>`` over every input row's id, input sha256 and reject reason.
    """

    path: str
    format: str
    docs: tuple[Document, ...]
    input_rows: int
    fingerprint: str

    @property
    def duplicate_rows(self) -> int:
        """Input rows folded into an earlier row with the same id (``input_rows - distinct ids``)."""
        return self.input_rows - len(self.docs)

    def describe(self) -> dict:
        """A JSON-able summary for the manifest and summary (no document text)."""
        return {
            "path": self.path,
            "format": self.format,
            "input_rows": self.input_rows,
            "distinct_ids": len(self.docs),
            "duplicate_rows": self.duplicate_rows,
            "fingerprint": self.fingerprint,
        }


def detect_format(path: Path, fmt: str) -> str:
    """Resolve ``format: auto`` from the path.

    Args:
        path: corpus file or folder.
        fmt: the configured format.

    Returns:
        ``jsonl``, ``csv`` or ``dir``.

    Raises:
        InputError: the path does not exist, or ``auto`` cannot tell the format.
    """
    if not path.exists():
        raise InputError(f"corpus {path} does not exist (set `corpus.path` in the config or pass --corpus)")
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "dir"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise InputError(
        f"corpus {path}: cannot tell the format from suffix {suffix!r} (allowed: .jsonl, .ndjson, .csv, a folder); "
        "set `corpus.format`"
    )


def read_corpus(cfg: CorpusConfig, max_doc_bytes: int, path: str | Path | None = None) -> Corpus:
    """Read a corpus: every row becomes a document, every distinct id exactly one.

    Args:
        cfg: the ``corpus`` section of the batch config.
        max_doc_bytes: size limit per document in bytes (``classify.max_doc_bytes``).
        path: replaces ``cfg.path`` (the ``--corpus`` option).

    Returns:
        The :class:`Corpus`.

    Raises:
        InputError: missing path, unknown format, a folder given as a file (or back), a CSV
            without the text column, or a corpus with no documents at all.

    Example:
        >>> corpus = read_corpus(CorpusConfig(path="data/c.jsonl"), 200_000)  # doctest: +SKIP
    """
    where = Path(path if path is not None else cfg.path).expanduser().resolve()
    fmt = detect_format(where, cfg.format)
    if (fmt == "dir") != where.is_dir():
        raise InputError(f"corpus {where}: `corpus.format` is {fmt!r} but the path is {'a folder' if where.is_dir() else 'a file'}")
    if fmt == "jsonl":
        rows = [doc for doc, _ in iter_jsonl(where, max_doc_bytes)]
    elif fmt == "csv":
        rows = [doc for doc, _ in iter_csv(where, max_doc_bytes, cfg.text_column, cfg.id_column, cfg.id_prefix)]
    else:
        rows = list(iter_directory(where, max_doc_bytes, exclude=()))
    if not rows:
        raise InputError(f"corpus {where} holds no documents")
    digest = hashlib.sha256()
    for doc in rows:
        digest.update(f"{doc.id}\t{doc.input_sha256}\t{doc.reject_reason or ''}\n".encode("utf-8", "surrogatepass"))
    return Corpus(str(where), fmt, tuple(collapse_duplicates(rows)), len(rows), f"sha256:{digest.hexdigest()}")
