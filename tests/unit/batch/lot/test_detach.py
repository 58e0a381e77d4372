"""Detached batches (``docpilot batch --detach``), ``status --follow``, SIGHUP to a foreground batch, and the
progress mirrored off the pod (a local folder and a real S3 API on 127.0.0.1) read back by ``status --from``.

The detach test is the real path: the real command started from a shell in its own session, that whole
session killed, real Ray and the real vLLM engine finishing the batch; the mirror-to-S3 test runs the real
driver and Ray pool with the bench-only instant engine (fast), the local mirror is checked on the real path.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_detach_ray.py``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from batch.run import mirror as _mirror
from batch.run.progress import Progress
from tests.support.processes import docpilot_env, run_docpilot
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - lease_s3 is a fixture

ROOT = Path(__file__).resolve().parents[4]


def test_child_argv_drops_only_the_detach_options():
    from docpilot.detach import child_argv

    assert child_argv(["--corpus", "c", "--detach", "--stop-when-done", "--wrap-up-to", "s3://b/x", "--batch-id", "b"]) == \
        ["--corpus", "c", "--batch-id", "b"]
    assert child_argv(["--wrap-up-to=/d", "--detach", "--", "--detach"]) == ["--", "--detach"]


def _standin_start(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """A start that passes every check needing no engine: a small corpus, and a model folder that resolves
    (``config.json``, ``fingerprint.json``) but whose listed weights are missing, so the run itself fails once it
    re-hashes them (exit 5). Returns ``(env, config, corpus)``."""
    model = tmp_path / "standin-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "fingerprint.json").write_text(json.dumps({"fingerprint": "sha256:" + "5" * 64, "files": {
        "model.safetensors": {"bytes": 1, "sha256": "0" * 64}}}))
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["model"]["base_model"] = str(model)
    config = tmp_path / "docpilot.json"
    config.write_text(json.dumps(data))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "Shares rose."}\n')
    env = docpilot_env(tmp_path)
    env.update(DOCPILOT_REGISTRY=str(tmp_path / "registry"), DOCPILOT_HOME=str(tmp_path / "home"))
    return env, config, corpus


def test_follow_exits_with_the_status_of_a_detached_batch_that_failed(tmp_path):
    env, config, corpus = _standin_start(tmp_path)
    started = run_docpilot("batch", "--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--detach",
                           env=env)
    assert started.returncode == 0, started.stderr
    batch_id = re.search(r"^batch (\S+) detached", started.stdout, re.M).group(1)
    assert f"docpilot status {batch_id} --follow" in started.stdout and "log:" in started.stdout
    followed = run_docpilot("status", batch_id, "--follow", env=env)
    assert followed.returncode == 5, followed.stderr  # ModelIntegrityError's exit code, as the batch itself exited
    assert "model.safetensors" in followed.stderr and "ended: exit 5" in followed.stderr
    record = json.loads((tmp_path / "runs" / batch_id / "exit.json").read_text())
    assert record["exit_code"] == 5
    assert "model.safetensors" in (tmp_path / "runs" / batch_id / "batch.log").read_text()


@pytest.mark.parametrize(("case", "code", "says"), [
    ("no corpus", 3, "does not exist"),
    ("unknown adapter", 4, "nope"),
    ("not piloted", 7, "has not passed a pilot"),
    ("export folder unwritable", 6, "cannot be written"),
])
def test_detach_makes_the_foreground_start_checks_before_it_detaches(tmp_path, case, code, says):
    """``make batch DETACH=1`` refuses what the foreground start refuses before the engine, with the same exit code,
    in the terminal: nothing is detached, no run folder is made (it used to print "detached" and exit 0)."""
    env, config, corpus = _standin_start(tmp_path)
    argv = ["batch", "--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--detach"]
    if case == "no corpus":
        argv[4] = str(tmp_path / "missing.jsonl")
    elif case == "unknown adapter":
        argv += ["--adapter", "nope@1"]
    elif case == "not piloted":
        argv.remove("--skip-pilot-gate")
    else:
        (tmp_path / "a-file").write_text("x")
        argv += ["--export-dir", str(tmp_path / "a-file" / "exports")]
    done = run_docpilot(*argv, env=env)
    assert done.returncode == code, done.stderr
    assert says in done.stderr and "detached" not in done.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_progress_is_mirrored_at_most_every_interval_and_always_at_the_end(tmp_path, monkeypatch):
    target = tmp_path / "offpod" / "b1.progress.json"
    mirror = _mirror.ProgressMirror(target, every_s=0.5)
    run_dir = tmp_path / "runs" / "b1"
    run_dir.mkdir(parents=True)
    progress = Progress(run_dir, "b1", total=10, mirror=mirror)
    progress.start({})
    mirror._thread.join()
    assert mirror.writes == 1 and json.loads(target.read_text())["state"] == "running"
    for _ in range(5):  # saved locally each time, mirrored not again within the interval
        progress.update(retries=progress.retries + 1)
    assert mirror.writes == 1 and json.loads(target.read_text())["retries"] == 0
    time.sleep(0.6)
    progress.update(retries=9)
    mirror._thread.join()
    assert mirror.writes == 2 and json.loads(target.read_text())["retries"] == 9
    progress.shard_counted(10, 9, 1, 100)
    progress.finish()  # at once, whatever the interval
    assert mirror.writes == 3 and json.loads(target.read_text())["state"] == "done"
    assert _mirror.progress_mirror(None, "b1") is None  # no export location set: nothing mirrored

    broken = _mirror.ProgressMirror(tmp_path / "offpod" / "b1.progress.json" / "not-a-dir" / "x.json", every_s=0)
    Progress(run_dir, "b1", total=10, mirror=broken).fail("boom")  # an unwritable mirror never stops the batch
    assert broken.errors == 1


def test_train_detach_follow_gives_its_exit_status_and_stop_when_done_needs_a_destination(tmp_path):
    env = docpilot_env(tmp_path)
    refused = run_docpilot("train", "--config", str(tmp_path / "none.json"), "--detach", "--stop-when-done", env=env)
    assert refused.returncode == 3 and "--stop-when-done needs --wrap-up-to" in refused.stderr
    started = run_docpilot("train", "--config", str(tmp_path / "none.json"), "--detach", env=env)
    assert started.returncode == 0, started.stderr
    job = re.search(r"^training job (\S+) detached", started.stdout, re.M).group(1)
    followed = run_docpilot("status", job, "--follow", env=env)
    assert followed.returncode == 2, followed.stderr  # a missing config file: ConfigError, as `docpilot train` exits
    assert f"training job {job} ended: exit 2" in followed.stderr


def test_stop_when_done_wraps_up_and_stops_only_after_a_successful_verified_run(tmp_path, monkeypatch, bbc_dir):
    from docpilot.detach import stop_when_done

    marker = tmp_path / "stopped.marker"
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('stopped\\n')"]}
    (tmp_path / "lots.json").write_text(json.dumps(lots))
    from tests.support.transfer import batch_run

    run = batch_run(tmp_path, bbc_dir)  # a finished batch in tmp/runs
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCPILOT_REGISTRY", str(tmp_path / "registry"))
    lots_path = str(tmp_path / "lots.json")
    failed = stop_when_done(run, "batch", 5, str(tmp_path / "offpod"), lots_path)
    assert failed["decision"] == "skipped" and "exited 5" in failed["reason"] and not marker.exists()
    assert not (tmp_path / "offpod").exists()  # a failed run is not even wrapped up
    nowhere = stop_when_done(run, "batch", 0, None, lots_path)
    assert nowhere["decision"] == "skipped" and "nothing was exported" in nowhere["reason"]
    done = stop_when_done(run, "batch", 0, str(tmp_path / "offpod"), lots_path)
    assert done["decision"] == "ran" and marker.read_text() == "stopped\n"
    assert (tmp_path / "offpod" / run.name / "SHA256SUMS").is_file()
    decisions = json.loads((run / "lease-stop.json").read_text())["decisions"]
    assert [d["decision"] for d in decisions] == ["skipped", "skipped", "ran"]


def test_status_from_says_done_only_beside_a_complete_export(tmp_path, capsys):
    """The mirror is written "done" once classified; off the pod that reads "classified, not exported" until the
    export's SHA256SUMS is there."""
    from batch.lot import status

    record = {"batch_id": "b-late", "state": "done", "done": 3, "total": 3, "accepted": 3, "rejected": 0,
              "started_at": "2026-12-02T00:00:00Z", "updated_at": "2026-12-02T00:01:00Z", "host": "pod"}
    (tmp_path / "b-late.progress.json").write_text(json.dumps(record))
    assert status.main(["--from", f"{tmp_path}/b-late", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"].startswith("classified, not exported") and st["exported"] is False
    (tmp_path / "b-late").mkdir()
    (tmp_path / "b-late" / "SHA256SUMS").write_text("")
    assert status.main(["--from", f"{tmp_path}/b-late", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "done"


def test_an_old_detached_record_whose_pid_was_reused_is_followed_to_its_end(tmp_path, capsys):
    """A run folder written before process start times were recorded (``detach.json`` and ``progress.json`` with a
    pid only), its pid now held by an unrelated live process (this test's ``sleep``): ``status`` says interrupted and
    ``--follow`` ends, saying the record is old, instead of following for ever."""
    import socket
    import subprocess
    import threading

    from batch.lot import status
    from batch.runfiles import ProgressFile

    run_dir = tmp_path / "runs" / "b-old"
    run_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        then = "2026-11-01T10:00:00Z"  # the record's own time: the run's processes ran then
        (run_dir / "detach.json").write_text(json.dumps({"kind": "batch", "run_id": "b-old", "supervisor_pid": other.pid,
                                                         "child_pid": other.pid, "host": socket.gethostname(),
                                                         "log": str(run_dir / "batch.log"), "started_at": then}))
        (run_dir / "progress.json").write_text(json.dumps({"state": "running", "pid": other.pid,
                                                           "host": socket.gethostname(), "started_at": then,
                                                           "updated_at": then}))
        progress = ProgressFile.read(run_dir / "progress.json")
        assert status._driver_alive(progress) is False
        assert status._driver_alive(progress.model_copy(update={"updated_at": None})) is True  # nothing to tell by
        result: list[int] = []
        follower = threading.Thread(target=lambda: result.append(status.follow("b-old", tmp_path / "runs", poll_s=0.05)),
                                    daemon=True)
        follower.start()
        follower.join(10)
        assert not follower.is_alive(), "--follow still following a record whose pid another process holds"
        assert result == [1]
        err = capsys.readouterr().err
        assert "gone without an exit status" in err and "the run folder's record is old" in err
        assert other.poll() is None  # the unrelated process is left alone
    finally:
        other.kill()
        other.wait()
