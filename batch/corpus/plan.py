"""Corpus planning and reading for ``make batch``: one streaming pass plans the shards, shards are read when dispatched.

Formats: JSONL, CSV, Parquet and a folder of files, all through :mod:`classify.documents.read`, so
a problem document (unreadable, empty, binary, non-UTF-8, over the size limit) is a rejected
document with a reason, never dropped.

The driver never holds the corpus. :func:`plan_corpus` reads it once, row by row, and keeps
per shard only where its rows are (a byte range of a JSONL or CSV file, a row range of a
Parquet file, the file list of a folder), its id count, byte size and the sha256 of its ids.
Shards are cut by content: a shard closes when its documents reach ``shard_target_bytes`` or
``shard_docs`` documents. Each shard is read again (:meth:`CorpusPlan.read_shard`) only when it
is dispatched, so the driver holds the text of the shards in flight and no more.

Duplicate ids across the whole corpus: every row's id is hashed to 64 bits and the
``(hash, row)`` pairs go to 64 bucket files on disk (16 bytes per row); each bucket is then
sorted alone (:class:`IdHashBuckets`), so memory stays flat (about 1/64 of 16 bytes per row at
a time: 2.5 MB for 10M rows). Rows whose hash occurs twice are candidates; their shards are read
again to compare the real ids. A duplicated id becomes ONE rejected row at its first occurrence,
naming every occurrence (source and sha256); the later occurrences are skipped when their shard
is read (the plan lists them), so every distinct id is one result row.

The corpus fingerprint covers the content: sha256 over the file's bytes (JSONL; plus every file a
JSONL ``path`` record names), over the file's sha256 hex (CSV, Parquet:
:func:`batch.corpus.scan.tabular_fingerprint`), or over ``relative path, file sha256`` for each file of
a folder. A resume that finds the same fingerprint reuses the stored plan.

A corpus file may live in object storage (``s3://bucket/key``, any fsspec URL): it is read through
:class:`batch.corpus.source.StoreObject` by the same readers, streamed in byte ranges (JSONL, CSV) or row groups
(Parquet), never copied whole to local disk; the plan's ``reading["object"]`` records its identity (etag or
version, and size), which every shard read checks before the shard's own byte hash, and which lets a resume reuse
the plan without reading the object again. The fingerprint is the same as for the same bytes in a local file.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch.corpus.ids import IdHashBuckets
from batch.corpus.scan import (
    csv_rows,
    detect_format,
    dir_rows,
    jsonl_rows,
    parquet_docs,
    parquet_rows,
    tabular_fingerprint,
)
from batch.corpus.shard import ShardInput, fold_shard, jsonl_documents
from batch.corpus.source import StoreObject, corpus_file, identity_of, same_object, sha256_of
from batch.corpus.tabular import csv_header, csv_row_document, iter_csv_rows, parquet_columns
from batch.runfiles import Manifest, Shard
from classify.config.batch import CorpusConfig
from classify.documents.read import read_file_document
from classify.documents.text import checked_id, escape_surrogates, refuse_wide_file
from classify.errors import InputError
from classify.paths import path_hint
from classify.records import Document
from classify.runs import storage
from classify.runs.files import ids_sha256, special_kind
from classify.usercommand import user_flag

MIN_SHARDS = 32
"""A corpus file is cut into at least this many shards when its rows allow (16 actors with 2 in flight each)."""


def corpus_settings_for(cfg: CorpusConfig, path: str | Path | None) -> CorpusConfig:
    """The corpus settings of ``--corpus PATH`` (``make batch CORPUS=...``): ids come from that corpus's own settings.

    The config's ``corpus.id_prefix`` names the rows of the configured corpus (``<id_prefix>-NNNN``); another
    corpus given on the command line gets the default instead: ``<file stem>-NNNN``
    (``CORPUS=news.csv`` -> ``news-0000``, also for ``s3://bucket/news.csv``), or its own id column when
    ``corpus.id_column`` names one (a corpus without it is refused: :func:`require_id_column`). A URL is compared as written (never resolved as a local path).

    Args:
        cfg: the config's ``corpus`` section.
        path: the command line's corpus, or ``None`` (the configured one).

    Returns:
        ``cfg``, or a copy with ``id_prefix`` unset when ``path`` is another corpus than ``corpus.path``.

    Raises:
        InputError, ConfigError: an unset variable in ``corpus.path`` (:meth:`CorpusConfig.resolved_location`).
    """
    if path is None or cfg.id_prefix is None or cfg.path is None:
        return cfg
    return cfg if configured_corpus(cfg, path) else cfg.model_copy(update={"id_prefix": None})


def configured_corpus(cfg: CorpusConfig, path: str | Path) -> bool:
    """Whether ``path`` (``--corpus``) is the config's own ``corpus.path`` (a URL compared as written).

    Raises:
        InputError, ConfigError: an unset variable in ``corpus.path`` (:meth:`CorpusConfig.resolved_location`).
    """
    if cfg.path is None:
        return False
    configured, given = str(cfg.resolved_location()), str(path)
    if storage.is_url(configured) or storage.is_url(given):
        return configured.rstrip("/") == given.rstrip("/")
    return Path(configured).expanduser().resolve() == Path(given).expanduser().resolve()


def locate_corpus(cfg: CorpusConfig, path: str | Path | None = None) -> tuple[Path | StoreObject, str]:
    """The corpus's absolute path (or its object in a store) and format, checked.

    ``path`` (or ``corpus.path``) may be an object-storage URL (``s3://bucket/key``, any fsspec backend): the
    corpus is then a :class:`batch.corpus.source.StoreObject` whose identity (etag, version, size) is read here
    and checked on every later read.

    Raises:
        InputError: missing path, unknown format, a folder given as a file (or back), or a JSONL/CSV file
            in UTF-16 or UTF-32 (named with its ``iconv`` fix; checked here, before the model or Ray starts).
        StoreUnreachable: the store of a URL did not answer in time.
    """
    location = str(path) if path is not None else cfg.resolved_location()
    if storage.is_url(location):
        return _locate_object(cfg, location)
    where = Path(location).expanduser().resolve()
    if not where.exists():
        raise InputError(f"corpus {where} does not exist (set `corpus.path` in the config or pass {user_flag('--corpus', 'PATH')})"
                         f"{path_hint(cfg.path) if path is None else ''}")
    kind = special_kind(where.stat().st_mode)
    if kind is not None and kind != "a folder":  # never opened: a FIFO would block, /dev/zero never end
        raise InputError(f"corpus {where} is {kind}, not a regular file; give a JSONL, CSV or Parquet file, or a folder")
    fmt = detect_format(where, cfg.format)
    if (fmt == "dir") != where.is_dir():
        raise InputError(f"corpus {where}: `corpus.format` is {fmt!r} but the path is {'a folder' if where.is_dir() else 'a file'}")
    if fmt in ("jsonl", "csv"):
        refuse_wide_file(where)
    return where, fmt


def require_id_column(cfg: CorpusConfig, where: Path | StoreObject, fmt: str) -> None:
    """Refuse a CSV or Parquet corpus whose header lacks the ``corpus.id_column`` the config names.

    Without this check the ids would silently be generated row numbers (what ``id_column: null`` asks for),
    so results could not be joined back to the corpus's own ids. Called by ``docpilot batch`` before any shard
    runs (the pilot's own input reads ``id`` where it has one, and is not checked here).

    Raises:
        InputError: the column is absent: the message names it, the header's columns and ``id_column: null``.
    """
    if cfg.id_column is None or fmt not in ("csv", "parquet"):
        return
    try:
        if fmt == "csv":
            header = csv_header(where)[0]
        else:
            header = parquet_columns(where, cfg.text_column, None)[0].schema_arrow.names
    except InputError:
        return  # unreadable, or no text column: the plan refuses it with the same message
    if header and cfg.id_column not in header:  # an empty file: the plan refuses it, saying so
        raise InputError(f"corpus {where}: `corpus.id_column` is {cfg.id_column!r}, but the {fmt.upper()} header has "
                         f"no such column (its columns: {header}); name the id column it has, or set "
                         "`id_column: null` to generate ids <id_prefix>-<row, 4 digits>")


def _locate_object(cfg: CorpusConfig, url: str) -> tuple[StoreObject, str]:
    obj = StoreObject(url)
    info = obj.info()
    if info is None:
        raise InputError(f"corpus {url} does not exist in the store (set `corpus.path` in the config or pass {user_flag('--corpus', 'PATH')}; "
                         "credentials come from the store's usual environment and files)")
    if info.get("type") == "directory" or cfg.format == "dir":
        raise InputError(f"corpus {url}: a folder corpus under an object-storage prefix is not read yet; give one "
                         "JSONL, CSV or Parquet object, or copy the folder onto the machine")
    obj.expected = identity_of(info)
    fmt = detect_format(obj, cfg.format)  # type: ignore[arg-type]  # a StoreObject has the Path members it reads
    if fmt in ("jsonl", "csv"):
        refuse_wide_file(obj)  # type: ignore[arg-type]
    return obj, fmt


def quick_fingerprint(where: Path | StoreObject, fmt: str, described: dict[str, Any]) -> str | None:
    """The corpus fingerprint without planning, when the format allows it (else ``None``).

    JSONL without ``path`` records, CSV and Parquet are fingerprinted by their bytes alone, so a
    resume checks the corpus in one sequential read and reuses the stored plan. The value is the
    planning pass's (:func:`plan_corpus`): ``sha256:<file sha256>`` for JSONL,
    :func:`batch.corpus.scan.tabular_fingerprint` of it for CSV and Parquet.

    Args:
        where: the corpus path.
        fmt: its format.
        described: the stored manifest's ``corpus`` entry (``has_path_records`` for JSONL).

    A store object whose identity (etag or version, and size) is the one the plan recorded is not read at all:
    the stored fingerprint is returned (each shard's bytes are still checked when read).

    Returns:
        ``sha256:<hex>``, or ``None`` for a folder or a JSONL file with ``path`` records (those need a plan).
    """
    if isinstance(where, StoreObject) and same_object(where.expected, (described.get("reading") or {}).get("object")):
        return described.get("fingerprint")
    if fmt in ("csv", "parquet"):
        return tabular_fingerprint(sha256_of(where))
    if fmt == "jsonl" and not described.get("has_path_records", True):
        return f"sha256:{sha256_of(where)}"
    return None


@dataclass
class CorpusPlan:
    """A planned corpus: where every shard's rows are, never the text.

    Attributes:
        path: the corpus file or folder (absolute).
        format: ``jsonl``, ``csv``, ``parquet`` or ``dir``.
        fingerprint: ``sha256:<hex>`` over the corpus content (see the module docstring).
        input_rows: rows (lines, records, files) read, duplicates included.
        duplicate_rows: rows skipped because an earlier row has the same id.
        shards: the shard plan, one :class:`batch.runfiles.Shard` per shard (``index, n_docs, n_rows, bytes,
            ids_sha256, first_id, last_id``, the location keys of the format, ``dups`` and ``skip``).
        reading: format details the readers need again (CSV header, column names, id prefix).
    """

    path: str
    format: str
    fingerprint: str
    input_rows: int
    duplicate_rows: int
    shards: list[Shard]
    reading: dict[str, Any] = field(default_factory=dict)

    @property
    def distinct_ids(self) -> int:
        """Distinct ids = result rows of the batch."""
        return self.input_rows - self.duplicate_rows

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for the manifest and summary (no document text)."""
        return {"path": self.path, "format": self.format, "input_rows": self.input_rows,
                "distinct_ids": self.distinct_ids, "duplicate_rows": self.duplicate_rows,
                "fingerprint": self.fingerprint, "reading": self.reading,
                "has_path_records": bool(self.reading.get("has_path_records", False)),
                "bytes": sum(s.bytes for s in self.shards)}

    @classmethod
    def from_manifest(cls, manifest: Manifest, path: str | None = None) -> CorpusPlan:
        """The plan stored in a (version 2) manifest (its shards, not copies); ``path`` replaces the stored corpus path."""
        c = manifest.corpus
        return cls(path or c["path"], c["format"], c["fingerprint"], c["input_rows"], c["duplicate_rows"],
                   manifest.shards, c.get("reading") or {})

    def read_shard(self, shard: Shard, max_doc_bytes: int) -> list[Document]:
        """The documents of one planned shard, in corpus order (duplicates folded as planned).

        Args:
            shard: one entry of :attr:`shards`.
            max_doc_bytes: size limit per document in bytes.

        Returns:
            ``shard.n_docs`` documents.
        """
        return fold_shard(self._iter_shard(shard, max_doc_bytes), set(shard.skip), shard.dups)

    def shard_payload(self, shard: Shard, max_doc_bytes: int) -> ShardInput:
        """What the driver sends an engine actor for ``shard`` (:class:`batch.corpus.shard.ShardInput`): its raw
        bytes for a JSONL corpus (parsed by the actor), else :meth:`read_shard`'s documents.

        A JSONL corpus with ``path`` records is read here: those files may not be visible on the actor's node.

        Raises:
            InputError: the shard's bytes are not those planned (:func:`check_shard_bytes`), or, read here, as
                :meth:`read_shard`.
        """
        if self.format != "jsonl" or self.reading.get("has_path_records"):
            return ShardInput.of_documents(self.read_shard(shard, max_doc_bytes))
        path = self.file()
        return ShardInput.of_jsonl(escape_surrogates(path.name), str(path), shard.row, self._byte_range(shard), shard.n_docs,
                                   skip=frozenset(shard.skip), dups=dict(shard.dups))

    def file(self) -> Path | StoreObject:
        """The corpus as its readers open it: a local path, or the store object checked against the plan's identity."""
        return corpus_file(self.path, self.reading)

    def lazy(self, shard: Shard, max_doc_bytes: int) -> PendingShard:
        """``shard`` as the pool is given it: read (:meth:`shard_payload`) only when it is dispatched."""
        return PendingShard(self, shard, max_doc_bytes)

    def _byte_range(self, shard: Shard) -> bytes:
        """The bytes of a JSONL or CSV shard (whole lines or records), checked against the plan's ``bytes_sha256``.

        Raises:
            InputError: the bytes differ from those planned: the corpus was edited while the batch ran
                (:func:`check_shard_bytes`).
        """
        with self.file().open("rb") as fh:
            fh.seek(shard.offset)
            data = fh.read(shard.end - shard.offset)
        check_shard_bytes(self.path, shard, data)
        return data

    def _iter_shard(self, shard: Shard, max_doc_bytes: int) -> Iterator[tuple[int, Document]]:
        path: Any = self.file()
        if self.format == "jsonl":
            yield from jsonl_documents(path, escape_surrogates(path.name), shard.row, self._byte_range(shard), max_doc_bytes)
        elif self.format == "csv":
            self._byte_range(shard)  # checked against the plan before its records are parsed
            r = self.reading
            for row in iter_csv_rows(path, r["text_column"], id_column=r["id_column"], id_prefix=r["id_prefix"],
                                     offset=shard.offset, first_index=shard.row, max_rows=shard.n_rows, header=r["header"]):
                yield row.index, csv_row_document(row, max_doc_bytes)
        elif self.format == "parquet":
            yield from parquet_docs(path, self.reading, shard.row, shard.n_rows, max_doc_bytes)
        else:
            for key, rel in enumerate(shard.files or (), start=shard.row):
                yield key, checked_id(read_file_document(rel, path / rel, max_doc_bytes))


def check_shard_bytes(path: str | Path, shard: Shard, data: bytes) -> None:
    """Refuse a shard whose bytes are not those the plan hashed (a plan without ``bytes_sha256`` is not checked).

    Args:
        path: the corpus file, for the message.
        shard: the planned shard (``offset``, ``end``, ``bytes_sha256``).
        data: the bytes just read.

    Raises:
        InputError: the corpus changed while the batch ran: the batch stops (resumable) before the shard is
            classified, so no result and no export claims a corpus it was not computed from.
    """
    want = shard.bytes_sha256
    if want is None or hashlib.sha256(data).hexdigest() == want:
        return
    raise InputError(
        f"corpus {path} changed while the batch ran: shard {shard.index} (bytes {shard.offset}..{shard.end}, "
        f"rows from {shard.first_id!r}) no longer holds the bytes the plan read; nothing of it was classified. "
        "Restore the corpus and rerun the same command (complete shards are kept), or start a new batch id for the "
        "edited corpus")


def _hash_shard_ranges(where: Path | StoreObject, shards: list[Shard]) -> None:
    """Record ``bytes_sha256`` of each JSONL/CSV shard's byte range (one sequential read of the file)."""
    with where.open("rb") as fh:
        for shard in shards:
            fh.seek(shard.offset)
            digest, left = hashlib.sha256(), shard.end - shard.offset
            while left > 0 and (block := fh.read(min(left, 8 << 20))):
                digest.update(block)
                left -= len(block)
            shard.bytes_sha256 = digest.hexdigest()


def plan_corpus(cfg: CorpusConfig, shard_docs: int, shard_target_bytes: int, path: str | Path | None = None,
                max_doc_bytes: int = 200_000) -> CorpusPlan:
    """Plan a corpus in one streaming pass: fingerprint, duplicate ids and content-sized shards.

    Args:
        cfg: the ``corpus`` section of the batch config.
        shard_docs: at most this many rows per shard (``batch.shard_docs``).
        shard_target_bytes: a shard closes once its rows hold this many bytes (``batch.shard_target_bytes``);
            for a corpus file smaller than ``2 x MIN_SHARDS x shard_target_bytes`` the target shrinks to
            ``file size / (2 x MIN_SHARDS)`` (a shard closes only once it passes the target, and a row's
            size counts its text, not its whole line), so a small corpus still makes at least
            ``MIN_SHARDS`` shards to spread over the actors.
        path: replaces ``cfg.path`` (the ``--corpus`` option).
        max_doc_bytes: size limit per document (``classify.max_doc_bytes``), for the duplicate check's
            re-read of candidate shards.

    Returns:
        The :class:`CorpusPlan`.

    Raises:
        InputError: missing path, unknown format, a UTF-16/32 or malformed file, a CSV or Parquet
            file without the text column, or a corpus with no documents at all.

    Example:
        >>> plan = plan_corpus(CorpusConfig(path="data/c.jsonl"), 1000, 4 << 20)  # doctest: +SKIP
        >>> docs = plan.read_shard(plan.shards[0], 200_000)  # doctest: +SKIP
    """
    where, fmt = locate_corpus(cfg, path)
    if fmt != "dir":  # a small corpus still makes enough shards to keep every actor busy
        shard_target_bytes = max(1, min(shard_target_bytes, where.stat().st_size // (2 * MIN_SHARDS)))
    digest = hashlib.sha256()
    reading: dict[str, Any] = {}
    if fmt == "jsonl":
        rows = jsonl_rows(where, digest, reading)
    elif fmt == "csv":
        rows = csv_rows(where, cfg, digest, reading)
    elif fmt == "parquet":
        rows = parquet_rows(where, cfg, digest, reading)
    else:
        rows = dir_rows(where, digest)
    buckets = IdHashBuckets()
    shards: list[Shard] = []
    first_seq: list[int] = []  # row sequence number of each shard's first row
    seq = 0
    try:
        current: dict[str, Any] | None = None
        ids_digest = hashlib.sha256()
        start_pos: int | None = None
        start_key: int | None = None
        for row in rows:
            if current is None:
                if start_pos is None:
                    start_pos, start_key = reading.get("data_offset", 0), (1 if fmt == "jsonl" else row.key)
                current = {"index": len(shards), "row": start_key if fmt == "jsonl" else row.key, "n_rows": 0, "bytes": 0, "first_id": row.doc_id}
                if fmt in ("jsonl", "csv"):
                    current["offset"] = start_pos
                if fmt == "dir":
                    current["files"] = []
                ids_digest = hashlib.sha256(row.doc_id.encode("utf-8", "surrogatepass"))
                first_seq.append(seq)
            else:
                ids_digest.update(b"\n" + row.doc_id.encode("utf-8", "surrogatepass"))
            current["n_rows"] += 1
            current["bytes"] += row.size
            current["last_id"] = row.doc_id
            if fmt == "dir":
                current["files"].append(row.rel)
            buckets.add(row.doc_id, seq)
            seq += 1
            start_pos, start_key = row.end, row.next_key
            if current["n_rows"] >= shard_docs or current["bytes"] >= shard_target_bytes:
                shards.append(_close(current, ids_digest, start_pos, fmt))
                current = None
        if current is not None:
            shards.append(_close(current, ids_digest, start_pos or 0, fmt))
        candidates = buckets.candidate_rows()
    finally:
        buckets.close()
    if not shards:
        raise InputError(f"corpus {where} holds no documents")
    if fmt in ("jsonl", "csv"):  # what each shard's read is checked against (a corpus edited mid-run is refused)
        _hash_shard_ranges(where, shards)
    if isinstance(where, StoreObject):  # the object's identity, checked on every later read (and by a resume)
        reading["object"] = where.expected
    plan = CorpusPlan(str(where), fmt, f"sha256:{digest.hexdigest()}", seq, 0, shards, reading)
    if candidates:
        fold_duplicates(plan, candidates, first_seq, max_doc_bytes)
    return plan


def _close(cut: dict[str, Any], ids_digest: Any, end: int, fmt: str) -> Shard:
    """The planned :class:`Shard` of the rows counted in ``cut`` (the keys set there, and these: no other key is set)."""
    if fmt in ("jsonl", "csv"):
        cut["end"] = end
    return Shard(**cut, n_docs=cut["n_rows"], ids_sha256=ids_digest.hexdigest())


@dataclass
class PendingShard:
    """A planned shard that the pool reads only when it dispatches it (:meth:`CorpusPlan.lazy`).

    ``len()`` is its documents (the pool's deadline); :meth:`load` reads it (:meth:`CorpusPlan.shard_payload`),
    so the driver holds the text of the shards in flight and no more.
    """

    corpus: CorpusPlan
    shard: Shard
    max_doc_bytes: int

    def __len__(self) -> int:
        return self.shard.n_docs

    def load(self) -> ShardInput:
        """The shard read from the corpus now (raises as :meth:`CorpusPlan.shard_payload`)."""
        return self.corpus.shard_payload(self.shard, self.max_doc_bytes)


def fold_duplicates(plan: CorpusPlan, candidates: list[int], first_seq: list[int], max_doc_bytes: int) -> None:
    """Compare the real ids of the candidate rows; mark each duplicated id's first row rejected and skip the others."""
    by_shard: dict[int, set[int]] = {}
    for seq in candidates:
        index = bisect.bisect_right(first_seq, seq) - 1
        by_shard.setdefault(index, set()).add(seq - first_seq[index])
    seen: dict[str, list[tuple[int, int, Document]]] = {}  # id -> [(shard, key, doc)]
    for index in sorted(by_shard):
        shard = plan.shards[index]
        for pos, (key, doc) in enumerate(plan._iter_shard(shard, max_doc_bytes)):  # noqa: SLF001
            if pos in by_shard[index]:
                seen.setdefault(doc.id, []).append((index, key, doc))
    touched: set[int] = set()
    for occurrences in seen.values():
        if len(occurrences) < 2:
            continue  # a 64-bit hash collision between different ids
        sources = [d.source or d.id for _, _, d in occurrences]
        shas = [d.input_sha256[:12] for _, _, d in occurrences]
        reason = (f"duplicate id: given {len(occurrences)} times ({', '.join(sources)}; "
                  f"sha256 {', '.join(shas)}); give each document a unique id")
        first_shard, first_key, _ = occurrences[0]
        plan.shards[first_shard].fold_first(first_key, reason)
        for index, key, _ in occurrences[1:]:
            plan.shards[index].fold_later(key)
            touched.add(index)
        plan.duplicate_rows += len(occurrences) - 1
    for index in touched:  # recount the shards that lost rows, and their ids hash
        shard = plan.shards[index]
        ids = [d.id for d in plan.read_shard(shard, max_doc_bytes)]
        shard.n_docs = len(ids)
        shard.ids_sha256 = ids_sha256(ids)
        if ids:
            shard.first_id, shard.last_id = ids[0], ids[-1]
    if any(s.n_docs == 0 for s in plan.shards):  # every row of a shard was a later duplicate
        plan.shards = [s for s in plan.shards if s.n_docs]
        for i, shard in enumerate(plan.shards):
            shard.index = i
