"""A full disk in a batch (issue 28, item 4): exit 6 naming the folder and its free space, the failure recorded
where space allows (said plainly where not), and a rerun after freeing space finishes exactly once.

Unit cases raise "no space left" the ways Python and pyarrow word it. The real cases run the real batch driver over
real Ray (the instant stand-in engine: the failure lives in the driver's writes) with the run folder, or the export
folder, on a small tmpfs that is filled to the last page at the phase under test: writing shards, merging, exporting.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/classify/runs/test_full_disk.py``.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from batch import layout as mf
from classify.errors import EnvironmentCheckError
from tests.support.corpora import write_config
from tests.support.disk import tmpfs as tmpfs  # noqa: F401  (fixture)

# --- a real full file system --------------------------------------------------------------------------------------


def _fill(folder: Path, leave: int = 0) -> Path:
    """Fill ``folder``'s file system until ``leave`` bytes are free; returns the filler (delete it to free space)."""
    filler = folder / "filler.bin"
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with filler.open("wb") as fh:
        try:
            fh.write(b"\0" * max(free - leave, 0))
            fh.flush()
            os.fsync(fh.fileno())
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def _corpus(path: Path, n: int = 1500) -> Path:
    path.write_text("".join(json.dumps({"id": f"d-{i:05d}", "text": f"Shares rose {i} points today."}) + "\n"
                            for i in range(n)))
    return path


PHASES = [  # (phase, what is filled and when, bytes left free, whether the failure can be recorded)
    ("shards", "runs", 0, False),
    ("merge", "runs", 96 << 10, True),
    ("export", "exports", 0, True),
]


@pytest.mark.parametrize(("phase", "where", "leave", "recorded"), PHASES, ids=[p[0] for p in PHASES])
def test_a_full_disk_in_a_real_batch_is_exit_6_and_a_rerun_finishes_exactly_once(
        local_ray, tmp_path, monkeypatch, tmpfs, phase, where, leave, recorded):
    import batch.run.attempt as attempt_mod
    from batch.run.driver import parse_args, run_batch
    from bench.instant_engine import remote_class

    runs = tmpfs(tmp_path / "runs")
    exports = tmpfs(tmp_path / "exports") if where == "exports" else tmp_path / "exports"
    full = runs if where == "runs" else exports
    monkeypatch.setenv("DOCPILOT_RUNS", str(runs))
    monkeypatch.setenv("DOCPILOT_EXPORTS", str(exports))
    corpus = _corpus(tmp_path / "c.jsonl")
    config = write_config(tmp_path / "b.json", shard_docs=50, shard_target_bytes=100_000)
    args = parse_args(["--config", str(config), "--corpus", str(corpus), "--batch-id", "full", "--skip-pilot-gate",
                       "--no-progress"])
    fillers: list[Path] = []
    hook = {"shards": ("BatchRun", "run_shards"), "merge": ("", "merge_results"), "export": ("", "export_batch")}[phase]
    owner = attempt_mod.BatchRun if hook[0] else attempt_mod
    real = getattr(owner, hook[1])

    def filling(*a, **k):  # the disk becomes full just as this phase starts writing
        fillers.append(_fill(full, leave))
        return real(*a, **k)

    monkeypatch.setattr(owner, hook[1], filling)
    with pytest.raises(EnvironmentCheckError) as caught:
        run_batch(args, _engine_actor=remote_class())
    message = str(caught.value)
    assert caught.value.exit_code == 6
    assert f"no space left in {full}" in message and "MiB free" in message, message
    run_dir = runs / "full"
    manifest = json.loads((run_dir / mf.MANIFEST).read_text())
    if recorded:
        assert "the attempt's failure is recorded" in message
        assert "No space left" in (manifest["attempts"][-1].get("error") or ""), manifest["attempts"][-1]
    else:
        assert "could NOT be recorded" in message
    assert not [p for p in run_dir.rglob(".*.tmp")], "a temporary file was left"  # atomic writes cleaned up

    monkeypatch.setattr(owner, hook[1], real)
    for f in fillers:
        f.unlink()  # space freed
    summary = run_batch(args, _engine_actor=remote_class())
    rows = [json.loads(line) for line in (run_dir / mf.RESULTS).read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"d-{i:05d}" for i in range(1500)]  # every id exactly once
    assert summary["total"] == 1500 and summary["accepted"] + summary["rejected"] == 1500
    from batch.run.export import check_export
    from classify.runs.export import verify_export

    assert verify_export(Path(summary["export_dir"]), check_export) == []
