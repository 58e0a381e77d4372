"""Shared helpers of the batch tests (no tests here): a corpus from BBC test.csv plus planted bad documents."""

from __future__ import annotations

import csv
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT

# Planted documents and the reason prefix each must be rejected with.
PLANTED = {
    "bad-empty": "empty document",
    "bad-binary": "binary content",
    "bad-latin1": "not valid UTF-8",
    "bad-oversize": "over size limit",
    "bad-missing-file": "unreadable",
}


def bbc_rows(bbc_dir: Path, n: int | None) -> list[dict]:
    """The first ``n`` rows of BBC test.csv with ids ``bbc-test-NNNN`` (the README's convention)."""
    with (bbc_dir / "test.csv").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows = rows if n is None else rows[:n]
    return [{"id": f"bbc-test-{i:04d}", "text": r["text"], "category": r["category"]} for i, r in enumerate(rows)]


def make_corpus(folder: Path, bbc_dir: Path, n: int | None, max_doc_bytes: int = 200_000) -> dict:
    """Write ``corpus.jsonl`` (BBC articles + planted bad documents + a duplicated id + a broken line).

    Returns:
        ``{"path", "ids" (distinct ids expected in results), "input_rows", "duplicate_rows", "labels"}``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    files = folder / "files"
    files.mkdir(exist_ok=True)
    (files / "binary.dat").write_bytes(bytes(range(256)) * 4)
    (files / "latin1.txt").write_bytes("Caf\xe9 au lait, cr\xe8me br\xfbl\xe9e and news".encode("latin-1"))
    rows = bbc_rows(bbc_dir, n)
    lines = [{"id": r["id"], "text": r["text"]} for r in rows]
    lines += [
        {"id": "bad-empty", "text": ""},
        {"id": "bad-binary", "path": "files/binary.dat"},
        {"id": "bad-latin1", "path": "files/latin1.txt"},
        {"id": "bad-oversize", "text": "news " * (max_doc_bytes // 5 + 1)},
        {"id": "bad-missing-file", "path": "files/does-not-exist.txt"},
        {"id": "mojibake-ok", "text": "Shares rose to Â£3.9bn as the bank's profits beat forecasts."},
        {"id": rows[1]["id"], "text": "a second document claiming an id already used"},
    ]
    body = "".join(json.dumps(x) + "\n" for x in lines) + "{not json\n"
    path = folder / "corpus.jsonl"
    path.write_text(body, encoding="utf-8")
    ids = [r["id"] for r in rows] + list(PLANTED) + ["mojibake-ok", f"corpus.jsonl#L{len(lines) + 1}"]
    return {"path": path, "ids": ids, "input_rows": len(lines) + 1, "duplicate_rows": 1,
            "labels": {r["id"]: r["category"] for r in rows}, "dup_id": rows[1]["id"]}


def write_config(path: Path, **batch_fields) -> Path:
    """config/docpilot.json with the ``batch`` section's fields replaced."""
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["batch"].update(batch_fields)
    path.write_text(json.dumps(data, indent=2))
    return path


def kill_recorded(procs: list[dict]) -> None:
    """SIGKILL processes recorded in progress.json (pid + start time) that still run: test cleanup."""
    import psutil

    for rec in procs:
        try:
            proc = psutil.Process(rec["pid"])
            if abs(proc.create_time() - rec["create_time"]) < 0.01 and proc.pid != os.getpid():
                os.kill(proc.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError):
            pass


def fake_shards() -> list:
    """Three shards of four one-word documents ``d-0000`` .. ``d-0011``, for the scheduler tests."""
    from classify.records import Document

    docs = [Document(f"d-{i:04d}", "text", "", 4) for i in range(12)]
    return [(i, docs[4 * i:4 * i + 4]) for i in range(3)]


def news_rows(n: int, text: str = "news about markets " * 10) -> list[dict]:
    """``n`` corpus rows ``{"id": "d-00000", "text": text + "0"}`` .. (each text unique by its number)."""
    return [{"id": f"d-{i:05d}", "text": f"{text}{i}"} for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` one JSON object a line (UTF-8) to ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def numbered_texts(n: int) -> list[str]:
    """``n`` texts ``"Shares rose 0000 points today."`` .., the ones :func:`edit_in_place` edits."""
    return [f"Shares rose {i:04d} points today." for i in range(n)]


def write_texts(path: Path, texts: list[str]) -> None:
    """Write ``texts`` as a corpus with ids ``d-0000`` ..: JSONL, CSV or (any other suffix) Parquet in 50-row groups."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"id": f"d-{i:04d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    elif path.suffix == ".csv":
        path.write_text("id,text\n" + "".join(f"d-{i:04d},{t}\n" for i, t in enumerate(texts)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": [f"d-{i:04d}" for i in range(len(texts))], "text": texts}), path,
                       row_group_size=50, compression="none")


def edit_in_place(path: Path, row: int) -> None:
    """Change one character of row ``row``'s text, same length (what a same-length edit does to the bytes)."""
    old = f"Shares rose {row:04d}".encode()
    data = path.read_bytes()
    at = data.index(old)
    with path.open("r+b") as fh:
        fh.seek(at)
        fh.write(b"Shares ROSE")


def planned_shards(path: Path | str, shard_docs: int, max_doc_bytes: int = 200_000) -> list[tuple]:
    """The shard plan of a corpus as the batch makes it (:func:`batch.corpus.plan.plan_corpus`, cut every
    ``shard_docs`` rows), with each shard's documents.

    Returns:
        ``[(Shard, [Document, ...]), ...]`` in plan order.
    """
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    plan = plan_corpus(CorpusConfig(path=str(path)), shard_docs, 1 << 62, None, max_doc_bytes)
    return [(s, plan.read_shard(s, max_doc_bytes)) for s in plan.shards]


def output_rows(out: object) -> list[dict]:
    """The result rows of a :class:`batch.corpus.shard.ShardOutput` (its shard file's lines), in order."""
    return [json.loads(line) for line in out.body.splitlines() if line.strip()]  # type: ignore[attr-defined]


def train_texts(bbc_dir: Path, category: str | None = None) -> list[str]:
    """The texts of BBC train.csv (never test.csv: tests may choose among them), of one category when given."""
    with (bbc_dir / "train.csv").open(encoding="utf-8", newline="") as fh:
        return [r["text"] for r in csv.DictReader(fh) if category is None or r["category"] == category]


def long_document(tokenizer, bbc_dir: Path, n_tokens: int) -> str:
    """Real BBC train articles joined, then cut to a text of exactly ``n_tokens`` ids with ``tokenizer`` (issue 41's
    "document of 10x max_doc_tokens"): the decoded prefix of the joined ids that re-tokenizes to that many."""
    joined = ""
    for text in train_texts(bbc_dir):
        joined = f"{joined} {text}".strip()
        if len(joined) > 8 * n_tokens:
            break
    ids = tokenizer(joined, add_special_tokens=False)["input_ids"]
    for k in (n_tokens, n_tokens - 1, n_tokens + 1, n_tokens - 2, n_tokens + 2):
        text = tokenizer.decode(ids[:k])
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == n_tokens:
            return text
    raise AssertionError(f"no prefix of the joined articles re-tokenizes to exactly {n_tokens} ids")


@dataclass(frozen=True)
class Corpus:
    """A small corpus read whole into memory through the batch's own plan and shard reader (tests only).

    Attributes:
        path: the corpus file or folder (absolute).
        format: ``jsonl``, ``csv``, ``parquet`` or ``dir``.
        docs: one document per distinct id, in first-seen order (duplicates already rejected).
        input_rows: documents (rows, lines, files) read, duplicates included.
        fingerprint: ``sha256:<hex>`` over the corpus content.
    """

    path: str
    format: str
    docs: tuple
    input_rows: int
    fingerprint: str

    @property
    def duplicate_rows(self) -> int:
        """Input rows folded into an earlier row with the same id (``input_rows - distinct ids``)."""
        return self.input_rows - len(self.docs)

    def describe(self) -> dict:
        """A JSON-able summary for the manifest and summary (no document text)."""
        return {"path": self.path, "format": self.format, "input_rows": self.input_rows,
                "distinct_ids": len(self.docs), "duplicate_rows": self.duplicate_rows, "fingerprint": self.fingerprint}


def read_corpus(cfg, max_doc_bytes: int, path: str | Path | None = None) -> Corpus:
    """A whole corpus in memory: :func:`batch.corpus.plan.plan_corpus` in one shard, then its shard read
    (the batch driver's own plan and read, so the documents are the batch's)."""
    from batch.corpus.plan import plan_corpus

    plan = plan_corpus(cfg, 1 << 30, 1 << 62, path, max_doc_bytes)
    docs = tuple(d for s in plan.shards for d in plan.read_shard(s, max_doc_bytes))
    return Corpus(plan.path, plan.format, docs, plan.input_rows, plan.fingerprint)
