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
from tests.support import ROOT


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


def test_a_config_file_of_its_own_is_named_in_the_hint(monkeypatch, tmp_path):
    """Resuming without the config the batch ran with is refused ("config changed"): the hint must repeat it."""
    cfg = tmp_path / "mine.json"
    cfg.write_text((ROOT / "config" / "docpilot.json").read_text())
    monkeypatch.delenv(VIA_MAKE_ENV, raising=False)
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--config", str(cfg), "--corpus", "/tmp/c.csv"])
    assert msg.splitlines()[-1].strip() == f"docpilot batch --batch-id bk-int --config {cfg} --corpus /tmp/c.csv"
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--config", str(cfg), "--corpus", "/tmp/c.csv"])
    assert msg.splitlines()[-1].strip() == f"make batch BATCH=bk-int BATCH_CONFIG={cfg} CORPUS=/tmp/c.csv"
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--config", "config/docpilot.json"])
    assert msg.splitlines()[-1].strip() == "make batch BATCH=bk-int"  # the default is not named
    spaced = tmp_path / "sp ace.json"
    spaced.write_text(cfg.read_text())
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--config", str(spaced), "--corpus", "/tmp/a b.csv"])
    assert msg.splitlines()[-1].strip() == f"make batch BATCH=bk-int BATCH_CONFIG='{spaced}' CORPUS='/tmp/a b.csv'"
    monkeypatch.delenv(VIA_MAKE_ENV)
    msg = _stopped(monkeypatch, tmp_path, ["--batch-id", "bk-int", "--config", str(spaced), "--corpus", "/tmp/a b.csv"])
    assert msg.splitlines()[-1].strip() == f"docpilot batch --batch-id bk-int --config '{spaced}' --corpus '/tmp/a b.csv'"


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
    manifest = json.loads((run / mf.MANIFEST).read_text())
    manifest["attempts"] = [{"started_at": "2026-12-07T00:00:00Z", "config": "/srv/lot/mine.json"}]
    (run / mf.MANIFEST).write_text(json.dumps(manifest))
    assert status_main(["bk-int"]) == 0  # the config file the last attempt ran with (``attempts[].config``)
    assert "`make batch BATCH=bk-int BATCH_CONFIG=/srv/lot/mine.json CORPUS=/tmp/c200.csv SKIP_PILOT_GATE=1`" in \
        capsys.readouterr().out


def test_a_stopped_bar_ends_its_line_before_the_error():
    out = io.StringIO()
    bar = progress_bar(100, 0, "batch b1", file=out)
    bar.update(10)
    with pytest.raises(KeyboardInterrupt), closing_on_error(bar):
        raise KeyboardInterrupt
    assert out.getvalue().endswith("\n")
