"""Debris after a kill, and a status that ran ahead (issue 28, item 5).

A real driver process (the batch driver over real Ray, the instant stand-in engine) is SIGKILLed in the middle
of the merge (both temporary result files written) or of the export (the staging copy beside the export holds
every file but ``SHA256SUMS``). Then:

* ``docpilot status`` says the batch is interrupted, or "classified, not exported", never ``done`` without a
  verified export (was: ``done``);
* the rerun removes the killed attempt's temporaries (was: left for good) and finishes exactly once with a
  verified export; ``status`` then says ``done`` and names the export.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_kill_debris.py``.
"""

from __future__ import annotations


def test_only_this_batchs_temporaries_are_matched(tmp_path):
    from batch.run.debris import remove_stale_temporaries

    run_dir, exports = tmp_path / "runs" / "kill", tmp_path / "exports"
    (run_dir / "shards").mkdir(parents=True)
    exports.mkdir()
    ours = [run_dir / ".results.jsonl.ab12cd.tmp", run_dir / ".results.parquet.tmp", run_dir / ".manifest.json.x1y2.tmp",
            run_dir / "shards" / ".00003.jsonl.q9w8.tmp"]
    for p in ours:
        p.write_text("partial")
    staging = exports / ".kill-abcd1234.export-tmp"
    staging.mkdir()
    (staging / "results.jsonl").write_text("partial")
    kept = [run_dir / ".driver.lock", run_dir / "manifest.json", exports / ".kill-partial-20261202T000000Z-abcd1234.export-tmp",
            exports / ".other-abcd1234.export-tmp", exports / ".kill-abcd1234", exports / "kill-abcd1234.export-tmp"]
    for p in kept:
        p.mkdir() if "export" in p.name or p.parent == exports else p.write_text("keep")
    removed = remove_stale_temporaries(run_dir, exports / "kill")
    assert sorted(removed) == sorted([*ours, staging])
    assert all(p.exists() for p in kept) and not any(p.exists() for p in [*ours, staging])
