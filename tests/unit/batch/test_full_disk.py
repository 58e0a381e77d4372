"""A full disk in a batch (issue 28, item 4): exit 6 naming the folder and its free space, the failure recorded
where space allows (said plainly where not), and a rerun after freeing space finishes exactly once.

Unit cases raise "no space left" the ways Python and pyarrow word it. The real cases run the real batch driver over
real Ray (the instant stand-in engine: the failure lives in the driver's writes) with the run folder, or the export
folder, on a small tmpfs that is filled to the last page at the phase under test: writing shards, merging, exporting.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from test_batch_helpers import write_config

from batch import manifest as mf
from batch._disk import disk_full, full_disk_error, full_disk_is_environment
from classify.errors import EnvironmentCheckError, VerificationError

FULL_ERRORS = [
    OSError(errno.ENOSPC, "No space left on device", "/x/shards/00001.jsonl"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow's words
]


@pytest.mark.parametrize("err", FULL_ERRORS, ids=["enospc", "edquot", "pyarrow"])
def test_full_disk_errors_anywhere_in_the_chain_become_exit_6_naming_the_folder(tmp_path, err):
    def chained():
        try:
            raise err
        except OSError as inner:
            raise VerificationError("merge failed") from inner

    for raiser in (lambda: (_ for _ in ()).throw(err), chained):
        with pytest.raises(EnvironmentCheckError) as caught:
            with full_disk_is_environment([tmp_path], "batch b1"):
                raiser()
        assert caught.value.exit_code == 6
        message = str(caught.value)
        assert f"batch b1: no space left in {tmp_path}" in message and "MiB free" in message
        assert "the attempt's failure is recorded" in message and "rerun the same command" in message


def test_other_errors_pass_through_and_unrecorded_failures_are_said(tmp_path):
    with pytest.raises(OSError, match="Permission denied"):
        with full_disk_is_environment([tmp_path], "batch b1"):
            raise OSError(errno.EACCES, "Permission denied")
    assert disk_full(ValueError("x")) is None
    err = full_disk_error(FULL_ERRORS[0], [tmp_path], "batch b1", unrecorded="writing /r: No space left on device")
    assert "could NOT be recorded (writing /r: No space left on device)" in str(err)
    assert "`docpilot status` will show it as interrupted" in str(err)


# --- a real full file system --------------------------------------------------------------------------------------

@pytest.fixture
def tmpfs(tmp_path):
    """Mount a 32 MiB tmpfs (root only); yields a mounter; everything mounted is unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(path: Path, size_mib: int = 32) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode()[:200]}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


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


@pytest.mark.ray
@pytest.mark.parametrize(("phase", "where", "leave", "recorded"), PHASES, ids=[p[0] for p in PHASES])
def test_a_full_disk_in_a_real_batch_is_exit_6_and_a_rerun_finishes_exactly_once(
        instant_ray, tmp_path, monkeypatch, tmpfs, phase, where, leave, recorded):
    import batch._attempt as attempt_mod
    from batch.driver import parse_args, run_batch
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
    from batch.merge import check_export
    from classify.export import verify_export

    assert verify_export(Path(summary["export_dir"]), check_export) == []
