"""A corpus in object storage (issue 38, part 3) against moto's S3 server on 127.0.0.1, without Ray.

The same JSONL, CSV and Parquet files are planned and read locally and from ``s3://``: the plans and every
shard's documents are the same, the plan records the object's identity, an object replaced after planning
is an input error naming it, a resume whose object is unchanged reuses the plan without reading the object,
and nothing is copied to local disk. Split by tier: the real batches are in ``tests/ray/test_corpus_store_ray.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.corpora import edit_in_place, numbered_texts, write_texts
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - the fixture

N = 300


def _upload(local: Path, key: str) -> str:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().put_file(str(local), f"{BUCKET}/{key}")
    return f"s3://{BUCKET}/{key}"


def _plan(where: str | Path):
    from batch.corpus.plan import plan_corpus
    from classify.config.batch import CorpusConfig

    return plan_corpus(CorpusConfig(path=str(where), id_column="id"), 40, 1 << 20)


def _docs(plan) -> list[tuple]:
    return [(d.id, d.text, d.input_sha256, d.reject_reason, d.source) for s in plan.shards
            for d in plan.read_shard(s, 10_000)]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_store_corpus_plans_and_reads_as_the_same_local_file(tmp_path, lease_s3, suffix):  # noqa: F811
    local = tmp_path / f"c{suffix}"
    write_texts(local, numbered_texts(N) + ["", "x" * 20_000])  # an empty and an over-long document: rejected rows
    url = _upload(local, f"same/c{suffix}")
    a, b = _plan(local), _plan(url)
    assert b.path == url and a.fingerprint == b.fingerprint  # the fingerprint is the bytes', wherever they are
    assert [s.to_json() for s in a.shards] == [s.to_json() for s in b.shards] and len(a.shards) > 5
    assert (a.input_rows, a.distinct_ids) == (b.input_rows, b.distinct_ids) == (N + 2, N + 2)
    docs = _docs(b)
    assert docs == _docs(a) and sum(d[3] is not None for d in docs) == 2
    obj = b.describe()["reading"]["object"]
    assert obj["size"] == local.stat().st_size and obj["etag"].strip('"')  # the identity the store gave
    assert "object" not in a.reading
    if suffix == ".jsonl":  # an actor gets the same bytes as from the local file
        assert b.shard_payload(b.shards[3], 10_000).data == a.shard_payload(a.shards[3], 10_000).data


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_an_object_replaced_after_planning_is_an_input_error_naming_it(tmp_path, lease_s3, suffix):  # noqa: F811
    from classify.errors import InputError

    local = tmp_path / f"c{suffix}"
    write_texts(local, numbered_texts(N))
    url = _upload(local, f"replaced/c{suffix}")
    plan = _plan(url)
    assert len(plan.read_shard(plan.shards[0], 10_000)) == plan.shards[0].n_docs
    edit_in_place(local, N - 5)  # same length: only the identity (and the shard's bytes) can tell
    _upload(local, f"replaced/c{suffix}")
    for shard in (plan.shards[0], plan.shards[-1]):
        with pytest.raises(InputError, match=f"corpus {url} was replaced while the batch ran") as err:
            plan.read_shard(shard, 10_000)
        assert err.value.exit_code == 3 and "rerun the same command" in str(err.value)


def test_a_removed_object_and_a_missing_one_are_input_errors(tmp_path, lease_s3):  # noqa: F811
    import s3fs

    from classify.errors import InputError

    local = tmp_path / "c.jsonl"
    write_texts(local, numbered_texts(N))
    url = _upload(local, "gone/c.jsonl")
    plan = _plan(url)
    s3fs.S3FileSystem().rm_file(f"{BUCKET}/gone/c.jsonl")
    with pytest.raises(InputError, match="no longer exists in the store"):
        plan.read_shard(plan.shards[1], 10_000)
    with pytest.raises(InputError, match=f"corpus s3://{BUCKET}/nothing.jsonl does not exist in the store"):
        _plan(f"s3://{BUCKET}/nothing.jsonl")


def test_path_records_and_a_prefix_are_refused_for_a_store_corpus(tmp_path, lease_s3):  # noqa: F811
    from classify.errors import InputError

    local = tmp_path / "p.jsonl"
    local.write_text('{"id": "a", "text": "t"}\n{"id": "b", "path": "b.txt"}\n')
    url = _upload(local, "records/p.jsonl")
    with pytest.raises(InputError, match=r"line 2 is a `path` record; a JSONL corpus in object storage"):
        _plan(url)
    with pytest.raises(InputError, match="a folder corpus under an object-storage prefix is not read yet"):
        _plan(f"s3://{BUCKET}/records")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_resume_with_the_same_object_reuses_the_plan_without_reading_it(tmp_path, lease_s3, monkeypatch, suffix):  # noqa: F811
    from batch.corpus import source
    from batch.corpus.plan import locate_corpus
    from batch.run import attempt
    from batch.runfiles import MANIFEST_VERSION, Manifest
    from classify.config.batch import BatchConfig

    local = tmp_path / f"c{suffix}"
    write_texts(local, numbered_texts(N))
    url = _upload(local, f"resume/c{suffix}")
    cfg = BatchConfig.model_validate({"corpus": {"path": url, "id_column": "id"},
                                      "batch": {"shard_docs": 40, "shard_target_bytes": 1 << 20}})
    where, fmt = locate_corpus(cfg.corpus)
    plan = attempt.plan_or_reuse(cfg, where, fmt, None, "b")
    old = Manifest(manifest_version=MANIFEST_VERSION, batch_id="b", created_at="now", corpus=plan.describe(),
                   corpus_fingerprint=plan.fingerprint, config={}, config_sha256="c", model={}, model_fingerprint="m",
                   shards=plan.shards, attempts=[])
    opened: list[str] = []
    real_open = source.StoreObject.open

    class PlannedAgain(Exception):
        pass

    def plan_again(*a, **k):
        raise PlannedAgain

    monkeypatch.setattr(attempt, "plan_corpus", plan_again)
    where, fmt = locate_corpus(cfg.corpus)  # (JSONL, CSV: its first 4 bytes read, the UTF-16/32 check)
    monkeypatch.setattr(source.StoreObject, "open", lambda self, mode="rb": (opened.append(self.url), real_open(self, mode))[1])
    again = attempt.plan_or_reuse(cfg, where, fmt, old, "b")
    assert opened == [] and again.fingerprint == plan.fingerprint and again.shards == plan.shards
    assert _docs(again) == _docs(plan)

    edit_in_place(local, 7)
    _upload(local, f"resume/c{suffix}")  # new bytes: the resume reads the object and finds another fingerprint
    where, fmt = locate_corpus(cfg.corpus)
    opened.clear()
    with pytest.raises(PlannedAgain):
        attempt.plan_or_reuse(cfg, where, fmt, old, "b")
    assert opened == [url]  # hashed once (the quick fingerprint), then planned again


def _gzip_corpus(local: Path) -> bytes:
    import gzip

    write_texts(local, numbered_texts(50))
    return gzip.compress(local.read_bytes())


@pytest.mark.parametrize("shape", ["gzip bytes under .jsonl", "Content-Encoding: gzip", ".jsonl.gz key"])
def test_a_gzip_object_is_refused_before_planning_naming_the_compression(tmp_path, lease_s3, shape):  # noqa: F811
    """Issue 55: gzip in the store used to be read as text: every "line" a rejected row, exit 0, nothing said."""
    import s3fs

    from batch.corpus.plan import locate_corpus
    from classify.errors import InputError

    packed = _gzip_corpus(tmp_path / "c.jsonl")
    key = f"gz/{shape.split()[0].strip('.:')}/c.jsonl" + (".gz" if shape.endswith("key") else "")
    s3fs.S3FileSystem.clear_instance_cache()
    extra = {"ContentEncoding": "gzip", "ContentType": "application/json"} if "Content-Encoding" in shape else {}
    s3fs.S3FileSystem().pipe_file(f"{BUCKET}/{key}", packed, **extra)
    url = f"s3://{BUCKET}/{key}"
    for attempt in (lambda: locate_corpus(_cfg(url)), lambda: _plan(url)):
        with pytest.raises(InputError, match=rf"{url} is gzip-compressed \(.*decompress it first: `aws s3 cp {url} - "
                                             r"\| gunzip -c > corpus.jsonl`") as err:
            attempt()
        assert err.value.exit_code == 3


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.csv.gz", "c.jsonl", "c.csv"])
def test_a_local_gzip_corpus_is_refused_naming_the_compression(tmp_path, name):
    from classify.errors import InputError

    local = tmp_path / name
    local.write_bytes(_gzip_corpus(tmp_path / ("plain" + (".csv" if ".csv" in name else ".jsonl"))))
    with pytest.raises(InputError, match=rf"{local} is gzip-compressed \((first bytes 1F 8B|by its name)\); .* `gunzip -k {local}`"):
        _plan(local)


def _cfg(url: str):
    from classify.config.batch import CorpusConfig

    return CorpusConfig(path=url, id_column="id")
