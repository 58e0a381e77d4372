"""Detached batches (``docpilot batch --detach``), ``status --follow``, SIGHUP to a foreground batch, and the
progress mirrored off the pod (a local folder and a real S3 API on 127.0.0.1) read back by ``status --from``.

The detach test is the real path: the real command started from a shell in its own session, that whole
session killed, real Ray and the real vLLM engine finishing the batch; the mirror-to-S3 test runs the real
driver and Ray pool with the bench-only instant engine (fast), the local mirror is checked on the real path.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batch import _mirror
from batch._progress import Progress
from tests.s3server import BUCKET, lease_s3  # noqa: F401 - lease_s3 is a fixture
from tests.test_quiet_and_stop import _alive, _kill, _watch
from tests.test_transfer import _fs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["Shares rose as the bank's profits beat forecasts.", "The striker scored twice in the cup final.",
        "The new phone's chip runs the model on the device.", "Parliament voted on the budget late on Tuesday."]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(DOCPILOT_RUNS=str(tmp_path / "runs"), PYTHONPATH=str(ROOT))
    return env


def _docpilot(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "docpilot", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_child_argv_drops_only_the_detach_options():
    from batch.detach import child_argv

    assert child_argv(["--corpus", "c", "--detach", "--stop-when-done", "--wrap-up-to", "s3://b/x", "--batch-id", "b"]) == \
        ["--corpus", "c", "--batch-id", "b"]
    assert child_argv(["--wrap-up-to=/d", "--detach", "--", "--detach"]) == ["--", "--detach"]


def test_follow_exits_with_the_status_of_a_detached_batch_that_failed(tmp_path):
    env = _env(tmp_path)
    started = _docpilot("batch", "--corpus", str(tmp_path / "missing.jsonl"), "--skip-pilot-gate", "--detach", env=env)
    assert started.returncode == 0, started.stderr
    batch_id = re.search(r"^batch (\S+) detached", started.stdout, re.M).group(1)
    assert f"docpilot status {batch_id} --follow" in started.stdout and "log:" in started.stdout
    followed = _docpilot("status", batch_id, "--follow", env=env)
    assert followed.returncode == 3, followed.stderr  # InputError's exit code, as the batch itself exited
    assert "does not exist" in followed.stderr and "ended: exit 3" in followed.stderr
    record = json.loads((tmp_path / "runs" / batch_id / "exit.json").read_text())
    assert record["exit_code"] == 3
    assert "does not exist" in (tmp_path / "runs" / batch_id / "batch.log").read_text()


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


@pytest.mark.ray
@pytest.mark.usefixtures("lease_s3")
def test_a_batch_mirrors_its_progress_to_s3_and_status_from_reads_it(instant_ray, tmp_path, monkeypatch, capsys):
    from batch import status
    from batch.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from tests.test_batch_helpers import write_config

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"{t} {i}"}) + "\n" for i, t in enumerate(DOCS * 5)))
    root = f"s3://{BUCKET}/mirror-{tmp_path.name[-12:]}"
    args = parse_args(["--config", str(write_config(tmp_path / "c.json", shard_docs=4)), "--corpus", str(corpus),
                       "--batch-id", "b-mirror", "--skip-pilot-gate", "--no-progress", "--export-dir", root])
    summary = run_batch(args, _engine_actor=remote_class())
    assert summary["total"] == 20
    key = f"{root[len('s3://'):]}/b-mirror.progress.json"
    mirrored = json.loads(_fs().cat_file(key))
    assert mirrored["state"] == "done" and mirrored["done"] == 20 and mirrored["batch_id"] == "b-mirror"

    assert status.main(["--from", f"{root}/b-mirror", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "done" and st["done"] == st["total"] == 20 and st["exported"] is True
    assert st["source"].endswith("b-mirror.progress.json")
    assert status.main(["--from", f"{root}/b-mirror"]) == 0
    out = capsys.readouterr().out
    assert "batch b-mirror: done" in out and "20/20 ids" in out and "exported  yes" in out
    from classify.errors import InputError

    with pytest.raises(InputError, match=r"no mirrored progress at .*b-nothing"):
        status.main(["--from", f"{root}/b-nothing"])


def _read_until(proc: subprocess.Popen, pattern: str, timeout_s: float) -> str:
    """Read ``proc``'s stdout (unbuffered) until a line matches ``pattern`` (the shell keeps running after it)."""
    text, deadline = "", time.monotonic() + timeout_s
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text += chunk.decode(errors="replace")
            if re.search(pattern, text, re.M):
                return text
        elif proc.poll() is not None:
            break
    pytest.fail(f"no line matching {pattern!r} within {timeout_s} s:\n{text[-3000:]}")


@pytest.mark.ray
@pytest.mark.engine
def test_sighup_stops_a_foreground_batch_resumably_then_a_detached_resume_outlives_its_session(tmp_path):
    """SIGHUP to the foreground batch's process group (what a dropped SSH connection sends): exit 130, the advice to
    detach with the batch id, nothing of Ray left. The same batch id resumed with --detach from a shell in its own
    session; that whole session is killed; the batch finishes anyway with every id exactly once, ``status --follow``
    exits 0 as the batch did, and its progress is mirrored to the export folder, where ``status --from`` reads it."""
    from tests.test_batch_helpers import write_config

    env = _env(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    offpod = tmp_path / "offpod"
    config = write_config(tmp_path / "batch.json", cpu_actors=1)
    args = ["batch", "--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--export-dir", str(offpod)]

    fg = subprocess.Popen([sys.executable, "-m", "docpilot", *args, "--no-progress"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}
    try:
        _watch(fg, "ray::RuntimeEnvAgent", 120, seen)
        os.killpg(fg.pid, signal.SIGHUP)  # the terminal's hangup reaches its whole foreground process group
        out, _ = fg.communicate(timeout=90)
        assert fg.returncode == 130, out[-3000:]
        assert "error [interrupted]: stopped by SIGHUP" in out and "--detach" in out, out[-3000:]
        batch_id = re.search(r"--batch-id (\S+) --detach", out).group(1)
        deadline = time.monotonic() + 10
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(seen) == [], f"left behind after SIGHUP: {_alive(seen)}"
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait()
        _kill(seen)
    run_dir = tmp_path / "runs" / batch_id
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "stopped by SIGHUP" in manifest["attempts"][-1]["error"]
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 130

    cmd = " ".join([sys.executable, "-m", "docpilot", *args, "--batch-id", batch_id, "--detach"])
    shell = subprocess.Popen(["bash", "-c", f"{cmd}; exec sleep 600"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    supervisor = None
    try:
        printed = _read_until(shell, r"^follow: ", 60)
        assert f"batch {batch_id} detached" in printed and f"{run_dir}/batch.log" in printed
        supervisor = json.loads((run_dir / "detach.json").read_text())["supervisor_pid"]
        os.killpg(shell.pid, signal.SIGHUP)  # the session that started it ends: hangup, then kill what is left
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(10)
        time.sleep(1)
        os.kill(supervisor, 0)  # still running: it is in a session of its own
        followed = _docpilot("status", batch_id, "--follow", env=env, timeout=420)
        assert followed.returncode == 0, (followed.stderr[-3000:], (run_dir / "batch.log").read_text()[-3000:])
        assert "ended: exit 0" in followed.stderr
        assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 0
        ids = [json.loads(line)["id"] for line in (run_dir / "results.jsonl").read_text().splitlines()]
        assert sorted(ids) == sorted(f"d{i}" for i in range(len(DOCS)))  # every id exactly once
        mirrored = json.loads((offpod / f"{batch_id}.progress.json").read_text())
        assert mirrored["state"] == "done" and mirrored["done"] == len(DOCS)
        remote = _docpilot("status", "--from", str(offpod / batch_id), env=env)
        assert remote.returncode == 0 and f"batch {batch_id}: done" in remote.stdout and "exported  yes" in remote.stdout
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        if supervisor is None and (run_dir / "detach.json").is_file():
            supervisor = json.loads((run_dir / "detach.json").read_text())["supervisor_pid"]
        if supervisor is not None:
            try:
                os.kill(supervisor, signal.SIGTERM)  # only if the test failed before the batch ended: a clean stop
                time.sleep(20)
                os.killpg(supervisor, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_train_detach_follow_gives_its_exit_status_and_stop_when_done_needs_a_destination(tmp_path):
    env = _env(tmp_path)
    refused = _docpilot("train", "--config", str(tmp_path / "none.json"), "--detach", "--stop-when-done", env=env)
    assert refused.returncode == 3 and "--stop-when-done needs --wrap-up-to" in refused.stderr
    started = _docpilot("train", "--config", str(tmp_path / "none.json"), "--detach", env=env)
    assert started.returncode == 0, started.stderr
    job = re.search(r"^training job (\S+) detached", started.stdout, re.M).group(1)
    followed = _docpilot("status", job, "--follow", env=env)
    assert followed.returncode == 2, followed.stderr  # a missing config file: ConfigError, as `docpilot train` exits
    assert f"training job {job} ended: exit 2" in followed.stderr


def test_stop_when_done_wraps_up_and_stops_only_after_a_successful_verified_run(tmp_path, monkeypatch, bbc_dir):
    from batch.detach import stop_when_done

    marker = tmp_path / "stopped.marker"
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('stopped\\n')"]}
    (tmp_path / "lots.json").write_text(json.dumps(lots))
    from tests.test_transfer import _batch_run

    run = _batch_run(tmp_path, bbc_dir)  # a finished batch in tmp/runs
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
    from batch import status

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
