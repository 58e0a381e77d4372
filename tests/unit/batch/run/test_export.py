"""An export folder that cannot be written is refused before the batch runs (exit 6), not after it, as a traceback."""

from __future__ import annotations

import pytest

from batch.run import attempt
from batch.run.export import check_export_root, export_batch
from classify.errors import EnvironmentCheckError
from tests.support.corpora import make_corpus


def test_an_export_dir_under_a_file_is_refused_before_any_work(tmp_path, bbc_dir, monkeypatch):
    from batch.run.driver import main

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    spec = make_corpus(tmp_path / "c", bbc_dir, 4)
    (tmp_path / "a-file").write_text("not a folder")

    def no_ray():
        raise AssertionError("the batch started Ray: the export folder was not checked first")

    monkeypatch.setattr(attempt, "_init_ray", no_ray)
    with pytest.raises(EnvironmentCheckError, match=r"the export folder .*a-file/exports cannot be written: Not a directory"):
        main(["--corpus", str(spec["path"]), "--batch-id", "b1", "--skip-pilot-gate", "--no-progress",
              "--export-dir", str(tmp_path / "a-file" / "exports")])
    assert EnvironmentCheckError.exit_code == 6


def test_a_writable_root_is_made_and_left_clean(tmp_path):
    check_export_root(tmp_path / "new" / "root" / "b1")
    assert (tmp_path / "new" / "root").is_dir() and list((tmp_path / "new" / "root").iterdir()) == []
    check_export_root("s3://bucket/exports/b1")  # a URL: checked by the copy itself


def test_a_copy_that_fails_midway_names_the_destination_and_keeps_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text('{"id": "a"}\n')
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(EnvironmentCheckError, match=r"cannot write the export copy .*a-file/b1: .*the run folder .*run is complete"):
        export_batch(run, tmp_path / "a-file" / "b1")


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_something_else_where_the_copy_goes_is_refused_before_any_work(tmp_path, kind):
    """A folder without SHA256SUMS counted as an earlier export: the batch ran, then failed its re-check (exit 8) on
    every rerun."""
    dest = tmp_path / "exports" / "b1"
    dest.parent.mkdir()
    dest.mkdir() if kind == "folder" else dest.write_text("x")
    with pytest.raises(EnvironmentCheckError, match=r"exports/b1 exists and is not an export copy \(no SHA256SUMS\)"):
        check_export_root(dest)
    if kind == "folder":
        (dest / "SHA256SUMS").write_text("")  # an earlier complete copy: re-checked at the end, not refused here
        check_export_root(dest)
