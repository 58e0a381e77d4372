"""Run folders, atomic writes, export copies and their re-check."""

from __future__ import annotations

import pytest

from classify.errors import VerificationError
from classify.runs.export import SHA256SUMS, export_run, verify_export
from classify.runs.records import new_run_dir, write_json_atomic


def test_run_folders_are_never_reused(tmp_path):
    seen = {new_run_dir("pilot", tmp_path)[1] for _ in range(20)}
    assert len(seen) == 20 and all(p.is_dir() and "-pilot-" in p.name for p in seen)


def test_export_verifies_and_catches_tampering(tmp_path):
    _, run = new_run_dir("pilot", tmp_path / "runs")
    write_json_atomic(run / "summary.json", {"total": 12})
    (run / "results.jsonl").write_text('{"id": "a"}\n')
    out = export_run(run, tmp_path / "exports" / run.name)
    assert (out / SHA256SUMS).read_text().count("\n") == 2
    assert verify_export(out) == []
    (out / "results.jsonl").write_text('{"id": "b"}\n')
    (out / "extra.txt").write_text("x")
    problems = verify_export(out)
    assert any(p.startswith("results.jsonl: sha256") for p in problems)
    assert "extra.txt: not listed in SHA256SUMS" in problems
    (out / "summary.json").unlink()
    assert "summary.json: missing from the copy" in verify_export(out)
    with pytest.raises(VerificationError, match="already exists"):
        export_run(run, out)


def test_extra_check_runs_only_when_hashes_agree(tmp_path):
    _, run = new_run_dir("pilot", tmp_path)
    (run / "a").write_text("1")
    out = export_run(run, tmp_path / "copy")
    assert verify_export(out, lambda f: ["invariant broken"]) == ["invariant broken"]
