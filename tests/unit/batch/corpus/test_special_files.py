"""Special files as documents (issue 28, item 8): only regular files are opened, reads are bounded, outside
paths are refused before any open; each such document is a rejected row with its reason.

Every case runs under a 20 s alarm: on the code before this change a FIFO blocked the plan in ``open`` and a
link to ``/dev/zero`` read forever, so a regression fails here instead of hanging the suite. The readers are the
real ones the batch plan, the shard reader and the pilot use.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from batch.corpus.plan import locate_corpus, plan_corpus
from batch.corpus.tabular import iter_csv
from batch.pilot.inputs import read_pilot_set
from classify.config.batch import CorpusConfig
from classify.config.sections import ClassifyConfig
from classify.documents.read import read_file_document
from classify.errors import InputError
from classify.runs.files import NotRegularFile, open_regular, read_regular
from tests.support.corpora import read_corpus


@pytest.fixture(autouse=True)
def _alarm():
    def hung(signum, frame):
        raise TimeoutError("blocked on a special file")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _specials(folder: Path) -> dict[str, str]:
    """Create special files in ``folder``; return ``{relative name: words its reason must hold}``."""
    os.mkfifo(folder / "fifo.txt")
    (folder / "zero.txt").symlink_to("/dev/zero")
    (folder / "urandom.txt").symlink_to("/dev/urandom")
    (folder / "null.txt").symlink_to("/dev/null")
    os.symlink(folder / "fifo.txt", folder / "link-to-fifo.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock.txt"))
    sock.close()
    return {"fifo.txt": "FIFO", "zero.txt": "character device", "urandom.txt": "character device",
            "null.txt": "character device", "link-to-fifo.txt": "FIFO", "sock.txt": "socket"}


def _folder_corpus(tmp_path: Path, name: str = "docs") -> tuple[Path, dict[str, str]]:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "a.txt").write_text("Shares rose sharply today.")
    (folder / "z.txt").write_text("The match ended two all.")
    return folder, _specials(folder)


def _check_rows(docs, expected: dict[str, str], good: set[str]) -> None:
    by_id = {d.id: d for d in docs}
    assert set(by_id) == set(expected) | good  # every file exactly once
    for name, words in expected.items():
        reason = by_id[name].reject_reason or ""
        assert by_id[name].text is None and reason.startswith("not a regular file") and words in reason, (name, reason)
    for name in good:
        assert by_id[name].reject_reason is None


def test_folder_corpus_special_files_are_rejected_rows_in_plan_and_shards(tmp_path):
    folder, expected = _folder_corpus(tmp_path)
    t0 = time.monotonic()
    corpus = read_corpus(CorpusConfig(path=str(folder)), 1000)  # plan_corpus + read_shard, as the batch driver
    assert time.monotonic() - t0 < 10
    _check_rows(corpus.docs, expected, {"a.txt", "z.txt"})
    assert read_corpus(CorpusConfig(path=str(folder)), 1000).fingerprint == corpus.fingerprint  # stable


def test_pilot_folder_reader_rejects_special_files_without_reading_them(tmp_path):
    _, expected = _folder_corpus(tmp_path / "pilot", "documents")  # the pilot's layout: documents/ beside labels.json
    (tmp_path / "pilot" / "labels.json").write_text(json.dumps({"a.txt": "business", "z.txt": "sport"}))
    docs, *_ = read_pilot_set(tmp_path / "pilot", ClassifyConfig(), len(expected) + 2)
    _check_rows(docs, expected, {"a.txt", "z.txt"})


def test_jsonl_path_records_special_and_outside_paths_never_opened(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "ok.txt").write_text("Shares rose.")
    expected = _specials(root)
    os.mkfifo(tmp_path / "outside-fifo.txt")  # outside the corpus folder: opening it would block the plan
    outside = {"out-fifo": "../outside-fifo.txt", "out-abs": "/dev/zero", "out-etc": "/etc/hostname",
               "out-up": "../../../../etc/passwd"}
    lines = [{"id": "ok", "path": "ok.txt"}] + [{"id": name, "path": name} for name in expected]
    lines += [{"id": doc_id, "path": rel} for doc_id, rel in outside.items()]
    jsonl = root / "c.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    docs = read_corpus(CorpusConfig(path=str(jsonl)), 1000).docs
    by_id = {d.id: d for d in docs}
    assert len(docs) == len(lines)
    assert by_id["ok"].reject_reason is None
    for name, words in expected.items():
        reason = by_id[name].reject_reason
        if (root / name).resolve().is_relative_to(root):  # a FIFO, a link to one, a socket inside the folder
            assert reason.startswith("not a regular file") and words in reason, reason
        else:  # a link to /dev/zero leaves the folder: refused as such, before any open
            assert "leaves the folder" in reason, reason
    for doc_id in outside:
        assert "leaves the folder" in by_id[doc_id].reject_reason, by_id[doc_id].reject_reason


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_corpus_file_that_is_a_fifo_or_device_is_a_clear_input_error(tmp_path, fmt):
    fifo = tmp_path / f"c.{fmt}"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        locate_corpus(CorpusConfig(path=str(fifo)))
    with pytest.raises(InputError, match="FIFO"):
        plan_corpus(CorpusConfig(path=str(fifo)), 10, 1 << 20)
    link = tmp_path / f"zero.{fmt}"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device"):
        locate_corpus(CorpusConfig(path=str(link)))


def test_pilot_jsonl_and_csv_inputs_that_are_fifos_are_refused(tmp_path):
    for name in ("p.jsonl", "p.csv"):
        os.mkfifo(tmp_path / name)
        with pytest.raises(InputError, match="not a regular file"):
            read_pilot_set(tmp_path / name, ClassifyConfig(), 12)
    with pytest.raises(InputError, match="not a regular file"):
        list(iter_csv(tmp_path / "p.csv", 1000))  # the CSV reader the benches use


def test_reads_are_bounded_by_max_doc_bytes(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 5000)
    assert len(read_regular(big, 100)) == 101  # never more than the limit + 1
    doc = read_file_document("big", big, 100)
    assert doc.text is None and doc.reject_reason.startswith("over size limit")
    with pytest.raises(NotRegularFile):
        open_regular("/dev/zero")
    with pytest.raises(NotRegularFile):
        open_regular(tmp_path)
