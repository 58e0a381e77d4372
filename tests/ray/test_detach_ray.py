"""Detached batches (``docpilot batch --detach``), ``status --follow``, SIGHUP to a foreground batch, and the
progress mirrored off the pod (a local folder and a real S3 API on 127.0.0.1) read back by ``status --from``.

The detach test is the real path: the real command started from a shell in its own session, that whole
session killed, real Ray and the real vLLM engine finishing the batch; the mirror-to-S3 test runs the real
driver and Ray pool with the bench-only instant engine (fast), the local mirror is checked on the real path.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/lot/test_detach.py``.
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

from tests.support.processes import docpilot_env, kill_seen, run_docpilot, still_alive, watch_descendants
from tests.support.s3server import BUCKET, lease_s3  # noqa: F401 - lease_s3 is a fixture
from tests.support.transfer import s3_fs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["Shares rose as the bank's profits beat forecasts.", "The striker scored twice in the cup final.",
        "The new phone's chip runs the model on the device.", "Parliament voted on the budget late on Tuesday."]


@pytest.mark.usefixtures("lease_s3")
def test_a_batch_mirrors_its_progress_to_s3_and_status_from_reads_it(local_ray, tmp_path, monkeypatch, capsys):
    from batch.lot import status
    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class
    from tests.support.corpora import write_config

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"{t} {i}"}) + "\n" for i, t in enumerate(DOCS * 5)))
    root = f"s3://{BUCKET}/mirror-{tmp_path.name[-12:]}"
    args = parse_args(["--config", str(write_config(tmp_path / "c.json", shard_docs=4)), "--corpus", str(corpus),
                       "--batch-id", "b-mirror", "--skip-pilot-gate", "--no-progress", "--export-dir", root])
    summary = run_batch(args, _engine_actor=remote_class())
    assert summary["total"] == 20
    key = f"{root[len('s3://'):]}/b-mirror.progress.json"
    mirrored = json.loads(s3_fs().cat_file(key))
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


@pytest.mark.engine
@pytest.mark.slow  # about 105 s on 2 cores: two batches with their own engines (make test-slow)
def test_sighup_stops_a_foreground_batch_resumably_then_a_detached_resume_outlives_its_session(tmp_path):
    """SIGHUP to the foreground batch's process group (what a dropped SSH connection sends): exit 130, the advice to
    detach with the batch id, nothing of Ray left. The same batch id resumed with --detach from a shell in its own
    session; that whole session is killed; the batch finishes anyway with every id exactly once, ``status --follow``
    exits 0 as the batch did, and its progress is mirrored to the export folder, where ``status --from`` reads it."""
    from tests.support.corpora import write_config

    env = docpilot_env(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    offpod = tmp_path / "offpod"
    config = write_config(tmp_path / "batch.json", cpu_actors=1)
    args = ["batch", "--config", str(config), "--corpus", str(corpus), "--skip-pilot-gate", "--export-dir", str(offpod)]

    fg = subprocess.Popen([sys.executable, "-m", "docpilot", *args, "--no-progress"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: dict[int, tuple[str, float]] = {}
    try:
        watch_descendants(fg, "ray::RuntimeEnvAgent", 120, seen)
        os.killpg(fg.pid, signal.SIGHUP)  # the terminal's hangup reaches its whole foreground process group
        out, _ = fg.communicate(timeout=90)
        assert fg.returncode == 130, out[-3000:]
        assert "error [interrupted]: stopped by SIGHUP" in out and "--detach" in out, out[-3000:]
        batch_id = re.search(r"--batch-id (\S+) --detach", out).group(1)
        deadline = time.monotonic() + 10
        while still_alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert still_alive(seen) == [], f"left behind after SIGHUP: {still_alive(seen)}"
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait()
        kill_seen(seen)
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
        followed = run_docpilot("status", batch_id, "--follow", env=env, timeout=420)
        assert followed.returncode == 0, (followed.stderr[-3000:], (run_dir / "batch.log").read_text()[-3000:])
        assert "ended: exit 0" in followed.stderr
        assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 0
        ids = [json.loads(line)["id"] for line in (run_dir / "results.jsonl").read_text().splitlines()]
        assert sorted(ids) == sorted(f"d{i}" for i in range(len(DOCS)))  # every id exactly once
        mirrored = json.loads((offpod / f"{batch_id}.progress.json").read_text())
        assert mirrored["state"] == "done" and mirrored["done"] == len(DOCS)
        remote = run_docpilot("status", "--from", str(offpod / batch_id), env=env)
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
