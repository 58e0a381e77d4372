"""Export and import of adapters and run folders: local folders, archives and a real S3 API.

The S3 store is moto's standalone server, started by the test on 127.0.0.1 and reached through
the real s3fs client (``AWS_ENDPOINT_URL``, as a user reaches MinIO or R2). No network beyond it.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_transfer_pilot.py``, ``tests/process/test_transfer_interrupted.py``.
"""

from __future__ import annotations

import os
import time

import pytest
from fastapi.testclient import TestClient

from adapters.registry.registry import Registry
from adapters.registry.transfer import export_adapter, import_adapter
from batch.run.export import check_export
from classify.errors import AdapterError, AdapterIntegrityError
from classify.runs.export import SHA256SUMS, export_complete, export_run, verify_export
from tests.support.transfer import BUCKET, FP, batch_run, flip_object, publish, s3_fs
from tests.support.transfer import s3 as s3  # noqa: F401  (fixture)


@pytest.mark.parametrize("form", ["folder", "archive.tar.gz"])
def test_round_trip_between_two_registries_keeps_every_hash(tmp_path, form):
    train, serve = Registry(tmp_path / "train-registry"), Registry(tmp_path / "serve-registry")
    ref = publish(train, tmp_path)
    dest = tmp_path / "moved" / form
    out = export_adapter(train, ref, dest)
    assert out["written"] and out["sha256"] == train.show(ref).sha256
    assert export_adapter(train, ref, dest)["written"] is False  # same content again: re-checked, no-op

    adapter, created = import_adapter(dest, serve, base_fingerprint=FP)
    source = train.resolve(ref)
    assert created and adapter.sha256 == source.sha256 and adapter.card["files"] == source.card["files"]
    assert serve.check(adapter) == []
    # the pilot status travels, but this side's gate is its own
    assert adapter.card["pilot"]["status"] == "not-run" and adapter.card["pilot"]["status"] != "passed"
    assert adapter.card["pilot"]["imported"]["status"] == "passed"
    assert adapter.card["pilot"]["imported"]["run_id"] == "run-train-side"
    assert import_adapter(dest, serve, base_fingerprint=FP)[1] is False  # same content: no-op

    other = Registry(tmp_path / "other")
    with pytest.raises(AdapterIntegrityError, match=r"trained on base model fake-base .* fingerprint sha256:1111"):
        import_adapter(dest, other, base_fingerprint="sha256:" + "1" * 64)
    assert other.versions("ok") == []


def test_import_never_overwrites_another_version_and_refuses_a_tampered_folder(tmp_path):
    train, serve = Registry(tmp_path / "t"), Registry(tmp_path / "s")
    ref = publish(train, tmp_path)
    publish(serve, tmp_path / "x", extra={"notes.txt": b"other content"})  # ok@1 with other files
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
    ref = publish(train, tmp_path, extra={"big.bin": os.urandom(200_000)})
    dest = tmp_path / "a.tar"
    export_adapter(train, ref, dest)
    dest.write_bytes(dest.read_bytes()[:150_000])
    with pytest.raises(AdapterIntegrityError, match=r"archive is truncated or damaged at big.bin"):
        import_adapter(dest, Registry(tmp_path / "fresh"))


def test_adapter_through_s3_then_served_and_a_flipped_byte_is_refused(s3, tmp_path, monkeypatch):
    from classify.config.sections import PilotConfig
    from classify.model.model import ModelRef
    from serve.app import create_app
    from serve.settings import load_settings
    from tests.support.serve_app import AUTH, TOKEN, FakeEngine, record_gate

    train = Registry(tmp_path / "train")
    ref = publish(train, tmp_path)
    url = f"s3://{BUCKET}/adapters/ok-1"
    from adapters.registry.cli import main as adapters_cli

    assert adapters_cli(["--registry", str(train.root), "export", ref, url]) == 0
    assert sorted(s3_fs().ls(f"{BUCKET}/adapters/ok-1")) == sorted(
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

    flip_object(f"{BUCKET}/adapters/ok-1/adapter_model.safetensors")
    with pytest.raises(AdapterIntegrityError, match=r"adapter_model.safetensors: sha256 .* != listed"):
        import_adapter(url, Registry(tmp_path / "fresh"), base_fingerprint=FP)

    archive = f"s3://{BUCKET}/adapters/ok-1.tgz"
    export_adapter(train, ref, archive)
    assert import_adapter(archive, Registry(tmp_path / "fresh2"), base_fingerprint=FP)[0].sha256 == adapter.sha256


def test_batch_run_export_to_s3_is_read_back_and_a_flipped_byte_is_named(s3, tmp_path, bbc_dir):
    from batch.run.export import export_batch as _export

    run = batch_run(tmp_path, bbc_dir)
    url = f"s3://{BUCKET}/exports/b-s3"
    assert _export(run, url) == url
    assert export_complete(url)
    assert verify_export(url, check_export) == []
    assert _export(run, url) == url  # a rerun re-checks the existing copy
    with pytest.raises(Exception, match=r"never overwritten"):
        export_run(run, url)

    flip_object(f"{BUCKET}/exports/b-s3/results.jsonl", offset=5)
    problems = verify_export(url, check_export)
    assert len(problems) == 1 and problems[0].startswith("results.jsonl: sha256")
    from classify.errors import VerificationError

    with pytest.raises(VerificationError, match=r"failed its re-check: results.jsonl: sha256"):
        _export(run, url)


def test_interrupted_run_export_is_completed_by_a_rerun(s3, tmp_path, bbc_dir):
    run = batch_run(tmp_path, bbc_dir)
    url = f"s3://{BUCKET}/exports/partial"
    fs = s3_fs()
    fs.pipe_file(f"{BUCKET}/exports/partial/results.jsonl", b"half")  # what a killed upload leaves: no SHA256SUMS
    assert not export_complete(url)
    assert "incomplete" in verify_export(url, check_export)[0]
    export_run(run, url)
    assert verify_export(url, check_export) == []
