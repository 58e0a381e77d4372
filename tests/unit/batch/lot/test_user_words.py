"""What a user reads (issue 42 items 6 and 7): the batches there are, the lease advice and the status warning in the
user's command form, the pipeline warning once, verdict vs decision in one line, make help on serve's token."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess

import pytest

from batch import layout as mf
from batch.lease.clock import lease_check
from batch.lot.status import batch_status
from batch.lot.status import main as status_main
from batch.pilot.decision import VERDICT_VS_DECISION, decision_markdown
from batch.run.driver import warn_pipeline
from classify.config.sections import EngineConfig
from classify.errors import InputError
from classify.runs.gate import pipeline_settings
from classify.usercommand import VIA_MAKE_ENV
from tests.support import ROOT

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _batch(root, batch_id, total=2000, done=1000, override=False, created_at=None):
    run = root / batch_id
    shards = [{"index": i, "row": i * 1000, "n_rows": 1000, "n_docs": 1000} for i in range(total // 1000)]
    mf.write_manifest(
        run,
        {
            "manifest_version": mf.MANIFEST_VERSION,
            "corpus": {"distinct_ids": total},
            "shards": shards,
            "pilot_gate": {"override": override},
            "attempts": [],
            **({"created_at": created_at} if created_at else {}),
        },
    )
    for i in range(done // 1000):
        mf.shard_path(run, i).parent.mkdir(parents=True, exist_ok=True)
        mf.shard_path(run, i).write_bytes(b"x")
    (run / mf.PROGRESS).write_text(
        json.dumps(
            {
                "state": "running",
                "host": "elsewhere",
                "pid": 1,
                "docs_per_s": 1.0,
                "accepted": done,
                "rejected": 0,
            }
        )
    )


def test_status_without_an_id_lists_the_batches_there_are(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    assert status_main([]) == 0
    assert "no batches under" in capsys.readouterr().out
    _batch(tmp_path, "20261201T000000Z-batch-aaaa")
    _batch(tmp_path, "20261202T000000Z-batch-bbbb", done=2000)
    _batch(tmp_path, "20261203T000000Z-pilot-cccc")  # a pilot's run folder is not a batch to follow
    assert status_main([]) == 0
    out = capsys.readouterr().out
    assert (
        "20261201T000000Z-batch-aaaa  1000/2000 ids" in out
        and "20261202T000000Z-batch-bbbb  2000/2000 ids" in out
    )
    assert "pilot-cccc" not in out
    assert "`make status BATCH=20261202T000000Z-batch-bbbb`" in out
    # a chosen batch id sorts by name before the generated ones; listed by when it was created, it comes last
    _batch(tmp_path, "bk1", created_at="2026-12-04T05:06:00Z")
    assert status_main([]) == 0
    out = capsys.readouterr().out
    assert out.index("batch-bbbb") < out.index("bk1") and "`make status BATCH=bk1`" in out
    with pytest.raises(InputError, match=r"batches there: 20261201T000000Z-batch-aaaa, 20261202T000000Z-batch-bbbb, bk1\)"):
        status_main(["nope"])  # the same batches, pilots left out, in the same order
    (tmp_path / "20261203T000000Z-trainjob-dddd").mkdir()
    with pytest.raises(InputError, match=r"trainjob-dddd holds no manifest.json: not a batch \(a pilot"):
        status_main(["20261203T000000Z-trainjob-dddd"])
    for day in range(4, 8):
        _batch(tmp_path, f"2026120{day}T000000Z-batch-x", created_at=f"2026-12-0{day}T09:00:00Z")
    with pytest.raises(InputError, match=r"batches there: the 5 newest of 7: bk1, .*-batch-x; `make status` lists them all"):
        status_main(["nope"])  # a cut list says so


@pytest.mark.parametrize("via_make", [True, False])
def test_lease_advice_and_the_override_warning_in_the_users_form(tmp_path, monkeypatch, capsys, via_make):
    if via_make:
        monkeypatch.setenv(VIA_MAKE_ENV, "1")
    else:
        monkeypatch.delenv(VIA_MAKE_ENV, raising=False)
    _batch(tmp_path, "b1", override=True)
    msg = lease_check(batch_status("b1", tmp_path), NOW - dt.timedelta(minutes=5), now=NOW)["message"]
    short = lease_check(batch_status("b1", tmp_path), NOW + dt.timedelta(seconds=5), now=NOW)["message"]
    if via_make:
        assert "`make status BATCH=b1 EXPORT_PARTIAL=DEST`" in msg and "BATCH=b1 on a new lot" in msg
        assert "`make batch BATCH=b1`" in short and "--" not in msg + short.replace("-->", "")
    else:
        assert "`docpilot status b1 --export-partial DEST`" in msg and "--batch-id b1" in msg
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path))
    status_main(["b1"])
    assert (
        "started with SKIP_PILOT_GATE=1" if via_make else "started with --skip-pilot-gate"
    ) in capsys.readouterr().out


def test_the_pipeline_warning_is_said_once(capsys, caplog):
    cfg = type(
        "Cfg",
        (),
        {
            "engine": EngineConfig(),
            "batch": type("B", (), {"cpu_actors": 2, "actor_num_cpus": 1.0, "cpu_bind": "split"})(),
        },
    )()
    piloted = {**pipeline_settings(EngineConfig(), cfg.batch, None), "cpu_actors": 1}
    with caplog.at_level(logging.WARNING, logger="docpilot.batch"):
        assert warn_pipeline({"run_id": "p1", "pipeline": piloted}, cfg, None) == [
            "cpu_actors: piloted 1, now 2"
        ]
    said = [r.getMessage() for r in caplog.records] + capsys.readouterr().err.splitlines()
    assert len([line for line in said if "another pipeline than pilot p1" in line]) == 1, said


def test_verdict_and_decision_are_told_apart_in_one_line():
    md = decision_markdown(
        "p1",
        {"decision": "revisit-configuration", "stage_reached": "verify", "reasons": ["r"]},
        None,
        "base m",
    )
    assert VERDICT_VS_DECISION in md
    assert "pass|fail" in VERDICT_VS_DECISION and "revisit-configuration" in VERDICT_VS_DECISION


def test_make_help_and_the_readme_say_serve_needs_a_token():
    out = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    [serve] = [line for line in out.splitlines() if line.startswith("serve ")]
    assert "DOCPILOT_API_TOKEN" in serve, serve
    [row] = [
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `make serve`")
    ]
    assert "DOCPILOT_API_TOKEN" in row
