"""``exit.json`` of a foreground or detached batch: the status of the attempt that ran, never replaced by a resume
refused before it began (a detached one's refusal is kept beside it, for ``status --follow``)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from batch import layout as mf
from batch.corpus.plan import plan_corpus
from batch.run.manifest import build_manifest
from classify.config.batch import load_batch_config
from classify.errors import InputError
from classify.model.model import resolve_model
from tests.support.corpora import ROOT, make_corpus
from tests.support.processes import docpilot_env, run_docpilot


@pytest.fixture
def finished(tmp_path, bbc_dir, monkeypatch):
    """A run folder as a complete batch left it: its manifest (one attempt, by another process) and ``exit.json``."""
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    spec = make_corpus(tmp_path / "c", bbc_dir, 4)
    cfg = load_batch_config(str(ROOT / "config" / "docpilot.json"))
    plan = plan_corpus(cfg.corpus.model_copy(update={"path": str(spec["path"])}), cfg.batch.shard_docs,
                       cfg.batch.shard_target_bytes, spec["path"], cfg.classify.max_doc_bytes)
    manifest = build_manifest("b1", cfg, plan, resolve_model(cfg.model), adapter=None, gate={})
    manifest.add_attempt({"started_at": "2026-12-07T00:00:00Z", "pid": os.getpid() + 1, "host": socket.gethostname()})
    run_dir = tmp_path / "runs" / "b1"
    run_dir.mkdir(parents=True)
    mf.write_manifest(run_dir, manifest)
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-12-07T00:05:00Z"}))
    return run_dir, spec


def test_a_refused_resume_leaves_the_finished_batchs_exit_record(finished, tmp_path):
    from batch.run.driver import main

    run_dir, spec = finished
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["classify"]["max_doc_tokens"] = 128
    (tmp_path / "changed.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"batch b1 cannot resume: config changed: classify.max_doc_tokens: 256 -> 128"):
        main(["--config", str(tmp_path / "changed.json"), "--corpus", str(spec["path"]), "--batch-id", "b1",
              "--skip-pilot-gate", "--no-progress"])
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 0  # was 3: `status --follow` said failed
    assert len(json.loads((run_dir / "manifest.json").read_text())["attempts"]) == 1


def test_the_attempt_this_process_recorded_gets_its_exit_status(finished):
    from batch.run.driver import _record_foreground_exit

    run_dir, _ = finished
    _record_foreground_exit("b1", 3)  # the last attempt is another process's: not this one's to record
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["attempts"].append({"started_at": "2026-12-07T01:00:00Z", "pid": os.getpid(), "host": socket.gethostname()})
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    _record_foreground_exit("b1", 130)
    record = json.loads((run_dir / "exit.json").read_text())
    assert record["exit_code"] == 130 and record["detached"] is False


def test_a_refused_detached_resume_keeps_the_batchs_exit_and_follow_reports_the_refusal(finished, tmp_path):
    run_dir, spec = finished
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["classify"]["max_doc_tokens"] = 128
    (tmp_path / "changed.json").write_text(json.dumps(data))
    env = docpilot_env(tmp_path)
    started = run_docpilot("batch", "--config", str(tmp_path / "changed.json"), "--corpus", str(spec["path"]),
                           "--batch-id", "b1", "--skip-pilot-gate", "--detach", env=env)
    assert started.returncode == 0, started.stderr
    followed = run_docpilot("status", "b1", "--follow", env=env)
    assert followed.returncode == 3, followed.stderr  # this start's own status: it was refused
    assert "config changed: classify.max_doc_tokens: 256 -> 128" in followed.stderr  # the log's tail
    assert "exit 3 before an attempt began" in followed.stderr and "last ran ended with exit 0" in followed.stderr
    record = json.loads((run_dir / "exit.json").read_text())
    assert record["exit_code"] == 0 and record["ended_at"] == "2026-12-07T00:05:00Z"  # was 3: the batch read as failed
    assert record["last_start"]["exit_code"] == 3 and record["last_start"]["attempt"] is False
    assert len(json.loads((run_dir / "manifest.json").read_text())["attempts"]) == 1
    shown = run_docpilot("status", "b1", env=env)
    assert "exit      0 at 2026-12-07T00:05:00Z" in shown.stdout and "exit 3 before an attempt began" in shown.stdout
