"""A batch stopped by Ctrl-C / SIGTERM says how to resume it, in the user's form, and so does its status."""

from __future__ import annotations

import io
import json

import pytest

from batch import layout as mf
from batch.lot.status import main as status_main
from batch.run import driver
from batch.run.progress import closing_on_error, progress_bar
from classify.errors import Interrupted
from classify.usercommand import VIA_MAKE_ENV


def _stopped(monkeypatch, tmp_path, argv):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setenv("DOCPILOT_BBC_DIR", str(tmp_path / "bbc"))

    def run_batch(options):
        raise Interrupted("stopped by SIGINT")

    monkeypatch.setattr(driver, "run_batch", run_batch)
    with pytest.raises(Interrupted) as err:
        driver.main(argv)
    return str(err.value)


def test_an_interrupted_batch_names_the_make_command_that_resumes_it(monkeypatch, tmp_path):
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--corpus", "/tmp/c200.csv", "--skip-pilot-gate"])
    assert msg.startswith("stopped by SIGINT")
    assert "\n  make batch BATCH=bk-int CORPUS=/tmp/c200.csv SKIP_PILOT_GATE=1" in msg


def test_the_configured_corpus_is_not_named_and_the_cli_form_outside_make(monkeypatch, tmp_path):
    monkeypatch.delenv(VIA_MAKE_ENV, raising=False)
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--corpus", str(tmp_path / "bbc" / "test.csv")])
    assert msg.splitlines()[-1].strip() == "docpilot batch --batch-id bk-int"


def test_status_of_an_interrupted_batch_shows_the_resume_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    run = tmp_path / "bk-int"
    mf.write_manifest(run, {
        "manifest_version": mf.MANIFEST_VERSION, "batch_id": "bk-int",
        "corpus": {"distinct_ids": 2000, "path": "/tmp/c200.csv"},
        "full_config": {"corpus": {"path": str(tmp_path / "configured.csv")}},
        "shards": [{"index": i, "row": i * 1000, "n_rows": 1000, "n_docs": 1000} for i in range(2)],
        "pilot_gate": {"override": True}, "attempts": [],
    })
    (run / mf.PROGRESS).write_text(json.dumps({"state": "failed", "last_error": "Interrupted: stopped by SIGINT"}))
    assert status_main(["bk-int"]) == 0
    out = capsys.readouterr().out
    assert "`make batch BATCH=bk-int CORPUS=/tmp/c200.csv SKIP_PILOT_GATE=1`" in out


def test_a_stopped_bar_ends_its_line_before_the_error():
    out = io.StringIO()
    bar = progress_bar(100, 0, "batch b1", file=out)
    bar.update(10)
    with pytest.raises(KeyboardInterrupt), closing_on_error(bar):
        raise KeyboardInterrupt
    assert out.getvalue().endswith("\n")
