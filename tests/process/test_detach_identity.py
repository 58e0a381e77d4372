"""A detached run's processes by identity (pid + start time + boot, as psutil gives it), and one supervisor per run folder.

Real processes throughout: the real supervisor of :mod:`docpilot.detach` runs a stand-in for the docpilot
command (an interpreter wrapper that sleeps instead of running a batch), and ``docpilot status --follow`` is the
real command. On code that trusted a bare pid (or a host name it could not check), ``--follow`` never ended
here and the second detached start wrote its exit record into the first one's folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from classify.errors import InputError
from classify.runs.detached import pid_alive, process_identity, read_exit
from docpilot import detach as _detach
from tests.support.processes import docpilot_env, run_docpilot


def _standin(tmp_path, sleep_s: float):
    """An "interpreter" whose ``-m docpilot ...`` sleeps ``sleep_s`` s and exits 0; anything else runs the real one."""
    script = tmp_path / "python-standin"
    script.write_text(f'#!/bin/sh\nif [ "$2" = docpilot ]; then sleep {sleep_s}; exit 0; fi\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return str(script)


def _wait_exit(run_dir, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while (ended := read_exit(run_dir)) is None:
        assert time.monotonic() < deadline, "no exit.json"
        time.sleep(0.1)
    return ended


def test_a_second_detached_start_of_one_run_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(_detach.sys, "executable", _standin(tmp_path, 3))
    run_dir = tmp_path / "runs" / "b1"
    run_dir.mkdir(parents=True)
    assert _detach.start_detached("batch", "b1", run_dir, ["--batch-id", "b1"], lots_config=None) == 0
    first = json.loads((run_dir / "detach.json").read_text())
    with pytest.raises(InputError, match=rf"^b1 is already running detached \(supervisor pid {first['supervisor_pid']}, "
                                         r"started .*; follow it with `docpilot status b1 --follow`, stop it with "
                                         rf"`kill {first['supervisor_pid']}`"):
        _detach.start_detached("batch", "b1", run_dir, ["--batch-id", "b1"], lots_config=None)
    assert json.loads((run_dir / "detach.json").read_text()) == first  # the loser touched nothing
    assert read_exit(run_dir) is None
    assert _wait_exit(run_dir)["exit_code"] == 0  # the winner's own record
    time.sleep(0.5)  # the supervisor ends just after its record: then the folder is free again
    assert _detach.start_detached("batch", "b1", run_dir, ["--batch-id", "b1"], lots_config=None) == 0
    assert _wait_exit(run_dir)["exit_code"] == 0


def test_pid_alive_knows_a_reused_pid_another_host_and_another_boot(tmp_path):
    proc = subprocess.Popen(["sleep", "30"])
    try:
        me = process_identity(proc.pid)
        assert pid_alive(me["pid"], me["host"], me["pid_started"], me["boot_id"]) is True
        assert pid_alive(me["pid"], me["host"], me["pid_started"] - 60, me["boot_id"]) is False  # reused pid
        assert pid_alive(me["pid"], "another-pod-7f9c", me["pid_started"], "0" * 8 + "-other-boot") is False
        assert pid_alive(me["pid"], "renamed-pod", me["pid_started"], me["boot_id"]) is True  # same boot: this machine
        assert pid_alive(me["pid"], me["host"], me["pid_started"], "0" * 8 + "-other-boot") is False  # rebooted
        assert pid_alive(None, me["host"]) is None
    finally:
        proc.kill()
        proc.wait()
    assert pid_alive(me["pid"], me["host"], me["pid_started"], me["boot_id"]) is False


@pytest.mark.parametrize("how", ["another host", "pid reused"])
def test_follow_ends_when_the_recorded_process_is_not_the_run(tmp_path, how):
    """The real ``status --follow`` on a run folder whose supervisor record names another machine, or a pid now
    held by an unrelated live process (this test's own ``sleep``)."""
    run_dir = tmp_path / "runs" / "b2"
    run_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        ident = process_identity(other.pid)
        record = {"kind": "batch", "run_id": "b2", "supervisor_pid": other.pid, "supervisor_started": ident["pid_started"],
                  "boot_id": ident["boot_id"], "host": ident["host"], "log": str(run_dir / "batch.log")}
        if how == "another host":
            record.update(host="pod-before-restart", boot_id="not-this-boot")
        else:
            record.update(supervisor_started=ident["pid_started"] - 3600)  # the run's supervisor started an hour ago
        (run_dir / "detach.json").write_text(json.dumps(record))
        t0 = time.monotonic()
        done = run_docpilot("status", "b2", "--follow", env=docpilot_env(tmp_path), timeout=60)
        assert done.returncode == 1, done.stderr
        assert "gone without an exit status" in done.stderr and "resume with `docpilot batch --batch-id b2" in done.stderr
        assert time.monotonic() - t0 < 30
        assert other.poll() is None  # the unrelated process is left alone
    finally:
        other.kill()
        other.wait()


def test_status_of_a_running_batch_whose_driver_pid_was_reused_is_interrupted():
    from batch.lot import status
    from batch.runfiles import ProgressFile

    ident = process_identity(os.getpid())
    progress = ProgressFile(state="running", pid=ident["pid"], host=ident["host"], boot_id=ident["boot_id"],
                            pid_started=ident["pid_started"] - 3600)
    assert status._driver_alive(progress) is False
    assert status._driver_alive(progress.model_copy(update={"pid_started": ident["pid_started"]})) is True
