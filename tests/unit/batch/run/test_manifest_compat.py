"""A ``manifest.json`` written by an earlier docpilot (main at 67f6d5a, before the shard plan was a model) still
loads, resumes and is written back as the same JSON; a new plan of the same corpus is the same JSON too.

``data/manifest-67f6d5a.json`` holds one manifest per corpus format, captured from that commit
(:func:`write_corpora` builds the same corpora, byte for byte; the corpus folder is written ``<root>`` there).
To capture again, from a checkout of that commit: ``PYTHONPATH=<checkout> python tests/unit/batch/run/test_manifest_compat.py OUT.json``.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "data" / "manifest-67f6d5a.json"
CORPORA = ("c.jsonl", "c.csv", "c.parquet", "dir")
SHARD_DOCS = 3


def write_corpora(root: Path) -> None:
    """A JSONL corpus with duplicated ids (folded and skipped rows) and a lone surrogate in an id; CSV and Parquet
    with an id column; a folder of files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"d{i}", "text": f"text {i}"} for i in range(130)]
    for i in (7, 8, 30, 100):
        rows[i]["id"] = "d3"
    rows[31]["id"] = "d\udcff"
    (root / "c.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode())  # \udcff as a JSON escape
    tabular = [{"id": f"t{i % 8}", "text": f"row {i}"} for i in range(10)]  # t0 and t1 twice
    with (root / "c.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows([r["id"], r["text"]] for r in tabular)
    pq.write_table(pa.table({"id": [r["id"] for r in tabular], "text": [r["text"] for r in tabular]}), root / "c.parquet")
    (root / "dir").mkdir(exist_ok=True)
    for i in range(8):
        (root / "dir" / f"f{i}.txt").write_text(f"file {i}", encoding="utf-8")


def manifests(root: Path) -> dict[str, dict[str, Any]]:
    """``{corpus name: manifest JSON}`` of a new plan of each corpus, as the code on the import path writes it."""
    from batch.corpus.plan import plan_corpus
    from batch.runfiles import Manifest
    from classify.config.batch import CorpusConfig

    out = {}
    for name in CORPORA:
        plan = plan_corpus(CorpusConfig(path=str(root / name), id_column="id"), SHARD_DOCS, 1 << 20)
        manifest = Manifest(manifest_version=2, batch_id=f"b-{name}", created_at="2026-12-02T00:00:00+00:00",
                            corpus=plan.describe(), corpus_fingerprint=plan.fingerprint, shards=plan.shards,
                            pilot_gate={"override": False}, attempts=[{"started_at": "t0", "pid": 1}])
        out[name] = json.loads(json.dumps(manifest.to_json()).replace(json.dumps(str(root))[1:-1], "<root>"))
    return out


def _on_disk(manifest: dict[str, Any], root: Path) -> str:
    """The fixture's manifest as ``manifest.json`` text for a corpus under ``root``."""
    return json.dumps(manifest).replace("<root>", json.dumps(str(root))[1:-1])


@pytest.fixture(scope="module")
def captured() -> dict[str, dict[str, Any]]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_the_fixture_covers_every_optional_shard_key(captured):
    keys = {k for m in captured.values() for s in m["shards"] for k in s}
    assert {"offset", "end", "files", "bytes_sha256", "dups", "skip"} <= keys
    assert any("\\udcff" in json.dumps(s["first_id"]) for s in captured["c.jsonl"]["shards"])


@pytest.mark.parametrize("name", CORPORA)
def test_an_earlier_manifest_loads_and_is_written_back_as_the_same_json(tmp_path, captured, name):
    from batch import layout as mf
    from classify.runs.records import write_json_atomic

    run = tmp_path / "run"
    run.mkdir()
    (run / mf.MANIFEST).write_text(_on_disk(captured[name], tmp_path), encoding="utf-8")
    original = json.loads((run / mf.MANIFEST).read_text(encoding="utf-8"))
    manifest = mf.read_manifest(run)
    assert [s.index for s in manifest.shards] == list(range(len(original["shards"])))
    mf.write_manifest(run, manifest)
    assert json.loads((run / mf.MANIFEST).read_text(encoding="utf-8")) == original  # absent keys stay absent, no null
    again = tmp_path / "again.json"
    write_json_atomic(again, original)  # how the driver wrote the plan before it was a model
    assert (run / mf.MANIFEST).read_bytes() == again.read_bytes()


@pytest.mark.parametrize("name", CORPORA)
def test_a_new_plan_of_the_same_corpus_is_the_same_json(tmp_path, captured, name):
    write_corpora(tmp_path)
    assert manifests(tmp_path)[name] == captured[name]


@pytest.mark.parametrize("name", CORPORA)
def test_an_earlier_manifest_resumes_with_its_stored_plan(tmp_path, captured, name):
    """The resume path (:func:`batch.run.attempt.plan_or_reuse`) reuses the stored plan and reads its shards."""
    from batch import layout as mf
    from batch.corpus.plan import CorpusPlan, plan_corpus
    from batch.run.attempt import plan_or_reuse
    from classify.config.batch import BatchConfig, CorpusConfig

    write_corpora(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / mf.MANIFEST).write_text(_on_disk(captured[name], tmp_path), encoding="utf-8")
    old = mf.read_manifest(run)
    where = tmp_path / name
    stored = CorpusPlan.from_manifest(old, str(where))
    fresh = plan_corpus(CorpusConfig(path=str(where), id_column="id"), SHARD_DOCS, 1 << 20)
    docs = [d for s in stored.shards for d in stored.shard_payload(s, 10_000).documents(10_000)]
    assert docs == [d for s in fresh.shards for d in fresh.read_shard(s, 10_000)]
    assert len(docs) == captured[name]["corpus"]["distinct_ids"]
    cfg = BatchConfig.model_validate({"corpus": {"path": str(where), "id_column": "id"}, "batch": {"shard_docs": SHARD_DOCS}})
    reused = plan_or_reuse(cfg, where, stored.format, old, "b")
    if name != "dir":  # fingerprinted by the file's bytes alone (quick_fingerprint): the stored plan itself is reused
        assert reused.shards is old.shards
    else:  # planned again (a folder's fingerprint needs a pass over its files)
        assert reused.shards == old.shards


if __name__ == "__main__":  # capture the fixture with the docpilot on PYTHONPATH
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write_corpora(Path(tmp))
        Path(sys.argv[1]).write_text(json.dumps(manifests(Path(tmp)), indent=1, sort_keys=True) + "\n", encoding="utf-8")
