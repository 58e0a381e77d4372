"""What crosses Ray for one shard: raw corpus bytes out to the actor, the finished shard file back.

At corpus scale the driver must not parse, check or serialize documents one by one: it is one
Python process against a pool of actors. So, for a JSONL corpus (the format of large corpora):

* out: the driver reads the shard's byte range of the corpus file (one ``read``) and sends it as
  a :class:`ShardInput` holding those bytes; the engine actor parses it with the same reader the
  driver used to (:func:`classify.documents.read.jsonl_line_document`, with the plan's duplicate folding),
  so a document is read the same way wherever it runs;
* back: the actor returns a :class:`ShardOutput`, the shard file's bytes exactly as
  :func:`batch.layout.write_shard` would write them, with its counts and the sha256 of its
  ids; the driver checks that sha256 against the plan and writes the bytes (one ``write``, one
  ``fsync``).

CSV, Parquet, folders and JSONL with ``path`` records keep the driver-side reader (the
:class:`ShardInput` holds the documents read on the driver): a ``path`` record names a file the
actor's node may not see. Either way the actor calls :meth:`ShardInput.documents`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from classify.documents.read import jsonl_line_document
from classify.records import Document, Result
from classify.runs.files import ids_sha256
from classify.runs.records import jsonl_body


@dataclass(frozen=True)
class ShardInput:
    """One planned shard as it travels to an engine actor: JSONL bytes parsed there, or documents read on the driver.

    Build it with :meth:`of_jsonl` or :meth:`of_documents`; ``len()`` is its documents (the scheduler's
    deadline), :meth:`documents` gives them wherever it is called.

    Attributes:
        n_docs: documents in the shard after duplicate folding.
        docs: the documents read on the driver (``None``: the JSONL form).
        data: JSONL form: the shard's bytes of the corpus file (whole lines).
        name: JSONL form: the corpus file's name, escaped (sources read ``<name>#L<line>``).
        path: JSONL form: the corpus file's path as the driver sees it (for ``path`` records' folder and messages).
        first_line: JSONL form: line number (from 1) of the first line of ``data``.
        skip: JSONL form: line numbers left out (later copies of a duplicated id, folded into the first).
        dups: JSONL form: line number (as a string) -> reject reason of a duplicated id's first occurrence.
    """

    n_docs: int
    docs: tuple[Document, ...] | None = None
    data: bytes = b""
    name: str = ""
    path: str = ""
    first_line: int = 1
    skip: frozenset[int] = frozenset()
    dups: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_jsonl(cls, name: str, path: str, first_line: int, data: bytes, n_docs: int, *,
                 skip: frozenset[int] = frozenset(), dups: dict[str, str] | None = None) -> ShardInput:
        """A JSONL shard as bytes of the corpus file, parsed where it is classified (see the attributes)."""
        return cls(n_docs, None, data, name, path, first_line, skip, dict(dups or {}))

    @classmethod
    def of_documents(cls, docs: Iterable[Document]) -> ShardInput:
        """A shard read on the driver (CSV, Parquet, a folder, JSONL with ``path`` records)."""
        docs = tuple(docs)
        return cls(len(docs), docs)

    def __len__(self) -> int:
        return self.n_docs

    def documents(self, max_doc_bytes: int) -> list[Document]:
        """The shard's ``n_docs`` documents in corpus order (rejected ones carry their reason).

        Args:
            max_doc_bytes: size limit per document in bytes (``classify.max_doc_bytes``); the JSONL form is parsed
                with it, the documents read on the driver were already.
        """
        if self.docs is not None:
            return list(self.docs)
        return fold_shard(jsonl_documents(Path(self.path), self.name, self.first_line, self.data, max_doc_bytes),
                          self.skip, self.dups)


def jsonl_documents(path: Path, name: str, first_line: int, data: bytes, max_doc_bytes: int) -> Iterator[tuple[int, Document]]:
    """``(line number, document)`` for each non-blank line of a JSONL byte range (:func:`jsonl_line_document`).

    Args:
        path: the JSONL file (``path`` records are read relative to its folder).
        name: its name, escaped.
        first_line: line number (from 1) of the first line of ``data``.
        data: whole lines of the file.
        max_doc_bytes: size limit per document in bytes.
    """
    for lineno, raw in enumerate(jsonl_lines(data), start=first_line):
        if raw.strip():
            yield lineno, jsonl_line_document(path, name, lineno, raw, max_doc_bytes)[0]


def jsonl_lines(data: bytes) -> list[bytes]:
    """The lines of a JSONL byte range, each with its ``\n``, split on ``\n`` only.

    The plan pass and the whole-file reader split on ``\n`` only, so a shard must too: ``bytes.splitlines``
    also splits on a lone ``\r`` (JSON whitespace inside a record, or a file with old Mac line ends), which
    would give more rows than the plan counted and fail the shard's id check.
    """
    lines = data.split(b"\n")
    last = lines.pop()
    return [line + b"\n" for line in lines] + ([last] if last else [])


def fold_shard(pairs: Iterable[tuple[int, Document]], skip: Collection[int], dups: Mapping[str, str]) -> list[Document]:
    """A shard's documents with the plan's duplicate folding applied.

    Args:
        pairs: ``(row key, document)`` in corpus order (line number, row index or file index).
        skip: keys left out (later copies of a duplicated id).
        dups: key (as a string) -> reject reason of a duplicated id's first occurrence.
    """
    out = []
    for key, doc in pairs:
        if key in skip:
            continue
        if str(key) in dups:
            doc = Document(doc.id, None, doc.input_sha256, doc.n_chars, dups[str(key)], doc.source)
        out.append(doc)
    return out


@dataclass(frozen=True)
class ShardOutput:
    """A classified shard as it travels back to the driver.

    Attributes:
        body: the shard file's bytes (:func:`classify.runs.records.jsonl_body` of the results' rows).
        n_docs: results in ``body``.
        accepted: accepted results.
        rejected: rejected results.
        n_tokens: prompt tokens sent to the model.
        ids_sha256: :func:`classify.runs.files.ids_sha256` of the results' ids, in order.
    """

    body: bytes
    n_docs: int
    accepted: int
    rejected: int
    n_tokens: int
    ids_sha256: str

    @classmethod
    def of(cls, results: list[Result]) -> ShardOutput:
        """Serialize and count ``results`` (in the actor)."""
        return cls(jsonl_body([r.row() for r in results]), len(results),
                   sum(r.status == "accepted" for r in results), sum(r.status == "rejected" for r in results),
                   sum(int(r.n_tokens or 0) for r in results), ids_sha256([r.id for r in results]))
