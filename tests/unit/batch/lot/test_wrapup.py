"""``docpilot wrap-up``: every adapter version, finished and unfinished batch and pilot run copied off the pod and
re-checked where it landed (a folder and a real S3 API on 127.0.0.1); the lease's stop command runs exactly once
after a verified wrap-up, and never after a tampered or interrupted copy (its marker file stays absent)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from adapters.registry.registry import Registry
from batch import layout as mf
from batch.lot import wrapup
from classify.errors import VerificationError
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - lease_s3 is a fixture
from tests.support.transfer import batch_run, flip_object, publish, s3_fs

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def pod(tmp_path, monkeypatch, bbc_dir):
    """A pod's state: a registry with two adapters, a finished and an unfinished batch, a pilot run, a lots config
    whose stop command appends a line to a marker file. Yields a dict of the paths."""
    reg = Registry(tmp_path / "registry")
    refs = [publish(reg, tmp_path, "alpha"), publish(reg, tmp_path, "beta")]
    runs = tmp_path / "runs"
    finished = batch_run(tmp_path, bbc_dir)  # runs/b-s3: manifest, 2 shards, results, summary
    unfinished = runs / "b-half"
    shutil.copytree(finished, unfinished)
    for name in (mf.RESULTS, mf.SUMMARY, "results.parquet"):
        (unfinished / name).unlink(missing_ok=True)
    shard1 = mf.shard_path(unfinished, 1)
    shard1.unlink()  # shard 1 of 2 not written yet
    pilot = runs / "20261201T000000Z-pilot-abcdef12"  # a pilot is a batch run folder plus its decision
    shutil.copytree(finished, pilot)
    (pilot / "decision.json").write_text(json.dumps({"decision": "proceed", "reasons": []}))
    (pilot / "results.jsonl").write_text('{"id": "a", "status": "accepted"}\n')
    marker = tmp_path / "stopped.marker"
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('stopped\\n')"]}
    lots_path = tmp_path / "lots.json"
    lots_path.write_text(json.dumps(lots))
    monkeypatch.setenv("DOCPILOT_RUNS", str(runs))
    monkeypatch.setenv("DOCPILOT_REGISTRY", str(reg.root))
    return {"reg": reg, "refs": refs, "runs": runs, "marker": marker, "lots": str(lots_path)}


def _stops(pod) -> int:
    return pod["marker"].read_text().count("stopped") if pod["marker"].exists() else 0


def _wrap(pod, dest) -> int:
    return wrapup.main(["--to", str(dest), "--lots-config", pod["lots"]])


def _record(pod) -> tuple[dict, dict]:
    """The latest wrap-up's ``wrap-up.json`` and ``lease-stop.json``."""
    latest = max(pod["runs"].glob("*-wrapup-*"), key=lambda p: p.stat().st_mtime_ns)
    return (json.loads((latest / wrapup.RECORD).read_text()), json.loads((latest / "lease-stop.json").read_text()))


def test_wrap_up_to_a_folder_copies_everything_rechecks_it_and_stops_the_lease_once(pod, tmp_path):
    dest = tmp_path / "offpod"
    assert _wrap(pod, dest) == 0
    record, stop = _record(pod)
    kinds = sorted((i["kind"], i["name"]) for i in record["items"])
    assert kinds == [("adapter", "alpha@1"), ("adapter", "beta@1"), ("batch", "b-s3"), ("batch-partial", "b-half"),
                     ("pilot", "20261201T000000Z-pilot-abcdef12")]
    assert all(i["verified"] for i in record["items"]) and record["verified"] and record["missing"] == []
    by_kind = {i["kind"]: i for i in record["items"]}
    assert by_kind["adapter"]["sha256"] == pod["reg"].show(by_kind["adapter"]["name"]).sha256
    assert by_kind["batch"]["sums_sha256"].startswith("sha256:") and by_kind["batch"]["files"] > 3
    assert (dest / "b-s3" / "SHA256SUMS").is_file() and (dest / "adapters" / "alpha-1" / "SHA256SUMS").is_file()
    partial = Path(by_kind["batch-partial"]["dest"])
    assert partial.parent == dest and partial.name.startswith("b-half-partial-")
    assert by_kind["batch-partial"]["done"] < by_kind["batch-partial"]["total"]
    manifests = list(dest.glob("*-wrapup-*.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())["items"] == record["items"]
    assert _stops(pod) == 1
    assert stop["decisions"][-1]["decision"] == "ran" and "all 5 copies verified" in stop["decisions"][-1]["reason"]


def test_a_tampered_copy_fails_the_wrap_up_names_it_and_does_not_stop_the_lease(pod, tmp_path, capsys):
    dest = tmp_path / "offpod"
    assert _wrap(pod, dest) == 0 and _stops(pod) == 1
    results = dest / "b-s3" / "results.jsonl"
    data = bytearray(results.read_bytes())
    data[5] ^= 0x01
    results.write_bytes(bytes(data))  # the earlier copy went bad where it landed
    with pytest.raises(VerificationError, match=r"MISSING or failed their re-check: batch b-s3: .*results.jsonl: sha256"):
        _wrap(pod, dest)
    assert _stops(pod) == 1  # not run a second time
    record, stop = _record(pod)
    assert not record["verified"] and [i["name"] for i in record["items"] if not i["verified"]] == ["b-s3"]
    assert stop["decisions"][-1]["decision"] == "skipped" and "1 of 5 copies failed" in stop["decisions"][-1]["reason"]
    assert "FAILED batch" in capsys.readouterr().out


def test_a_version_1_batch_folder_fails_the_wrap_up_with_the_earlier_docpilot_message(pod, tmp_path):
    old = pod["runs"] / "b-old"
    old.mkdir()
    (old / mf.MANIFEST).write_text(json.dumps({"batch_id": "b-old", "corpus": {"distinct_ids": 1}, "shards": []}))
    with pytest.raises(VerificationError, match=r"MISSING or failed their re-check: batch b-old: EarlierRunFolder: "
                                                r"batch b-old was made by an earlier docpilot"):
        _wrap(pod, tmp_path / "offpod")
    record, _ = _record(pod)
    assert [i["name"] for i in record["items"] if not i["verified"]] == ["b-old"] and _stops(pod) == 0


@pytest.mark.usefixtures("lease_s3")
def test_wrap_up_to_s3_an_interrupted_upload_fails_and_a_rerun_completes_and_stops_once(pod, monkeypatch):
    from classify.runs import storage

    dest = f"s3://{BUCKET}/wrapup-{pod['runs'].parent.name[-20:]}"
    real = storage.upload_tree
    calls = {"n": 0}

    def dropped(src, files, url, last=None):  # the connection drops after the first file of one copy
        calls["n"] += 1
        if calls["n"] == 2:
            storage.upload_file(src / files[0], storage.join(url, files[0]))
            raise ConnectionError("connection reset by peer")
        return real(src, files, url, last)

    monkeypatch.setattr(storage, "upload_tree", dropped)
    with pytest.raises(VerificationError, match=r"MISSING or failed their re-check: .*ConnectionError"):
        _wrap(pod, dest)
    assert _stops(pod) == 0
    _, stop = _record(pod)
    assert stop["decisions"][-1]["decision"] == "skipped"

    monkeypatch.setattr(storage, "upload_tree", real)
    assert _wrap(pod, dest) == 0  # the rerun completes the cut-short copy and re-checks the others
    assert _stops(pod) == 1
    record, _ = _record(pod)
    assert record["verified"] and len(record["items"]) == 5
    fs = s3_fs()
    key = dest[len("s3://"):]
    assert fs.exists(f"{key}/b-s3/SHA256SUMS") and fs.exists(f"{key}/adapters/beta-1/SHA256SUMS")
    assert len(fs.glob(f"{key}/*-wrapup-*.json")) >= 1

    flip_object(f"{key}/adapters/alpha-1/adapter_model.safetensors")  # tampered in the store
    with pytest.raises(VerificationError, match=r"adapter alpha@1"):
        _wrap(pod, dest)
    assert _stops(pod) == 1


def test_nothing_exported_or_a_running_batch_never_stops_the_lease(tmp_path, monkeypatch):
    import os
    import socket

    marker = tmp_path / "stopped.marker"
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]}
    (tmp_path / "lots.json").write_text(json.dumps(lots))
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_REGISTRY", str(tmp_path / "empty-registry"))
    assert wrapup.main(["--to", str(tmp_path / "d"), "--lots-config", str(tmp_path / "lots.json")]) == 0
    runs = tmp_path / "runs"
    _, stop = (None, json.loads((max(runs.glob("*-wrapup-*"), key=lambda p: p.stat().st_mtime_ns) / "lease-stop.json").read_text()))
    assert not marker.exists() and "nothing was exported" in stop["decisions"][-1]["reason"]

    from tests.support.transfer import batch_run as make_run

    run = make_run(tmp_path, Path(os.environ.get("DOCPILOT_BBC_DIR", ROOT.parent / "shared" / "data" / "bbc-news")))
    (run / mf.SUMMARY).unlink()
    (run / mf.PROGRESS).write_text(json.dumps({"batch_id": run.name, "state": "running", "pid": os.getpid(),
                                               "host": socket.gethostname(), "total": 6, "done": 3}))
    assert wrapup.main(["--to", str(tmp_path / "d"), "--lots-config", str(tmp_path / "lots.json")]) == 0
    stop = json.loads((max(runs.glob("*-wrapup-*"), key=lambda p: p.stat().st_mtime_ns) / "lease-stop.json").read_text())
    assert not marker.exists() and "still running" in stop["decisions"][-1]["reason"]
