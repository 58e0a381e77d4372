"""Real batches over a corpus in object storage (issue 38, part 3): moto's S3 server on 127.0.0.1, the real Ray pool
and the instant stand-in engine (``bench/instant_engine.py``).

A JSONL, a CSV and a Parquet corpus read from ``s3://`` give the same results and the same accounting as the same
files read locally; an object replaced while the batch runs stops it as a resumable input error (exit 3, nothing
exported), and the rerun with the object put back reuses the stored plan and finishes every id exactly once.

Split by tier: the unit tests of the same subject are in ``tests/process/test_corpus_store.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch import layout as mf
from classify.errors import InputError
from tests.support.corpora import edit_in_place, numbered_texts, write_config, write_texts
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - the fixture

N = 400


def _upload(local: Path, key: str) -> str:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().put_file(str(local), f"{BUCKET}/{key}")
    return f"s3://{BUCKET}/{key}"


def _args(tmp_path: Path, corpus: str, batch_id: str):
    from batch.run.driver import parse_args

    config = write_config(tmp_path / f"{batch_id}.json", shard_docs=25, shard_target_bytes=100_000)
    data = json.loads(config.read_text())
    data["corpus"].update(id_column="id", label_column=None)
    config.write_text(json.dumps(data))
    return parse_args(["--config", str(config), "--corpus", corpus, "--batch-id", batch_id, "--skip-pilot-gate",
                       "--no-progress"])


def _batch(tmp_path, corpus: str, batch_id: str):
    from batch.run.driver import run_batch
    from bench.instant_engine import remote_class

    return run_batch(_args(tmp_path, corpus, batch_id), _engine_actor=remote_class())


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(tmp_path / "exports"))
    return tmp_path


ACCOUNTING = ("total", "accepted", "rejected", "input_rows", "duplicate_rows")


@pytest.mark.parametrize("suffix", [".jsonl", pytest.param(".csv", marks=pytest.mark.slow), ".parquet"])  # .csv: make test-slow
def test_a_store_corpus_gives_the_results_and_accounting_of_the_local_file(local_ray, lease_s3, dirs, suffix):  # noqa: F811
    from batch.run.export import check_export

    local = dirs / f"c{suffix}"
    write_texts(local, numbered_texts(N) + ["", numbered_texts(1)[0]])  # an empty document: one rejected row
    url = _upload(local, f"batch/c{suffix}")
    a = _batch(dirs, str(local), f"local{suffix[1:]}")
    b = _batch(dirs, url, f"store{suffix[1:]}")
    ra = (dirs / "runs" / f"local{suffix[1:]}" / mf.RESULTS).read_bytes()
    rb = (dirs / "runs" / f"store{suffix[1:]}" / mf.RESULTS).read_bytes()
    assert ra == rb and len(ra.splitlines()) == N + 2  # byte for byte: ids, answers, reasons (they name c<suffix>)
    assert {k: a.get(k) for k in ACCOUNTING} == {k: b.get(k) for k in ACCOUNTING}
    assert (b["total"], b["rejected"]) == (N + 2, 1)
    assert a["corpus"]["fingerprint"] == b["corpus"]["fingerprint"] and b["corpus"]["path"] == url
    manifest = json.loads((dirs / "runs" / f"store{suffix[1:]}" / mf.MANIFEST).read_text())
    assert manifest["corpus"]["reading"]["object"]["size"] == local.stat().st_size  # the object's identity
    assert check_export(Path(b["export_dir"])) == []


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_object_replaced_mid_run_stops_resumable_and_the_rerun_reuses_the_plan(
        local_ray, lease_s3, dirs, monkeypatch, suffix):  # noqa: F811
    import batch.run.attempt as attempt_mod

    local = dirs / f"c{suffix}"
    write_texts(local, numbered_texts(N))
    original = local.read_bytes()
    url = _upload(local, f"replaced-run/c{suffix}")
    real = attempt_mod.BatchRun.run_shards

    def replace_then_run(self, *a, **k):  # planned; now the object is replaced in the bucket while the batch runs
        edit_in_place(local, N - 5)
        _upload(local, f"replaced-run/c{suffix}")
        return real(self, *a, **k)

    monkeypatch.setattr(attempt_mod.BatchRun, "run_shards", replace_then_run)
    with pytest.raises(InputError, match=f"corpus {url} was replaced while the batch ran") as caught:
        _batch(dirs, url, "replaced")
    assert caught.value.exit_code == 3
    run_dir = dirs / "runs" / "replaced"
    assert "was replaced while the batch ran" in json.loads((run_dir / mf.MANIFEST).read_text())["attempts"][-1]["error"]
    assert not (run_dir / mf.SUMMARY).exists() and not (dirs / "exports" / "replaced").exists()

    monkeypatch.setattr(attempt_mod.BatchRun, "run_shards", real)
    local.write_bytes(original)
    _upload(local, f"replaced-run/c{suffix}")  # put back: the same bytes, the same identity

    def no_plan(*a, **k):
        raise AssertionError("the stored plan was not reused")

    monkeypatch.setattr(attempt_mod, "plan_corpus", no_plan)
    summary = _batch(dirs, url, "replaced")
    ids = [json.loads(line)["id"] for line in (run_dir / mf.RESULTS).read_text().splitlines()]
    assert ids == [f"d-{i:04d}" for i in range(N)] and summary["total"] == N
