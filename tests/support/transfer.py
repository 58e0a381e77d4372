"""Helpers of the tests of transfers (adapters and run folders through S3 and archives): a moto S3 server with
one bucket (the ``s3`` fixture), an S3 file system, a flipped byte, a published tiny adapter, a finished batch run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from adapters.registry.registry import Registry
from batch import layout as mf
from batch.run.export import check_export
from batch.run.merge import merge_results
from batch.runfiles import Manifest
from classify.config.batch import BatchConfig, CorpusConfig, results_config, results_config_sha256
from classify.records import Result
from tests.support.corpora import make_corpus, planned_shards, read_corpus
from tests.support.s3server import moto_s3

FP = "sha256:" + "0" * 64
BUCKET = "docpilot-test"


@pytest.fixture(scope="module")
def s3():
    """A real S3 API (moto server) on 127.0.0.1 with one bucket; yields its endpoint URL."""
    with moto_s3(BUCKET) as url:
        yield url


def s3_fs():
    """An s3fs file system on the endpoint in ``AWS_ENDPOINT_URL`` (its listing cache cleared)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def flip_object(key: str, offset: int = 40) -> None:
    """Flip one bit of S3 object ``key`` at byte ``offset`` (modulo its size), in place."""
    fs = s3_fs()
    data = bytearray(fs.cat_file(key))
    data[offset % len(data)] ^= 0x01
    fs.pipe_file(key, bytes(data))


def publish(reg: Registry, tmp: Path, name: str = "ok", extra: dict[str, bytes] | None = None) -> str:
    """Publish a tiny LoRA (plus ``extra`` files, by relative path) as ``name@1``, pilot passed; returns the reference."""
    src = tmp / f"src-{name}"
    src.mkdir(parents=True)
    (src / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                         "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    rng = np.random.default_rng(0)
    save_file({f"{prefix}.lora_A.weight": rng.standard_normal((8, 4)).astype(np.float16),
               f"{prefix}.lora_B.weight": rng.standard_normal((4, 8)).astype(np.float16)},
              str(src / "adapter_model.safetensors"))
    for rel, data in (extra or {}).items():
        (src / rel).write_bytes(data)
    reg.publish(src, name, 1, {"base_model": {"name": "fake-base", "fingerprint": FP}})
    reg.set_pilot_status(f"{name}@1", "passed", "run-train-side")
    return f"{name}@1"


def batch_run(tmp_path: Path, bbc_dir: Path) -> Path:
    """A finished batch run folder (manifest, shards, results, summary) that passes ``check_export``."""
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    cfg = BatchConfig(batch={"shard_docs": 8})
    run = tmp_path / "runs" / "b-s3"
    planned = planned_shards(spec["path"], 8)
    manifest = Manifest.of({"manifest_version": mf.MANIFEST_VERSION, "corpus": corpus.describe(),
                            "corpus_fingerprint": corpus.fingerprint, "config": results_config(cfg),
                            "config_sha256": results_config_sha256(cfg), "model": {"path": "/m"},
                            "model_fingerprint": "sha256:m", "adapter": None, "adapter_sha256": None,
                            "shards": [s for s, _ in planned]})
    mf.write_manifest(run, manifest)
    for shard, docs in planned:
        mf.write_shard(run, shard.index, [Result(id=d.id, status="accepted", category="tech", n_tokens=3) for d in docs])
    summary, problems = merge_results(run, manifest)  # results.jsonl and results.parquet
    assert problems == []
    (run / mf.SUMMARY).write_text(json.dumps(summary))
    assert check_export(run) == []
    return run
