"""The lease's stop command, run for real: whatever it prints and however it fails, the decision lands in
``lease-stop.json``; a command that could only fail at the end of a run is refused when the run starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from batch.lease.stop import check_stop_command, stop_the_meter
from batch.plan.lots import LeaseSection
from classify.errors import ConfigError
from tests.support.processes import docpilot_env, run_docpilot

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize(("argv", "decision", "code", "tail"), [
    (["sh", "-c", r"printf 'pod stopped \377\376 caf\351\n'"], "ran", 0, r"pod stopped \xff\xfe caf\xe9"),
    (["sh", "-c", r"printf 'quota \377' >&2; exit 3"], "failed", 3, r"quota \xff"),
    (["sh", "-c", r"printf 'half \377'; sleep 5"], "failed", None, r"TimeoutExpired"),
    (["sh", "-c", "echo x", "nul\x00byte"], "failed", None, "ValueError"),
    (["/nonexistent/stopper"], "failed", None, "FileNotFoundError"),
])
def test_every_stop_command_outcome_is_recorded(tmp_path, argv, decision, code, tail):
    lease = LeaseSection(stop_command=tuple(argv), stop_timeout_s=1.0)
    got = stop_the_meter(tmp_path, lease, True, "all copies verified")
    assert got["decision"] == decision and got["exit_code"] == code
    assert tail in got["output_tail"]
    recorded = json.loads((tmp_path / "lease-stop.json").read_text())["decisions"]
    assert recorded == [json.loads(json.dumps(got))]


@pytest.mark.parametrize(("argv", "says"), [
    (["runpodctl-missing-here", "stop", "pod", "abc"], "program 'runpodctl-missing-here' is not found on PATH"),
    (["/opt/none/stopper"], "program '/opt/none/stopper' is not an executable file"),
    (["runpodctl stop pod abc"], "must be an argv list (it runs without a shell), got one string "
                                 "['runpodctl stop pod abc']; write it as ['runpodctl', 'stop', 'pod', 'abc']"),
])
def test_a_stop_command_that_cannot_run_is_refused_up_front(argv, says):
    with pytest.raises(ConfigError, match="^lease.stop_command") as err:
        check_stop_command(LeaseSection(stop_command=tuple(argv)))
    assert says in str(err.value)
    check_stop_command(LeaseSection(stop_command=(sys.executable, "-c", "pass")))  # a program that exists passes
    check_stop_command(LeaseSection())


def test_detach_with_a_missing_stop_program_is_refused_before_the_batch_starts(tmp_path):
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": ["runpodctl-missing-here", "stop", "pod", "abc"]}
    (tmp_path / "lots.json").write_text(json.dumps(lots))
    done = run_docpilot("batch", "--corpus", str(tmp_path / "c.jsonl"), "--skip-pilot-gate", "--detach",
                        "--stop-when-done", "--wrap-up-to", str(tmp_path / "offpod"), "--lots-config",
                        str(tmp_path / "lots.json"), env=docpilot_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "program 'runpodctl-missing-here' is not found on PATH" in done.stderr
    assert "detached" not in done.stdout and not (tmp_path / "runs").exists()


def test_a_stop_command_that_exits_0_leaving_a_child_on_its_output_ran(tmp_path):
    """The provider CLI exits 0 but forks a helper that keeps stdout open: the decision is the CLI's own exit
    status and the output read so far, at once, never "failed" after the timeout."""
    import os
    import signal
    import time

    lease = LeaseSection(stop_command=("sh", "-c", "sleep 20 & echo helper $!; echo pod stopped; exit 0"),
                         stop_timeout_s=5.0)
    t0 = time.monotonic()
    got = stop_the_meter(tmp_path, lease, True, "all copies verified")
    took = time.monotonic() - t0
    helper = int(got["output_tail"].split("helper ", 1)[1].split()[0])
    os.kill(helper, signal.SIGKILL)  # the test's own child's child, by its pid
    assert got["decision"] == "ran" and got["exit_code"] == 0, got
    assert "pod stopped" in got["output_tail"] and "still holds its output open" in got["output_tail"]
    assert took < 4.0, took  # not held until the timeout by the helper's open pipe
    assert json.loads((tmp_path / "lease-stop.json").read_text())["decisions"][-1]["decision"] == "ran"


@pytest.mark.parametrize(("argv", "says"), [
    (["runpodctl-missing-here", "stop", "pod", "abc"], "program 'runpodctl-missing-here' is not found on PATH"),
    (["runpodctl stop pod abc"], "must be an argv list"),
])
def test_wrap_up_refuses_a_stop_command_that_cannot_run_before_the_first_copy(tmp_path, argv, says):
    lots = json.loads((ROOT / "config" / "lots.json").read_text())
    lots["lease"] = {"stop_command": argv}
    (tmp_path / "lots.json").write_text(json.dumps(lots))
    pilot = tmp_path / "runs" / "20261201T000000Z-pilot-abcd1234"  # a run the wrap-up would copy first
    pilot.mkdir(parents=True)
    (pilot / "decision.json").write_text("{}")
    env = docpilot_env(tmp_path)
    env["DOCPILOT_REGISTRY"] = str(tmp_path / "registry")
    done = run_docpilot("wrap-up", "--to", str(tmp_path / "offpod"), "--lots-config", str(tmp_path / "lots.json"),
                        env=env)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "--no-stop" in done.stderr
    assert not (tmp_path / "offpod").exists()  # nothing copied, no manifest written
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [pilot.name]  # no wrap-up record either
    copied = run_docpilot("wrap-up", "--to", str(tmp_path / "offpod"), "--lots-config", str(tmp_path / "lots.json"),
                          "--no-stop", env=env)  # --no-stop copies without the stop command: not refused for it
    assert "lease.stop_command" not in copied.stderr and "lease stop: skipped" in copied.stdout


def test_stop_command_runs_without_a_shell_and_a_failing_one_is_an_error(tmp_path):
    lease = LeaseSection(stop_command=["echo", "$HOME; touch", str(tmp_path / "injected")])
    decision = stop_the_meter(tmp_path, lease, True, "verified")
    assert decision["decision"] == "ran" and "$HOME; touch" in decision["output_tail"]  # no shell expanded it
    assert not (tmp_path / "injected").exists()
    failing = stop_the_meter(tmp_path, LeaseSection(stop_command=[sys.executable, "-c", "raise SystemExit(3)"]),
                             True, "verified")
    assert failing["decision"] == "failed" and failing["exit_code"] == 3
    assert stop_the_meter(tmp_path, LeaseSection(), True, "verified")["decision"] == "skipped"
    decisions = json.loads((tmp_path / "lease-stop.json").read_text())["decisions"]
    assert [d["decision"] for d in decisions] == ["ran", "failed", "skipped"]
    with pytest.raises(ValueError, match="stop_command"):
        LeaseSection(stop_command=[])
