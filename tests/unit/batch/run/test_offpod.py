"""The off-pod copy of a batch (issue 38) against moto's S3 server on 127.0.0.1, without Ray.

A run folder is made by hand (a planned corpus, shard files as the batch writes them), then:
the uploader copies shards, manifest and ledger in that order and never blocks the caller; the
final export sends only what the copy does not hold yet; a rebuild refuses a damaged, foreign
or missing copy naming what is wrong, and restores a good one shard for shard.
"""

from __future__ import annotations

import json

import pytest

from tests.support.runfolders import shard_run_folder as _run_folder
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - the fixture


def _s3(path: str) -> tuple[object, str]:
    import s3fs

    return s3fs.S3FileSystem(), f"{BUCKET}/{path}"


def test_the_uploader_copies_shards_then_the_ledger_and_a_new_pod_restores_them(tmp_path, lease_s3):  # noqa: F811
    from batch.run.offpod import LEDGER, ShardUploader, restore_run, shard_rel
    from classify.runs.files import file_sha256

    run_dir, manifest = _run_folder(tmp_path)
    dest = f"s3://{BUCKET}/up1/b"
    up = ShardUploader(run_dir, dest, len(manifest.shards))
    up.start([0, 1])
    up.shard_written(2)
    up.shard_written(3)
    assert up.close(wait_s=60)
    fs, root = _s3("up1/b")
    ledger = dict(reversed(line.split("  ")) for line in fs.cat_file(f"{root}/{LEDGER}").decode().splitlines())
    assert ledger == {shard_rel(i): file_sha256(run_dir / shard_rel(i)) for i in range(4)}
    assert (run_dir / LEDGER).read_bytes() == fs.cat_file(f"{root}/{LEDGER}")  # the run folder's record is the copy's
    assert up.lag()["shards_copied"] == 4 and up.lag()["shards_pending"] == 0

    again = ShardUploader(run_dir, dest, len(manifest.shards))  # a local resume: what is there is not sent again
    again.start([0, 1, 2, 3])  # returns at once: the ledger is read by the uploader's thread
    assert again.close(wait_s=60)
    assert again.lag()["shards_pending"] == 0 and again.lag()["shards_copied"] == 4

    new = tmp_path / "pod2" / "b"
    new.mkdir(parents=True)
    restored, n = restore_run(dest, new)
    assert n == 4 and restored.corpus_fingerprint == manifest.corpus_fingerprint
    for i in range(4):
        assert (new / shard_rel(i)).read_bytes() == (run_dir / shard_rel(i)).read_bytes()
    assert not (new / shard_rel(4)).exists()


def test_a_slow_store_never_blocks_shard_written(tmp_path, lease_s3, monkeypatch):  # noqa: F811
    import threading
    import time

    from batch.run import offpod

    run_dir, manifest = _run_folder(tmp_path)
    gate = threading.Event()
    real = offpod.ShardUploader._round

    def slow_round(self, batch, manifest):
        gate.wait(30)  # the store hangs until the test lets it go
        return real(self, batch, manifest)

    monkeypatch.setattr(offpod.ShardUploader, "_round", slow_round)
    up = offpod.ShardUploader(run_dir, f"s3://{BUCKET}/slow/b", len(manifest.shards))
    up.start([0])
    t0 = time.monotonic()
    for i in (1, 2, 3):
        up.shard_written(i)
    assert time.monotonic() - t0 < 0.5
    time.sleep(0.3)
    lag = up.lag()
    assert lag["shards_pending"] == 4 and lag["oldest_pending_s"] >= 0.3 and lag["shards_copied"] == 0
    gate.set()
    assert up.close(wait_s=60) and up.lag()["shards_copied"] == 4


def test_the_final_export_sends_only_what_the_copy_lacks(tmp_path, lease_s3, monkeypatch):  # noqa: F811
    from batch.run.offpod import ShardUploader, shard_rel
    from classify.runs import export, storage

    run_dir, manifest = _run_folder(tmp_path)
    dest = f"s3://{BUCKET}/reuse/b"
    up = ShardUploader(run_dir, dest, len(manifest.shards))
    up.start([0, 1, 2, 3])
    up.close(wait_s=60)
    (run_dir / "summary.json").write_text("{}")
    sent: list[str] = []
    real = storage.upload_tree
    monkeypatch.setattr(storage, "upload_tree", lambda src, files, d, last=None: (sent.extend(files),
                                                                                   real(src, files, d, last)))
    fs, root = _s3("reuse/b")
    fs.pipe_file(f"{root}/stray.txt", b"left by someone")
    export.export_run(run_dir, dest, reuse=up.copied)
    assert not any(rel in sent for rel in (shard_rel(i) for i in range(4)))
    assert "summary.json" in sent and "manifest.json" in sent
    assert export.verify_export(dest) == []  # every hash read back, the stray object gone
    assert not fs.exists(f"{root}/stray.txt")


@pytest.mark.parametrize("damage, message", [
    ("hash", "sha256 .* != offpod.sha256"),
    ("missing", "listed in offpod.sha256 but missing from the copy"),
    ("foreign", "not a shard of this batch's plan"),
    ("no-manifest", "no manifest.json at"),
])
def test_a_damaged_copy_is_refused_naming_what_is_wrong(tmp_path, lease_s3, damage, message):  # noqa: F811
    from batch.run.offpod import LEDGER, ShardUploader, restore_run, shard_rel
    from classify.errors import InputError, VerificationError

    run_dir, manifest = _run_folder(tmp_path)
    dest = f"s3://{BUCKET}/damage-{damage}/b"
    up = ShardUploader(run_dir, dest, len(manifest.shards))
    up.start([0, 1, 2])
    up.close(wait_s=60)
    fs, root = _s3(f"damage-{damage}/b")
    if damage == "hash":
        fs.pipe_file(f"{root}/{shard_rel(1)}", b'{"id": "d-0005"}\n')
    elif damage == "missing":
        fs.rm_file(f"{root}/{shard_rel(2)}")
    elif damage == "foreign":
        fs.pipe_file(f"{root}/{LEDGER}", fs.cat_file(f"{root}/{LEDGER}") + b"0" * 64 + b"  shards/000/000099.jsonl\n")
    else:
        fs.rm_file(f"{root}/manifest.json")
    new = tmp_path / "pod2" / "b"
    new.mkdir(parents=True)
    with pytest.raises(InputError if damage == "no-manifest" else VerificationError, match=message):
        restore_run(dest, new)
    assert not (new / "manifest.json").exists()  # nothing that a resume would take for a rebuilt folder


def test_a_shard_rewritten_with_its_ledger_line_is_refused_for_a_category_outside_the_set(tmp_path, lease_s3):  # noqa: F811
    """The ledger proves a copy is not damaged, not that nobody with write access rewrote a shard and its line: the
    rows are checked against the batch's allowed categories when the copied shards are verified, not at the merge
    after the whole run."""
    import hashlib

    from batch.run.offpod import LEDGER, ShardUploader, restore_run, shard_rel
    from classify.errors import VerificationError

    run_dir, manifest = _run_folder(tmp_path)
    dest = f"s3://{BUCKET}/rewritten/b"
    up = ShardUploader(run_dir, dest, len(manifest.shards))
    up.start([0, 1, 2])
    up.close(wait_s=60)
    fs, root = _s3("rewritten/b")
    rows = [json.loads(line) for line in fs.cat_file(f"{root}/{shard_rel(1)}").decode().splitlines()]
    rows[-1]["category"] = "sports-betting"  # the same ids, one answer outside the allowed set
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    fs.pipe_file(f"{root}/{shard_rel(1)}", data)
    ledger = fs.cat_file(f"{root}/{LEDGER}").decode().splitlines()
    line = next(n for n, text in enumerate(ledger) if text.endswith(shard_rel(1)))
    ledger[line] = f"{hashlib.sha256(data).hexdigest()}  {shard_rel(1)}"  # the ledger rewritten with it
    fs.pipe_file(f"{root}/{LEDGER}", ("\n".join(ledger) + "\n").encode())
    new = tmp_path / "pod2" / "b"
    new.mkdir(parents=True)
    with pytest.raises(VerificationError, match=rf"row {len(rows)}: id {rows[-1]['id']}: accepted with category 'sports-betting' "
                                                r"not in \['business', 'tech'\]"):
        restore_run(dest, new)
    assert not (new / "manifest.json").exists()  # nothing that a resume would take for a rebuilt folder


def test_resume_from_needs_a_url_ending_in_the_batch_id_and_a_matching_batch_id():
    from batch.run.driver import parse_args
    from classify.errors import InputError

    opts = parse_args(["--resume-from", "s3://bkt/exports/b-1/"])
    assert (opts.batch_id, opts.export_dir) == ("b-1", "s3://bkt/exports")
    with pytest.raises(InputError, match="must be the object-storage copy"):
        parse_args(["--resume-from", "/local/runs/b-1"])
    with pytest.raises(InputError, match="--batch-id other differs"):
        parse_args(["--resume-from", "s3://bkt/exports/b-1", "--batch-id", "other"])
    with pytest.raises(InputError, match="keeps copying to s3://bkt/exports"):
        parse_args(["--resume-from", "s3://bkt/exports/b-1", "--export-dir", "s3://elsewhere"])
    assert json.loads(json.dumps(parse_args(["--batch-id", "x"]).model_dump()))["resume_from"] is None
