"""``docpilot submit`` with a stand-in job client: what it submits, how it follows the job, its exit codes.

The real Ray head is in ``tests/slow/test_batch_slow.py::test_docpilot_submit_runs_the_batch_on_a_ray_head``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch.run import submit
from docpilot.cli import main as docpilot
from tests.support.corpora import ROOT


class FakeJobs:
    """Stands in for ``JobSubmissionClient``: records the request and the staged folder, plays a log."""

    def __init__(self, final: str, log: tuple[str, ...] = ("line 1\n", "line 2\n"), stream_error: bool = False):
        self.final, self.log, self.stream_error = final, log, stream_error
        self.request: dict = {}
        self.staged: set[str] = set()
        self.status_calls = 0

    def submit_job(self, **request):
        self.request = request
        root = Path(request["runtime_env"]["working_dir"])
        self.staged = {str(p.relative_to(root)) for p in root.rglob("*")}
        return request["submission_id"]

    async def tail_job_logs(self, job_id):
        for chunk in self.log:
            yield chunk
        if self.stream_error:
            raise RuntimeError("connection closed")

    def get_job_status(self, job_id):
        from ray.job_submission import JobStatus

        self.status_calls += 1
        return JobStatus.RUNNING if self.status_calls < 2 else JobStatus(self.final)

    def get_job_info(self, job_id):
        return SimpleNamespace(message="Job entrypoint command failed with exit code 4" if self.final == "FAILED" else None)


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n')
    return path


def _run(monkeypatch, jobs, *args: str) -> int:
    monkeypatch.setattr(submit, "connect", lambda address: jobs)
    monkeypatch.setattr(submit, "POLL_S", 0.01)
    return docpilot(["submit", "--config", str(ROOT / "config" / "docpilot.json"), *args])


def test_submits_the_batch_entrypoint_with_a_small_working_dir(monkeypatch, capsys, corpus, tmp_path):
    jobs = FakeJobs("SUCCEEDED")
    rc = _run(monkeypatch, jobs, "--corpus", str(corpus), "--batch-id", "b1", "--adapter", "news@2",
              "--skip-pilot-gate", "--export-dir", str(tmp_path / "out"), "--python", "/opt/py")
    out = capsys.readouterr().out
    assert rc == 0
    assert jobs.request["submission_id"] == "docpilot-b1"
    assert shlex.split(jobs.request["entrypoint"]) == [
        "/opt/py", "-m", "docpilot", "batch", "--config", "config/docpilot.json", "--corpus", str(corpus),
        "--batch-id", "b1", "--no-progress", "--adapter", "news@2", "--export-dir", str(tmp_path / "out"),
        "--skip-pilot-gate"]
    env = jobs.request["runtime_env"]["env_vars"]
    assert set(env) == {"DOCPILOT_HOME", "DOCPILOT_MODEL_CACHE", "DOCPILOT_REGISTRY", "DOCPILOT_RUNS", "DOCPILOT_EXPORTS"}
    assert all(Path(v).is_absolute() for v in env.values())
    # the code the job runs (front door included) and the config; no caches, weights, runs or .git
    assert {"docpilot/__main__.py", "classify/errors.py", "batch/run/driver.py", "adapters/registry/registry.py",
            "config/docpilot.json"} <= jobs.staged
    assert not {p for p in jobs.staged if "__pycache__" in p or p.startswith(("serve", "runs", ".git", "tests"))}
    assert not Path(jobs.request["runtime_env"]["working_dir"]).exists()  # staging removed once uploaded
    assert "line 1\nline 2\n" in out and "Job 'docpilot-b1' succeeded" in out
    assert "batch b1: job docpilot-b1 exited 0" in out and "results: " in out


@pytest.mark.parametrize(("final", "said"), [("FAILED", "failed"), ("STOPPED", "was stopped")])
def test_a_failed_or_stopped_job_exits_1_with_rays_message(monkeypatch, capsys, corpus, final, said):
    rc = _run(monkeypatch, FakeJobs(final), "--corpus", str(corpus), "--batch-id", "b2")
    out = capsys.readouterr().out
    assert rc == 1
    assert f"Job 'docpilot-b2' {said}" in out and "exited 1" in out
    assert ("Status message: Job entrypoint command failed with exit code 4" in out) == (final == "FAILED")


def test_an_early_end_of_the_log_stream_falls_back_to_polling(monkeypatch, capsys, corpus):
    jobs = FakeJobs("SUCCEEDED", stream_error=True)
    assert _run(monkeypatch, jobs, "--corpus", str(corpus), "--batch-id", "b3") == 0
    assert "polling the job status" in capsys.readouterr().out and jobs.status_calls == 2


def test_no_wait_returns_once_submitted(monkeypatch, capsys, corpus):
    jobs = FakeJobs("FAILED")
    assert _run(monkeypatch, jobs, "--corpus", str(corpus), "--batch-id", "b4", "--no-wait") == 0
    out = capsys.readouterr().out
    assert jobs.status_calls == 0 and "line 1" not in out and "ray job logs -f docpilot-b4" in out


def test_unreachable_job_server_exits_1(monkeypatch, capsys, corpus):
    def refuse(address):
        raise ConnectionError(f"Failed to connect to Ray at address: {address}.")

    monkeypatch.setattr(submit, "connect", refuse)
    rc = docpilot(["submit", "--config", str(ROOT / "config" / "docpilot.json"), "--corpus", str(corpus),
                   "--batch-id", "b5", "--address", "http://127.0.0.1:9"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "error [ray]: job server http://127.0.0.1:9: Failed to connect" in err
    assert "(nothing answers there: the job server is the head's Ray dashboard, port 8265" in err and "RAY_ADDRESS)" in err


def test_a_real_unreachable_address_exits_1_with_the_hint(capsys, corpus):
    # Ray's own client against a closed port on 127.0.0.1 (nothing listens on the discard port)
    rc = docpilot(["submit", "--config", str(ROOT / "config" / "docpilot.json"), "--corpus", str(corpus),
                   "--batch-id", "b6", "--address", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 1 and "Failed to connect to Ray at address: http://127.0.0.1:9" in err and "nothing answers there" in err, err


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--address", "ray://head:10001"], 2, "must be the job server's http://host:port"),
    (["--corpus", "/no/such/corpus.jsonl"], 3, "does not exist (pass --corpus PATH)"),
    (["--batch-id", "../escape"], 3, "`--batch-id` must match"),
])
def test_refusals_before_anything_is_submitted(monkeypatch, capsys, corpus, args, code, message):
    jobs = FakeJobs("SUCCEEDED")
    assert _run(monkeypatch, jobs, "--corpus", str(corpus), "--batch-id", "b6", *args) == code
    assert message in capsys.readouterr().err and jobs.request == {}


def test_the_config_file_travels_under_its_own_name(monkeypatch, corpus, tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text((ROOT / "config" / "docpilot.json").read_text())
    jobs = FakeJobs("SUCCEEDED")
    monkeypatch.setattr(submit, "connect", lambda address: jobs)
    assert docpilot(["submit", "--config", str(mine), "--corpus", str(corpus), "--batch-id", "b7"]) == 0
    assert "config/mine.json" in jobs.staged and "config/docpilot.json" not in jobs.staged
    assert "--config config/mine.json " in jobs.request["entrypoint"]
