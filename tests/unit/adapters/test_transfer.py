"""Export and import of adapters and run folders: local folders, archives and a real S3 API.

The S3 store is moto's standalone server, started by the test on 127.0.0.1 and reached through
the real s3fs client (``AWS_ENDPOINT_URL``, as a user reaches MinIO or R2). No network beyond it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save_file

from adapters.registry import Registry
from adapters.transfer import export_adapter, import_adapter
from batch import manifest as mf
from batch._config import BatchConfig, CorpusConfig, results_config, results_config_sha256
from batch.corpus import read_corpus
from batch.merge import check_export, summarize
from classify.errors import AdapterError, AdapterIntegrityError
from classify.export import SHA256SUMS, export_complete, export_run, verify_export
from classify.records import Result
from tests.s3server import moto_s3
from tests.test_batch_helpers import ROOT, make_corpus

FP = "sha256:" + "0" * 64
BUCKET = "docpilot-test"


@pytest.fixture(scope="module")
def s3():
    """A real S3 API (moto server) on 127.0.0.1 with one bucket; yields its endpoint URL."""
    with moto_s3(BUCKET) as url:
        yield url


def _fs():
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def _flip_object(key: str, offset: int = 40) -> None:
    fs = _fs()
    data = bytearray(fs.cat_file(key))
    data[offset % len(data)] ^= 0x01
    fs.pipe_file(key, bytes(data))


def _publish(reg: Registry, tmp: Path, name: str = "ok", extra: dict[str, bytes] | None = None) -> str:
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


def _batch_run(tmp_path: Path, bbc_dir: Path) -> Path:
    """A finished batch run folder (manifest, shards, results, summary) that passes ``check_export``."""
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    cfg = BatchConfig(batch={"shard_docs": 8})
    run = tmp_path / "runs" / "b-s3"
    mf.write_manifest(run, {"corpus": corpus.describe(), "corpus_fingerprint": corpus.fingerprint,
                            "config": results_config(cfg), "config_sha256": results_config_sha256(cfg),
                            "model": {"path": "/m"}, "model_fingerprint": "sha256:m", "adapter": None,
                            "adapter_sha256": None, "shards": mf.plan_shards(corpus.docs, 8)})
    rows = [Result(id=d.id, status="accepted", category="tech", n_tokens=3) for d in corpus.docs]
    mf.write_shard(run, 0, rows[:8])
    mf.write_shard(run, 1, rows[8:])
    (run / mf.RESULTS).write_text("".join(json.dumps(r.row()) + "\n" for r in rows))
    (run / mf.SUMMARY).write_text(json.dumps(summarize(rows, corpus.describe(), ["tech"])))
    assert check_export(run) == []
    return run


@pytest.mark.parametrize("form", ["folder", "archive.tar.gz"])
def test_round_trip_between_two_registries_keeps_every_hash(tmp_path, form):
    train, serve = Registry(tmp_path / "train-registry"), Registry(tmp_path / "serve-registry")
    ref = _publish(train, tmp_path)
    dest = tmp_path / "moved" / form
    out = export_adapter(train, ref, dest)
    assert out["written"] and out["sha256"] == train.show(ref).sha256
    assert export_adapter(train, ref, dest)["written"] is False  # same content again: re-checked, no-op

    adapter, created = import_adapter(dest, serve, base_fingerprint=FP)
    source = train.resolve(ref)
    assert created and adapter.sha256 == source.sha256 and adapter.card["files"] == source.card["files"]
    assert serve.check(adapter) == []
    # the pilot status travels, but this side's gate is its own
    assert adapter.card["pilot"]["status"] == "not-run" and not adapter.pilot_passed
    assert adapter.card["pilot"]["imported"]["status"] == "passed"
    assert adapter.card["pilot"]["imported"]["run_id"] == "run-train-side"
    assert import_adapter(dest, serve, base_fingerprint=FP)[1] is False  # same content: no-op

    other = Registry(tmp_path / "other")
    with pytest.raises(AdapterIntegrityError, match=r"trained on base model fake-base .* fingerprint sha256:1111"):
        import_adapter(dest, other, base_fingerprint="sha256:" + "1" * 64)
    assert other.versions("ok") == []


def test_import_never_overwrites_another_version_and_refuses_a_tampered_folder(tmp_path):
    train, serve = Registry(tmp_path / "t"), Registry(tmp_path / "s")
    ref = _publish(train, tmp_path)
    _publish(serve, tmp_path / "x", extra={"notes.txt": b"other content"})  # ok@1 with other files
    dest = tmp_path / "e"
    export_adapter(train, ref, dest)
    with pytest.raises(AdapterError, match=r"ok@1 already exists .* versions are immutable, nothing was imported"):
        import_adapter(dest, serve)
    data = bytearray((dest / "adapter_config.json").read_bytes())
    data[3] ^= 1
    (dest / "adapter_config.json").write_bytes(bytes(data))
    fresh = Registry(tmp_path / "fresh")
    with pytest.raises(AdapterIntegrityError, match=r"adapter_config.json: sha256 .* != listed"):
        import_adapter(dest, fresh)
    assert fresh.names() == [] and not [p for p in fresh.root.iterdir() if p.name.startswith(".import-")]


def test_truncated_archive_is_refused_naming_the_member(tmp_path):
    train = Registry(tmp_path / "t")
    ref = _publish(train, tmp_path, extra={"big.bin": os.urandom(200_000)})
    dest = tmp_path / "a.tar"
    export_adapter(train, ref, dest)
    dest.write_bytes(dest.read_bytes()[:150_000])
    with pytest.raises(AdapterIntegrityError, match=r"archive is truncated or damaged at big.bin"):
        import_adapter(dest, Registry(tmp_path / "fresh"))


def test_adapter_through_s3_then_served_and_a_flipped_byte_is_refused(s3, tmp_path, monkeypatch):
    from classify.config import PilotConfig
    from classify.model import ModelRef
    from serve.app import create_app
    from serve.settings import load_settings
    from tests.test_serve_api import AUTH, TOKEN, FakeEngine, record_gate

    train = Registry(tmp_path / "train")
    ref = _publish(train, tmp_path)
    url = f"s3://{BUCKET}/adapters/ok-1"
    from adapters.cli import main as adapters_cli

    assert adapters_cli(["--registry", str(train.root), "export", ref, url]) == 0
    assert sorted(_fs().ls(f"{BUCKET}/adapters/ok-1")) == sorted(
        f"{BUCKET}/adapters/ok-1/{f}" for f in ["adapter_config.json", "adapter_model.safetensors", "card.json", SHA256SUMS])

    serve_reg = Registry(tmp_path / "serve")
    assert adapters_cli(["--registry", str(serve_reg.root), "import", url, "--base-fingerprint", FP]) == 0
    adapter = serve_reg.resolve(ref, base_fingerprint=FP)
    assert adapter.sha256 == train.show(ref).sha256

    model = ModelRef("fake-base", "/nonexistent", FP, "test")
    app = create_app(load_settings(api_token=TOKEN), config=PilotConfig(), model=model, registry=serve_reg,
                     engine_factory=FakeEngine)
    with TestClient(app) as client:
        deadline = time.time() + 10
        while client.get("/readyz").json()["status"] == "loading" and time.time() < deadline:
            time.sleep(0.02)
        body = {"adapter": ref, "documents": [{"id": "d1", "text": "a new chip"}]}
        refused = client.post("/v1/classify", json=body, headers=AUTH)
        assert refused.status_code == 409  # imported: this side's pilot has not run yet
        serve_reg.set_pilot_status(ref, "passed", "run-serve-side")  # what `make pilot ADAPTER=ok@1` records here:
        record_gate(serve_reg.show(ref), "pass", "run-serve-side", fingerprint=FP)  # the card, and the pilot gate (which decides)
        ok = client.post("/v1/classify", json=body, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["adapter"] == ref

    _flip_object(f"{BUCKET}/adapters/ok-1/adapter_model.safetensors")
    with pytest.raises(AdapterIntegrityError, match=r"adapter_model.safetensors: sha256 .* != listed"):
        import_adapter(url, Registry(tmp_path / "fresh"), base_fingerprint=FP)

    archive = f"s3://{BUCKET}/adapters/ok-1.tgz"
    export_adapter(train, ref, archive)
    assert import_adapter(archive, Registry(tmp_path / "fresh2"), base_fingerprint=FP)[0].sha256 == adapter.sha256


def test_batch_run_export_to_s3_is_read_back_and_a_flipped_byte_is_named(s3, tmp_path, bbc_dir):
    from batch._attempt import export_batch as _export

    run = _batch_run(tmp_path, bbc_dir)
    url = f"s3://{BUCKET}/exports/b-s3"
    assert _export(run, url) == url
    assert export_complete(url)
    assert verify_export(url, check_export) == []
    assert _export(run, url) == url  # a rerun re-checks the existing copy
    with pytest.raises(Exception, match=r"never overwritten"):
        export_run(run, url)

    _flip_object(f"{BUCKET}/exports/b-s3/results.jsonl", offset=5)
    problems = verify_export(url, check_export)
    assert len(problems) == 1 and problems[0].startswith("results.jsonl: sha256")
    from classify.errors import VerificationError

    with pytest.raises(VerificationError, match=r"failed its re-check: results.jsonl: sha256"):
        _export(run, url)


def test_interrupted_adapter_upload_is_not_importable_and_a_rerun_completes_it(s3, tmp_path):
    train = Registry(tmp_path / "t")
    # big.bin sorts after the peft files and is large enough (multipart upload) to be caught mid-upload
    ref = _publish(train, tmp_path, extra={"zz-big.bin": os.urandom(120 * 1024 * 1024)})
    url = f"s3://{BUCKET}/adapters/interrupted"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "docpilot", "adapters", "--registry", str(train.root), "export", ref, url],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    fs = _fs()
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if fs.exists(f"{BUCKET}/adapters/interrupted/adapter_config.json"):
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"export finished before it could be interrupted: {proc.stdout.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    fs.invalidate_cache()
    left = fs.find(f"{BUCKET}/adapters/interrupted")
    assert left and not any(p.endswith(SHA256SUMS) for p in left)

    with pytest.raises(AdapterIntegrityError, match=r"SHA256SUMS is missing, so the export is incomplete"):
        import_adapter(url, Registry(tmp_path / "fresh"))
    assert Registry(tmp_path / "fresh").names() == []

    out = export_adapter(train, ref, url)  # the rerun clears the partial upload and completes it
    assert out["written"]
    adapter, created = import_adapter(url, Registry(tmp_path / "fresh"), base_fingerprint=FP)
    assert created and adapter.sha256 == train.show(ref).sha256


def test_interrupted_run_export_is_completed_by_a_rerun(s3, tmp_path, bbc_dir):
    run = _batch_run(tmp_path, bbc_dir)
    url = f"s3://{BUCKET}/exports/partial"
    fs = _fs()
    fs.pipe_file(f"{BUCKET}/exports/partial/results.jsonl", b"half")  # what a killed upload leaves: no SHA256SUMS
    assert not export_complete(url)
    assert "incomplete" in verify_export(url, check_export)[0]
    export_run(run, url)
    assert verify_export(url, check_export) == []


@pytest.mark.ray
def test_pilot_exports_to_s3_rechecks_it_and_records_its_lease(s3, pilot_config, tmp_path, monkeypatch):
    """The pilot's batch export to an object store (real local Ray, a stand-in engine actor: the export is under test)."""
    from stand_in_actors import answer_actor

    from batch.pilot import run_pilot

    for var in ("DOCPILOT_HOME", "DOCPILOT_RUNS"):  # a stand-in's verdict must not touch the real model's gate
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    outcome = run_pilot(pilot_config, ROOT / "data" / "pilot", _engine_actor=answer_actor(),
                        export_root=f"s3://{BUCKET}/pilots", lease_ends_at="2026-12-03T18:00:00+00:00")
    assert outcome.stage == "verify" and outcome.summary["first_error"] is None
    assert outcome.export_dir == f"s3://{BUCKET}/pilots/{outcome.run_id}"
    params = json.loads((outcome.run_dir / "params.json").read_text())
    assert params["lease_ends_at"] == "2026-12-03T18:00:00+00:00"
    assert _fs().exists(f"{BUCKET}/pilots/{outcome.run_id}/{SHA256SUMS}")
    _flip_object(f"{BUCKET}/pilots/{outcome.run_id}/results.jsonl", offset=10)
    problems = verify_export(outcome.export_dir)
    assert len(problems) == 1 and problems[0].startswith("results.jsonl: sha256")
