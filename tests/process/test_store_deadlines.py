"""A stalled object store (accepts connections, never answers): every store call ends in bounded time with one
:class:`classify.errors.StoreUnreachable` naming the call, and the limits come from ``store_limits``.

The store is a real socket on 127.0.0.1 (:func:`tests.support.s3server.stalled_s3`) reached through the real
s3fs/aiobotocore stack, with the limits set short (1 s, 2 attempts); each test has a pytest-timeout far below
what the libraries' own defaults take on such a store (minutes per call, a PUT forever), so on code without
the deadlines the tests fail rather than hang.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from classify.errors import ConfigError, StoreUnreachable
from classify.runs import storage
from tests.support.processes import docpilot_env, run_docpilot
from tests.support.s3server import stalled_s3

BOUND_S = 20.0
"""Most seconds one call may take on the stalled store with 1 s x 2 attempts (about 4 s expected)."""


def _folder(tmp_path: Path) -> Path:
    src = tmp_path / "run"
    (src / "shards").mkdir(parents=True)
    (src / "results.jsonl").write_text('{"id": "a"}\n')
    (src / "shards" / "00000.jsonl").write_text('{"id": "a"}\n')
    return src


def _calls(tmp_path: Path):
    from batch.run.mirror import write_mirror
    from batch.run.offpod import read_remote_ledger, restore_run
    from classify.runs.export import export_run, verify_export

    src = _folder(tmp_path)
    url = "s3://docpilot-stalled/exports/b1"
    (tmp_path / "pod2").mkdir()
    return {
        "read_remote_ledger": lambda: read_remote_ledger(url),
        "restore_run": lambda: restore_run(url, tmp_path / "pod2"),
        "exists": lambda: storage.exists(url, "SHA256SUMS"),
        "upload_file": lambda: storage.upload_file(src / "results.jsonl", f"{url}/results.jsonl"),
        "upload_tree": lambda: storage.upload_tree(src, ["results.jsonl", "shards/00000.jsonl"], url, last="results.jsonl"),
        "list_files": lambda: storage.list_files(url),
        "download_tree": lambda: storage.download_tree(url, tmp_path / "back"),
        "download_file": lambda: storage.download_file(f"{url}/results.jsonl", tmp_path / "one"),
        "mirror write": lambda: write_mirror(f"{url}.progress.json", b"{}"),
        "export_run": lambda: export_run(src, url),
        "verify_export": lambda: verify_export(url),
    }


@pytest.mark.timeout(240)
@pytest.mark.slow  # about 36 s of store deadlines run out one by one (make test-slow)
def test_every_store_call_on_a_stalled_store_ends_in_time_with_one_message(tmp_path):
    with stalled_s3(timeout_s=1.0, attempts=2) as (env, held):
        (tmp_path / "back").mkdir()
        for name, call in _calls(tmp_path).items():
            before = len(held)
            t0 = time.monotonic()
            with pytest.raises(StoreUnreachable) as err:
                call()
            took = time.monotonic() - t0
            assert took < BOUND_S, f"{name} took {took:.1f} s"
            text = str(err.value)
            assert "object store did not answer" in text and "s3://docpilot-stalled/exports/b1" in text, (name, text)
            assert env["AWS_ENDPOINT_URL"] in text and "2 attempt(s) of 1 s" in text, (name, text)
            assert "DOCPILOT_STORE_TIMEOUT_S" in text, (name, text)
            assert err.value.exit_code == 6 and isinstance(err.value, OSError)
            # the retry budget is botocore's alone: 2 attempts (not s3fs's 5 on top), each a new connection
            assert 1 <= len(held) - before <= 2 * 2, f"{name}: {len(held) - before} connections"


@pytest.mark.timeout(60)
def test_the_final_progress_mirror_on_a_stalled_store_ends_and_the_batch_goes_on(tmp_path):
    """The mirror's last write is synchronous at the end of a batch (before export, wrap-up and the stop command):
    it used to hold the batch there with SIGTERM answered "already stopping"."""
    from batch.run.mirror import ProgressMirror

    local = tmp_path / "progress.json"
    local.write_text(json.dumps({"state": "done"}))
    with stalled_s3(timeout_s=1.0, attempts=2):
        mirror = ProgressMirror("s3://docpilot-stalled/exports/b1.progress.json", every_s=0.0)
        t0 = time.monotonic()
        mirror.offer(local)  # in the background
        mirror.offer(local, final=True)  # joins it, then writes once more
        assert time.monotonic() - t0 < 2 * BOUND_S
        assert mirror.errors == 2 and mirror.writes == 0


@pytest.mark.timeout(90)
def test_status_from_a_stalled_store_is_exit_6_in_time(tmp_path):
    """The real command: ``docpilot status --from s3://...`` on the stalled store ends with exit 6 and the message
    (one outage is one wait: the second place it would look at is on the same store)."""
    with stalled_s3(timeout_s=1.0, attempts=2) as (env, _held):
        run_env = {**docpilot_env(tmp_path), **env}
        t0 = time.monotonic()
        done = run_docpilot("status", "--from", "s3://docpilot-stalled/exports/b1", env=run_env, timeout=60)
        took = time.monotonic() - t0
    assert done.returncode == 6, done.stderr
    assert "object store did not answer: read s3://docpilot-stalled/exports/b1.progress.json" in done.stderr
    assert took < BOUND_S + 10  # the interpreter's start-up included


@pytest.mark.parametrize(("name", "value"), [("DOCPILOT_STORE_TIMEOUT_S", "abc"), ("DOCPILOT_STORE_TIMEOUT_S", "0"),
                                             ("DOCPILOT_STORE_TIMEOUT_S", "1e9"), ("DOCPILOT_STORE_ATTEMPTS", "0"),
                                             ("DOCPILOT_STORE_ATTEMPTS", "2.5"), ("DOCPILOT_STORE_ATTEMPTS", "99")])
def test_store_limits_out_of_range_are_a_config_error_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"^{name} must be .* got {value!r}; unset it for the default"):
        storage.filesystem("s3://bucket/x")


def test_store_limits_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv("DOCPILOT_STORE_TIMEOUT_S", raising=False)
    monkeypatch.delenv("DOCPILOT_STORE_ATTEMPTS", raising=False)
    assert storage.store_limits() == (storage.STORE_TIMEOUT_S, storage.STORE_ATTEMPTS)
    monkeypatch.setenv("DOCPILOT_STORE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("DOCPILOT_STORE_ATTEMPTS", "4")
    assert storage.store_limits() == (2.5, 4)
    fs, _ = storage.filesystem("s3://bucket/x")
    assert fs.retries == 1
    conf = fs.config_kwargs
    assert conf["read_timeout"] == conf["connect_timeout"] == 2.5
    assert conf["retries"] == {"mode": "standard", "total_max_attempts": 4}


@pytest.mark.timeout(90)
def test_the_shard_uploader_on_a_stalled_store_fails_rounds_in_time_and_never_blocks(tmp_path):
    """The uploader's calls have the store's deadlines and its failures the one message: a round on a stalled store
    ends as a counted failure naming the call, ``shard_written`` returns at once, and ``close`` ends in bounded time."""
    from batch.run.offpod import ShardUploader, shard_rel

    run = tmp_path / "run"
    (run / shard_rel(0)).parent.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    for i in range(2):
        (run / shard_rel(i)).write_text(f'{{"id": "d{i}"}}\n')
    with stalled_s3(timeout_s=1.0, attempts=2):
        up = ShardUploader(run, "s3://docpilot-stalled/exports/b1", 2)
        t0 = time.monotonic()
        up.start([0])  # the ledger read at start times out too: everything is queued
        up.shard_written(1)
        assert time.monotonic() - t0 < BOUND_S
        t1 = time.monotonic()
        up.shard_written(1)
        assert time.monotonic() - t1 < 0.5
        deadline = time.monotonic() + 2 * BOUND_S
        while up.lag()["errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        lag = up.lag()
        assert lag["errors"] >= 1 and lag["shards_pending"] == 2 and lag["shards_copied"] == 0
        assert lag["last_error"].startswith("StoreUnreachable: object store did not answer: upload "
                                            "s3://docpilot-stalled/exports/b1/"), lag["last_error"]
        t2 = time.monotonic()
        assert up.close(wait_s=2 * BOUND_S) is False  # one more try, in bounded time; the export sends the rest
        assert time.monotonic() - t2 < 2 * BOUND_S


@pytest.mark.timeout(60)
def test_the_uploader_never_holds_the_pool_at_start_on_a_stalled_store(tmp_path):
    """Issue 55: the pool waited about 90 s at start for the off-pod ledger read. ``start`` makes no store call now,
    and the claim of the export location is waited for only briefly: the copy waits for the store, the pool does not."""
    from batch.run.offpod import ShardUploader, shard_rel

    run = tmp_path / "run"
    (run / shard_rel(0)).parent.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / shard_rel(0)).write_text('{"id": "d0"}\n')
    with stalled_s3(timeout_s=1.0, attempts=2) as (_env, held):
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # a cached filesystem would still point at an earlier test's port
        dest = "s3://docpilot-stalled/exports/b1"
        plain = ShardUploader(run, dest, 1)
        t0 = time.monotonic()
        plain.start([0])  # the ledger read it used to make here is the thread's now
        assert time.monotonic() - t0 < 0.5
        from batch.run.owner import ExportOwner

        owned = ShardUploader(run, dest, 1, ExportOwner(dest, "b1", run))
        t1 = time.monotonic()
        owned.claim(0.5)  # no answer: the start goes on, nothing is written before the claim holds
        owned.start([0])
        assert time.monotonic() - t1 < 1.5
        assert not owned.owner.held and owned.refused is None
        t2 = time.monotonic()
        assert plain.close(wait_s=2 * BOUND_S) is False and owned.close(wait_s=2 * BOUND_S) is False
        assert time.monotonic() - t2 < 2 * BOUND_S
        assert held  # the store was asked (and never answered)


@pytest.mark.timeout(60)
def test_done_here_but_the_store_stalls_ends_within_the_deadline_with_its_own_state(caplog):
    """The end of a batch whose work is done here: the copy off the pod is waited for at most the store deadline,
    with a line while it waits, then ``OffPodPending`` (exit 9) says what was done and where the copy stood."""
    import logging
    import threading

    from batch.run import finish
    from classify.errors import OffPodPending

    hold = threading.Event()

    def stalled_copy(stage):
        stage("writing the export and re-checking it")
        hold.wait(60)  # a store call that never returns

    old = finish.LOG_EVERY_S
    finish.LOG_EVERY_S = 0.5
    try:
        caplog.set_level(logging.INFO, logger="docpilot.batch")
        t0 = time.monotonic()
        with pytest.raises(OffPodPending) as err:
            finish.off_pod_within(stalled_copy, batch_id="b1", run_dir="runs/b1", dest="s3://bkt/exports/b1",
                                  deadline_s=2.0)
        took = time.monotonic() - t0
    finally:
        finish.LOG_EVERY_S = old
        hold.set()
    assert 2.0 <= took < 4.0
    assert err.value.exit_code == 9
    assert str(err.value).startswith("batch b1: done here, not yet off the pod: every shard is classified and merged "
                                     "in runs/b1, but the copy to s3://bkt/exports/b1 did not finish within 2 s")
    assert "it was at: writing the export and re-checking it" in str(err.value)
    waiting = [r.getMessage() for r in caplog.records if "waiting for the store" in r.getMessage()]
    assert waiting and "writing the export and re-checking it" in waiting[0] and "DOCPILOT_STORE_DEADLINE_S" in waiting[0]


@pytest.mark.timeout(60)
def test_sigterm_ends_the_wait_for_a_stalled_store_within_a_second(tmp_path):
    """SIGTERM while the copy off the pod waits on the store: ``Interrupted`` at once (it used to be answered
    "already stopping" for minutes, the main thread inside the store call)."""
    import os
    import signal
    import threading

    from batch.run import finish
    from classify.errors import Interrupted
    from classify.runs.records import signals_raise_interrupted

    hold = threading.Event()
    threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Interrupted, match="stopped by SIGTERM"), signals_raise_interrupted():
            finish.off_pod_within(lambda stage: hold.wait(60), batch_id="b1", run_dir="r", dest="s3://b/e/b1",
                                  deadline_s=600.0)
    finally:
        hold.set()
    assert time.monotonic() - t0 < 3.0
