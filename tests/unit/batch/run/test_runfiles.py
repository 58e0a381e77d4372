"""manifest.json and progress.json as pydantic models (batch.runfiles): the same JSON on disk; the batch options object."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from batch import layout as mf
from batch.run.driver import BatchOptions, parse_args
from batch.run.progress import Progress
from batch.runfiles import EarlierRunFolder, Manifest, ProgressFile
from classify.errors import InputError
from classify.runs.records import write_json_atomic

OLD = {"manifest_version": 2, "batch_id": "b", "corpus": {"distinct_ids": 3, "path": "c.jsonl"},
       "config": {"classify": {"categories": ["tech"]}}, "shards": [{"index": 0, "n_docs": 3, "dups": {}}],
       "pilot_gate": {"override": False}, "attempts": [{"started_at": "t0", "pid": 1}],
       "a_field_of_a_later_docpilot": {"kept": [1, 2.5, None]}}


def test_a_manifest_read_and_written_back_is_byte_identical(tmp_path):
    run = tmp_path / "run"
    write_json_atomic(run / mf.MANIFEST, OLD)  # how the driver wrote it before it was a model
    before = (run / mf.MANIFEST).read_bytes()
    manifest = mf.read_manifest(run)
    assert manifest.version == 2 and manifest.categories == ["tech"] and manifest.shards[0].n_docs == 3
    assert manifest.adapter is None and "adapter" not in manifest.to_json()  # absent keys stay absent
    mf.write_manifest(run, manifest)
    assert (run / mf.MANIFEST).read_bytes() == before
    manifest.add_attempt(attempt := {"started_at": "t1"})
    attempt.update(finished_at="t2")  # updated in place after it was added, as the driver does
    mf.write_manifest(run, manifest)
    assert json.loads((run / mf.MANIFEST).read_text())["attempts"][-1] == {"started_at": "t1", "finished_at": "t2"}
    assert mf.read_manifest(tmp_path / "none") is None


def test_a_damaged_manifest_is_refused_not_half_read(tmp_path):
    (tmp_path / mf.MANIFEST).write_text(json.dumps({**OLD, "shards": "not a list"}))
    with pytest.raises(InputError, match="manifest.json is damaged .*shards"):
        mf.read_manifest(tmp_path)


def test_progress_json_keys_and_reading_back(tmp_path):
    assert ProgressFile.read(tmp_path / mf.PROGRESS).state == "not started"
    progress = Progress(tmp_path, "b", total=2)
    progress.start({})
    progress.shard_counted(2, 1, 1, 4)
    progress.finish()
    data = json.loads((tmp_path / mf.PROGRESS).read_text())
    assert sorted(data) == sorted(ProgressFile.model_fields)
    assert (data["state"], data["done"], data["accepted"], data["rejected"], data["eta_s"]) == ("done", 2, 1, 1, 0.0)
    back = ProgressFile.read(tmp_path / mf.PROGRESS)
    assert back.to_json() == data and progress.processed_tokens == 4
    (tmp_path / mf.PROGRESS).write_text("{torn")
    assert ProgressFile.read_or_none(tmp_path / mf.PROGRESS) is None
    assert Progress(tmp_path, "b", total=2).previous_actors == []  # a torn file is ignored, as before


def test_batch_options_are_the_command_line():
    opts = parse_args(["--corpus", "c.jsonl", "--batch-id", "b1", "--cpu-actors", "2", "--skip-pilot-gate"])
    assert isinstance(opts, BatchOptions)
    assert (opts.corpus, opts.batch_id, opts.cpu_actors, opts.skip_pilot_gate, opts.no_progress) == ("c.jsonl", "b1", 2, True, False)
    assert parse_args([]) == BatchOptions()  # the defaults of the flags and of the object agree
    with pytest.raises(ValidationError):
        BatchOptions(corpuss="typo")


def test_damaged_manifest_is_an_input_error_naming_the_file(tmp_path):
    path = tmp_path / "manifest.json"
    for text in ("{bad", "[1, 2]", '{"shards": 3}'):
        path.write_text(text)
        with pytest.raises(InputError, match=r"manifest.json is damaged"):
            Manifest.read(path)


@pytest.mark.parametrize("version", [None, 1])
def test_a_manifest_of_an_earlier_layout_is_refused_by_the_model(tmp_path, version):
    v1 = {"batch_id": "old", "corpus": {"distinct_ids": 3}, "shards": [{"index": 0, "start": 0, "n_docs": 3}]}
    if version is not None:
        v1["manifest_version"] = version
    with pytest.raises(EarlierRunFolder, match=r"batch old was made by an earlier docpilot \(run folder manifest_version 1,"):
        Manifest.of(v1)
    with pytest.raises(EarlierRunFolder):
        Manifest()
    write_json_atomic(tmp_path / "folder" / mf.MANIFEST, {k: v for k, v in v1.items() if k != "batch_id"})
    with pytest.raises(EarlierRunFolder, match=r"^batch folder was made by an earlier docpilot .* cannot resume it\. "):
        mf.read_manifest(tmp_path / "folder", "resume")  # no batch id in it: the folder's name
    assert issubclass(EarlierRunFolder, InputError)  # the CLI's exit status of a refused input
