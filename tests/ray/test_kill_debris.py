"""Debris after a kill, and a status that ran ahead (issue 28, item 5).

A real driver process (the batch driver over real Ray, the instant stand-in engine) is SIGKILLed in the middle
of the merge (both temporary result files written) or of the export (the staging copy beside the export holds
every file but ``SHA256SUMS``). Then:

* ``docpilot status`` says the batch is interrupted, or "classified, not exported", never ``done`` without a
  verified export (was: ``done``);
* the rerun removes the killed attempt's temporaries (was: left for good) and finishes exactly once with a
  verified export; ``status`` then says ``done`` and names the export.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/batch/run/test_kill_debris_match.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batch import layout as mf

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r'''
import logging, os, signal, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
hook = sys.argv[1]
if hook == "merge":
    import batch.run.merge as m
    real = m._Outputs.close
    def close(self):
        real(self)
        os.kill(os.getpid(), signal.SIGKILL)  # both temporary result files are on disk
    m._Outputs.close = close
elif hook == "export":
    import classify.runs.export as e
    def write(path, data):
        os.kill(os.getpid(), signal.SIGKILL)  # every file copied into the staging folder, SHA256SUMS not yet
    e.write_bytes_atomic = write
from batch.run.driver import parse_args, run_batch
from bench.instant_engine import remote_class
summary = run_batch(parse_args(sys.argv[2:]), _engine_actor=remote_class())
print("EXPORT", summary["export_dir"])
'''


def _debris(run_dir: Path, exports: Path) -> list[str]:
    found = [p.name for folder in (run_dir, run_dir / "shards") if folder.is_dir() for p in folder.iterdir()
             if p.name.startswith(".") and p.name.endswith(".tmp")]
    return found + [p.name for p in exports.iterdir() if p.name.startswith(".")] if exports.is_dir() else found


@pytest.mark.parametrize("phase", [pytest.param("merge", marks=pytest.mark.slow), "export"])  # merge: make test-slow (21 s)
def test_a_driver_killed_in_merge_or_export_leaves_debris_that_the_rerun_removes(tmp_path, phase):
    from batch.lot.status import batch_status
    from tests.support.corpora import write_config

    runs, exports = tmp_path / "runs", tmp_path / "exports"
    env = {**os.environ, "DOCPILOT_RUNS": str(runs), "DOCPILOT_EXPORTS": str(exports), "PYTHONPATH": str(ROOT)}
    corpus = tmp_path / "c.jsonl"
    n = 800
    corpus.write_text("".join(json.dumps({"id": f"d-{i:04d}", "text": f"Shares rose {i} points."}) + "\n" for i in range(n)))
    config = write_config(tmp_path / "b.json", shard_docs=40, shard_target_bytes=100_000)
    args = ["--config", str(config), "--corpus", str(corpus), "--batch-id", "kill", "--skip-pilot-gate", "--no-progress"]
    killed = subprocess.run([sys.executable, "-c", DRIVER, phase, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=400)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = runs / "kill"
    left = _debris(run_dir, exports)
    if phase == "merge":
        assert any(name.startswith(".results.jsonl.") for name in left) and ".results.parquet.tmp" in left, left
    else:
        assert any(name.startswith(".kill-") and name.endswith(".export-tmp") for name in left), left
    old_env = {k: os.environ.get(k) for k in ("DOCPILOT_RUNS",)}
    os.environ["DOCPILOT_RUNS"] = str(runs)
    try:
        st = batch_status("kill")
        assert st["state"] != "done" and st["export"] is None
        if phase == "export":  # merged and summarized, but no verified export
            assert st["classified"] and st["state"].startswith("classified, not exported"), st["state"]
        else:
            assert st["state"].startswith("interrupted"), st["state"]

        rerun = subprocess.run([sys.executable, "-c", DRIVER, "none", *args], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=400)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "temporary files an earlier, killed attempt left" in rerun.stderr
        assert _debris(run_dir, exports) == []
        rows = [json.loads(line) for line in (run_dir / mf.RESULTS).read_text().splitlines()]
        assert sorted(r["id"] for r in rows) == [f"d-{i:04d}" for i in range(n)]  # exactly once
        st = batch_status("kill")
        assert st["state"] == "done" and st["export"]["to"] == str(exports / "kill") and st["export"]["verified_at"]
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    from batch.run.export import check_export
    from classify.runs.export import verify_export

    assert verify_export(exports / "kill", check_export) == []
