"""One export, one writer (issue 55): the export location is claimed in the store itself, against moto's S3 server
on 127.0.0.1, without Ray.

Two drivers of one batch id (two pods resuming one copy, or one id started twice) each run the real
:class:`batch.run.offpod.ShardUploader` with its :class:`batch.run.owner.ExportOwner`: the second is refused before
it writes a byte, with a message naming the first; a take-over needs ``--take-over-export`` and a stale heartbeat,
and the driver taken over writes nothing more; ``status --from`` does not call a copy that no longer matches its
``SHA256SUMS`` complete.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path

import pytest

from classify.errors import InputError
from tests.support.runfolders import shard_run_folder as _run_folder
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - the fixture


def _store(prefix: str) -> dict[str, bytes]:
    """Every object under ``BUCKET/prefix`` with its bytes."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}"
    return {p: fs.cat_file(p) for p in fs.find(root)} if fs.exists(root) else {}


def _pod(tmp_path: Path, name: str) -> Path:
    """A run folder of batch ``b`` on another "pod" (its own folder, the same plan)."""
    (tmp_path / name).mkdir()
    run_dir, _ = _run_folder(tmp_path / name)
    return run_dir


def _uploader(run_dir: Path, dest: str, take_over: bool = False):
    from batch.run.offpod import ShardUploader
    from batch.run.owner import ExportOwner

    owner = ExportOwner(dest, "b", run_dir, take_over=take_over)
    return ShardUploader(run_dir, dest, 6, owner), owner


def _age_heartbeat(dest: str, seconds: float) -> None:
    """Make the owner record's heartbeat ``seconds`` old (a pod that stopped beating)."""
    import s3fs

    from batch.run.owner import owner_target, read_owner

    record = read_owner(dest)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    record["heartbeat_at"] = old.isoformat(timespec="seconds")
    s3fs.S3FileSystem().pipe_file(owner_target(dest).removeprefix("s3://"), json.dumps(record).encode())


def test_a_second_driver_is_refused_before_it_writes_anything_and_told_the_owner(tmp_path, lease_s3):  # noqa: F811
    dest = f"s3://{BUCKET}/own1/b"
    pod_a, pod_b = _pod(tmp_path, "a"), _pod(tmp_path, "b")
    up_a, _ = _uploader(pod_a, dest)
    up_a.claim(10)
    up_a.start([0, 1, 2, 3])
    assert up_a.close(wait_s=60)
    before = _store("own1/")
    assert f"{BUCKET}/own1/b/shards/000/000003.jsonl" in before

    up_b, owner_b = _uploader(pod_b, dest)
    with pytest.raises(InputError, match=r"is owned by another driver: batch b on host .* run folder "
                                         rf"{pod_a.resolve()}\).* --take-over-export") as err:
        up_b.claim(10)
    assert "nothing was written there" in str(err.value)
    up_b.start([0, 1, 2, 3])  # even told to copy, the refused uploader writes nothing
    assert up_b.close(wait_s=30) is False
    assert _store("own1/") == before and not owner_b.held


def test_two_drivers_claiming_at_once_get_one_owner(tmp_path, lease_s3):  # noqa: F811
    """The claim is the store's conditional create (If-None-Match), not a read then a write."""
    from batch.run.owner import ExportOwner, read_owner

    dest = f"s3://{BUCKET}/own2/b"
    owners = [ExportOwner(dest, "b", tmp_path / f"pod{i}") for i in range(6)]
    results: list[object] = [None] * len(owners)
    go = threading.Barrier(len(owners))

    def claim(i: int) -> None:
        go.wait()
        try:
            owners[i].claim()
            results[i] = "held"
        except InputError as err:
            results[i] = err

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(owners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results.count("held") == 1, results
    winner = owners[results.index("held")]
    assert read_owner(dest)["token"] == winner.token


def test_a_take_over_needs_the_flag_and_a_stale_heartbeat_and_stops_the_old_owner(tmp_path, lease_s3):  # noqa: F811
    from batch.run.owner import STALE_AFTER_S, read_owner

    dest = f"s3://{BUCKET}/own3/b"
    pod_a, pod_b = _pod(tmp_path, "a"), _pod(tmp_path, "b")
    up_a, owner_a = _uploader(pod_a, dest)
    up_a.claim(10)
    up_a.start([0, 1])
    assert up_a.close(wait_s=60)

    up_b, _ = _uploader(pod_b, dest, take_over=True)
    with pytest.raises(InputError, match=r"cannot take over .*: its owner is alive \(batch b on host"):
        up_b.claim(10)  # the owner beats: never taken over
    assert read_owner(dest)["token"] == owner_a.token

    _age_heartbeat(dest, STALE_AFTER_S + 60)  # pod A is gone
    up_plain, _ = _uploader(pod_b, dest)
    with pytest.raises(InputError, match="--take-over-export"):
        up_plain.claim(10)  # without the flag a stale owner is still refused
    up_b, owner_b = _uploader(pod_b, dest, take_over=True)
    up_b.claim(10)
    assert read_owner(dest)["token"] == owner_b.token and owner_b.held

    owner_a.heartbeat()  # pod A comes back: it finds the record taken over and stops writing
    assert not owner_a.held and "was taken over by batch b" in owner_a.lost
    assert read_owner(dest)["token"] == owner_b.token
    with pytest.raises(InputError, match="was taken over"):
        owner_a.check()


def test_the_same_run_folder_takes_its_claim_back_and_a_finished_export_is_never_taken(tmp_path, lease_s3):  # noqa: F811
    """A rerun in the run folder whose driver died (it holds that folder's lock now) needs no flag; an export marked
    finished is refused to every other driver, take-over or not."""
    from batch.run.owner import ExportOwner, read_owner

    dest = f"s3://{BUCKET}/own4/b"
    first = ExportOwner(dest, "b", tmp_path / "runs" / "b")
    first.claim()
    again = ExportOwner(dest, "b", tmp_path / "runs" / "b")
    again.claim()
    assert read_owner(dest)["token"] == again.token
    again.finished()
    assert read_owner(dest)["state"] == "exported"
    _age_heartbeat(dest, 10 * 86400)
    with pytest.raises(InputError, match="holds the finished export of batch b .* exports are never overwritten"):
        ExportOwner(dest, "b", tmp_path / "other" / "b", take_over=True).claim()


def test_status_from_never_calls_a_copy_that_no_longer_matches_its_ledger_complete(tmp_path, lease_s3, capsys):  # noqa: F811
    """A second writer (a driver without the claim, an older docpilot) rewrote the manifest and a shard of a finished
    export: ``status --from`` used to say "exported yes: a complete copy"."""
    import s3fs

    from batch.lot import status
    from batch.run.mirror import write_mirror
    from classify.runs.export import export_run

    run_dir = _pod(tmp_path, "a")
    (run_dir / "progress.json").write_text(json.dumps(
        {"batch_id": "b", "state": "done", "done": 30, "total": 30, "accepted": 30, "rejected": 0,
         "started_at": "2026-12-02T00:00:00Z", "updated_at": "2026-12-02T00:01:00Z", "host": "pod-a"}))
    dest = f"s3://{BUCKET}/own5/b"
    export_run(run_dir, dest)
    write_mirror(f"{dest}.progress.json", (run_dir / "progress.json").read_bytes())
    assert status.main(["--from", dest, "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    assert good["exported"] is True and good["state"] == "done" and not good.get("copy_problems")

    fs = s3fs.S3FileSystem()
    other = json.loads((run_dir / "manifest.json").read_text())
    other["attempts"] = [{"host": "pod-b"}]
    fs.pipe_file(f"{BUCKET}/own5/b/manifest.json", json.dumps(other).encode())
    fs.pipe_file(f"{BUCKET}/own5/b/shards/000/000009.jsonl", b'{"id": "x"}\n')  # a shard the ledger never listed
    assert status.main(["--from", dest, "--json"]) == 0
    bad = json.loads(capsys.readouterr().out)
    assert bad["exported"] is False and "DAMAGED" in bad["state"]
    assert any(p.startswith("manifest.json: sha256") for p in bad["copy_problems"]), bad["copy_problems"]
    assert "shards/000/000009.jsonl: not listed in SHA256SUMS" in bad["copy_problems"]
    assert status.main(["--from", dest]) == 0
    assert "exported  NO: the copy there no longer matches its SHA256SUMS: " in capsys.readouterr().out


def test_the_claim_keeps_beating_through_a_long_final_export(tmp_path, lease_s3, monkeypatch):  # noqa: F811
    """After the uploader stopped, the final export keeps the heartbeat going: a long export does not look gone."""
    import time

    from batch.run import owner as ow

    monkeypatch.setattr(ow, "HEARTBEAT_EVERY_S", 0.3)
    dest = f"s3://{BUCKET}/own6/b"
    owner = ow.ExportOwner(dest, "b", tmp_path / "runs" / "b")
    owner.claim()
    first = ow.read_owner(dest)["heartbeat_at"]
    with owner.beating():
        time.sleep(2.5)
    assert ow.read_owner(dest)["heartbeat_at"] > first and owner.held
