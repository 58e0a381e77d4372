"""Fast batch bookkeeping tests: config, corpus readers, manifest, resume refusal, merge checks, status.

No engine and no Ray here; the real paths are in test_batch_ray.py and test_batch_slow.py.
"""

from __future__ import annotations

import json
import re

import pytest

from batch import layout as mf
from batch.lot.status import batch_status
from batch.lot.status import main as status_main
from batch.run.export import check_export
from batch.run.merge import merge_results
from batch.runfiles import Manifest
from classify.config.batch import BatchConfig, CorpusConfig, load_batch_config, results_config_sha256
from classify.config.sections import PilotConfig, load_config
from classify.errors import ConfigError, InputError, VerificationError
from classify.records import Result
from tests.support.corpora import PLANTED, ROOT, make_corpus, planned_shards, read_corpus


def test_batch_config_model_and_classify_equal_pilot_config():
    batch = load_batch_config(ROOT / "config" / "docpilot.json")
    pilot = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    assert batch.model == pilot.model
    assert batch.classify == pilot.classify  # else the pilot gate key never matches a pilot


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"batch": {"shard_docs": 0}}, r"`batch.shard_docs` must be greater than or equal to 1, got 0"),
        ({"batch": {"cpu_actor": 2}}, r"`batch.cpu_actor` is not a known field"),
        ({"corpus": {"format": "xml"}}, r"`corpus.format` must be 'auto', 'jsonl', 'csv', 'parquet' or 'dir', got \"xml\""),
    ],
)
def test_batch_config_errors_name_field_and_value(tmp_path, patch, message):
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    for section, fields in patch.items():
        data[section].update(fields)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_batch_config(path)


def test_jsonl_corpus_rejects_planted_documents_and_collapses_duplicates(tmp_path, bbc_dir):
    spec = make_corpus(tmp_path, bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    assert corpus.format == "jsonl"
    assert [d.id for d in corpus.docs] == spec["ids"]
    assert corpus.input_rows == spec["input_rows"] and corpus.duplicate_rows == 1
    by_id = {d.id: d for d in corpus.docs}
    for doc_id, reason in PLANTED.items():
        assert by_id[doc_id].reject_reason.startswith(reason), (doc_id, by_id[doc_id].reject_reason)
    assert by_id[spec["dup_id"]].reject_reason.startswith("duplicate id: given 2 times")
    assert by_id["mojibake-ok"].reject_reason is None  # mojibake is still text
    assert "is not valid JSON" in by_id[spec["ids"][-1]].reject_reason


def test_csv_corpus_generates_stable_ids_and_fingerprint(tmp_path, bbc_dir):
    cfg = load_batch_config(ROOT / "config" / "docpilot.json").corpus
    small = tmp_path / "test.csv"
    small.write_text("".join((bbc_dir / "test.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:4]), encoding="utf-8")
    first = read_corpus(cfg, 200_000, small)
    again = read_corpus(cfg, 200_000, small)
    assert [d.id for d in first.docs][:2] == ["bbc-test-0000", "bbc-test-0001"]
    assert first.fingerprint == again.fingerprint
    small.write_text(small.read_text(encoding="utf-8") + '"one more article",tech\n', encoding="utf-8")
    assert read_corpus(cfg, 200_000, small).fingerprint != first.fingerprint


def test_shipped_corpus_path_follows_docpilot_bbc_dir_from_any_directory(tmp_path, monkeypatch, bbc_dir):
    from batch.corpus.plan import locate_corpus

    cfg = load_batch_config(ROOT / "config" / "docpilot.json").corpus
    assert cfg.path == "${DOCPILOT_BBC_DIR:-../shared/data/bbc-news}/test.csv"
    elsewhere = tmp_path / "clone"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a clone outside the workspace: ../shared does not exist from here
    monkeypatch.setenv("DOCPILOT_BBC_DIR", str(bbc_dir))
    assert locate_corpus(cfg) == ((bbc_dir / "test.csv").resolve(), "csv")
    monkeypatch.setenv("DOCPILOT_BBC_DIR", str(tmp_path / "missing"))
    with pytest.raises(InputError, match=r"corpus .*missing/test.csv does not exist \(set `corpus.path` in the config or pass "
                                         r"--corpus PATH\) \(\$\{DOCPILOT_BBC_DIR\} is .*missing, from DOCPILOT_BBC_DIR=.*missing; set DOCPILOT_BBC_DIR"):
        read_corpus(cfg, 1000)
    monkeypatch.delenv("DOCPILOT_BBC_DIR")  # the default: ../shared/data/bbc-news from here, which this clone lacks
    with pytest.raises(InputError, match=r"from unset DOCPILOT_BBC_DIR: \.\./shared/data/bbc-news from the current directory"):
        locate_corpus(cfg)
    with pytest.raises(InputError, match=r"corpus .*nope.csv does not exist \(set `corpus.path` in the config or pass --corpus PATH\)$"):
        locate_corpus(cfg.model_copy(update={"path": str(tmp_path / "nope.csv")}))  # no ${VAR}: no note
    (elsewhere / "rel.csv").write_text("text\nhi\n", encoding="utf-8")
    assert locate_corpus(cfg, "rel.csv")[0] == (elsewhere / "rel.csv").resolve()  # --corpus: from the working directory


def test_csv_corpus_with_id_column_and_directory_corpus(tmp_path):
    csv_path = tmp_path / "c.csv"
    csv_path.write_text("doc,body\na1,hello world\na1,again\n,no id\n", encoding="utf-8")
    corpus = read_corpus(CorpusConfig(path=str(csv_path), text_column="body", id_column="doc"), 1000)
    assert [d.id for d in corpus.docs] == ["a1", "c.csv#row2"]
    assert corpus.docs[0].reject_reason.startswith("duplicate id")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("an article", encoding="utf-8")
    (folder / "b.txt").write_bytes(b"")
    corpus = read_corpus(CorpusConfig(path=str(folder)), 1000)
    assert corpus.format == "dir" and [d.id for d in corpus.docs] == ["b.txt", "sub/a.txt"]
    assert corpus.docs[0].reject_reason == "empty document (0 bytes)"


def test_corpus_errors(tmp_path):
    with pytest.raises(InputError, match=r"corpus .*nope.jsonl does not exist"):
        read_corpus(CorpusConfig(path=str(tmp_path / "nope.jsonl")), 1000)
    (tmp_path / "c.txt").write_text("x")
    with pytest.raises(InputError, match=r"cannot tell the format from suffix '.txt'"):
        read_corpus(CorpusConfig(path=str(tmp_path / "c.txt")), 1000)
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(InputError, match=r"holds no documents"):
        read_corpus(CorpusConfig(path=str(tmp_path / "e.jsonl")), 1000)


def _manifest(corpus, cfg: BatchConfig, model_fp="sha256:m", adapter=None) -> dict:
    from classify.config.batch import results_config

    return {"manifest_version": mf.MANIFEST_VERSION, "corpus": corpus.describe(), "corpus_fingerprint": corpus.fingerprint,
            "config": results_config(cfg), "config_sha256": results_config_sha256(cfg), "model": {"path": "/m"},
            "model_fingerprint": model_fp, "adapter": adapter, "adapter_sha256": adapter and "abc",
            "shards": [s for s, _ in planned_shards(corpus.path, cfg.batch.shard_docs)]}


def test_resume_refused_naming_what_changed(tmp_path, bbc_dir):
    spec = make_corpus(tmp_path / "a", bbc_dir, 6)
    cfg = BatchConfig()
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    old = _manifest(corpus, cfg)
    assert mf.resume_changes(old, _manifest(corpus, cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"cpu_actors": 3})}))) == []
    changed = cfg.model_copy(update={"classify": cfg.classify.model_copy(update={"max_doc_tokens": 128})})
    with pytest.raises(InputError, match=r"cannot resume: config changed: classify.max_doc_tokens: 256 -> 128"):
        mf.check_resume(tmp_path / "b1", old, _manifest(corpus, changed))
    with pytest.raises(InputError, match=r"model changed: /m sha256:m -> /m sha256:other"):
        mf.check_resume(tmp_path / "b1", old, _manifest(corpus, cfg, model_fp="sha256:other"))
    with pytest.raises(InputError, match=r"adapter changed: none \(None\) -> bbc@1 \(abc\)"):
        mf.check_resume(tmp_path / "b1", old, _manifest(corpus, cfg, adapter="bbc@1"))
    spec["path"].write_text(spec["path"].read_text() + json.dumps({"id": "new", "text": "x"}) + "\n")
    grown = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    with pytest.raises(InputError, match=rf"corpus changed: fingerprint .* \({spec['input_rows']} -> {spec['input_rows'] + 1} rows"):
        mf.check_resume(tmp_path / "b1", old, _manifest(grown, cfg))


def _rows(docs, status="accepted"):
    return [Result(id=d.id, status=status, category="tech" if status == "accepted" else None,
                   reason=None if status == "accepted" else "r", n_tokens=3) for d in docs]


def test_scan_done_checks_ids_and_merge_invariants(tmp_path, bbc_dir):
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    planned = planned_shards(spec["path"], 4)
    manifest = Manifest.of(_manifest(corpus, BatchConfig(batch={"shard_docs": 4})))
    assert [s.n_docs for s, _ in planned] == [s.n_docs for s in manifest.shards] and len(planned) >= 3
    assert [d for _, docs in planned for d in docs] == list(corpus.docs)
    (_, docs0), (_, docs1), (_, docs2) = planned[:3]
    run = tmp_path / "run"
    assert mf.write_shard(run, 0, _rows(docs0)) == run / "shards" / "000" / "000000.jsonl"
    mf.write_shard(run, 2, _rows(docs2, "rejected"))
    assert mf.scan_done(run, manifest) == {0: {"docs": len(docs0), "accepted": len(docs0), "rejected": 0},
                                           2: {"docs": len(docs2), "accepted": 0, "rejected": len(docs2)}}
    assert mf.complete_shard_indexes(run, manifest) == [0, 2]
    mf.write_shard(run, 1, _rows(docs2))
    with pytest.raises(VerificationError, match=rf"000001.jsonl: its {len(docs2)} ids differ from the planned shard"):
        mf.scan_done(run, manifest)


def test_status_reads_run_folder(tmp_path, bbc_dir, monkeypatch, capsys):
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    cfg = BatchConfig(batch={"shard_docs": 4})
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    run = tmp_path / "runs" / "b1"
    manifest = {**_manifest(corpus, cfg), "pilot_gate": {"override": True}, "attempts": [{"error": "EngineError: boom"}]}
    mf.write_manifest(run, manifest)
    planned = planned_shards(spec["path"], 4)
    n0 = len(planned[0][1])
    mf.write_shard(run, 0, _rows(planned[0][1]))
    from classify.runs.detached import process_identity

    # a live driver: this process (a record naming another host or a dead pid reads "interrupted": test_detach_identity)
    (run / "progress.json").write_text(json.dumps({"state": "running", **process_identity(),
                                                    "accepted": 4, "rejected": 0, "docs_per_s": 2.0, "eta_s": 4.5}))
    st = batch_status("b1")
    assert (st["done"], st["total"], st["shards_done"], st["shards"], st["state"]) == (n0, 13, 1, len(planned), "running")
    assert st["last_error"] == "EngineError: boom"
    assert status_main(["b1"]) == 0
    out = capsys.readouterr().out
    assert f"done      {n0}/13 ids ({100 * n0 / 13:.1f}%), shards 1/{len(planned)}" in out and "ETA 0m04s" in out and "--skip-pilot-gate" in out
    with pytest.raises(InputError, match=r"no batch 'nope' under"):
        batch_status("nope")


def test_status_and_export_check_refuse_a_version_1_run_folder(tmp_path, monkeypatch, capsys):
    """A run folder made by an earlier docpilot (manifest_version 1: no field, shards/NNNNN.jsonl, a plan of positions)
    is refused with the resume's message, not read."""
    from batch.runfiles import EarlierRunFolder
    from classify.runs.records import write_json_atomic

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    run = tmp_path / "runs" / "old1"
    shard = {"index": 0, "start": 0, "n_docs": 1, "first_id": "a", "last_id": "a", "ids_sha256": "0" * 64}
    write_json_atomic(run / mf.MANIFEST, {"batch_id": "old1", "corpus": {"distinct_ids": 1}, "shards": [shard],
                                          "config": {"classify": {"categories": ["tech"]}}, "attempts": []})
    (run / "shards").mkdir()
    (run / "shards" / "00000.jsonl").write_text(json.dumps(Result(id="a", status="accepted", category="tech").row()) + "\n")
    (run / "summary.json").write_text("{}")
    message = r"batch old1 was made by an earlier docpilot \(run folder manifest_version 1, .* cannot read it"
    with pytest.raises(EarlierRunFolder, match=message):
        batch_status("old1")
    with pytest.raises(EarlierRunFolder, match=message):
        status_main(["old1"])
    assert capsys.readouterr().out == ""
    try:  # the export re-check of a copy: refused, whether raised or returned as its problem
        problems = check_export(run)
    except EarlierRunFolder as err:
        problems = [str(err)]
    assert len(problems) == 1 and "batch old1 was made by an earlier docpilot" in problems[0]


def _merged_run(tmp_path, bbc_dir, shard_docs):
    """A merged run folder of 6 BBC documents in shards of ``shard_docs``, its summary written: ``(run, manifest)``."""
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    manifest = Manifest.of(_manifest(corpus, BatchConfig(batch={"shard_docs": shard_docs})))
    run = tmp_path / "run"
    mf.write_manifest(run, manifest)
    for shard, docs in planned_shards(spec["path"], shard_docs):
        mf.write_shard(run, shard.index, _rows(docs))
    summary, _ = merge_results(run, manifest)
    (run / "summary.json").write_text(json.dumps(summary))
    return run, manifest


@pytest.mark.parametrize("line", [b'[1, 2]', b'null', b'{"status": "accepted", "category": "tech"}', b'{"id": 7, "status": "x"}'])
def test_a_shard_row_without_a_string_id_is_refused_naming_the_file_and_row(tmp_path, bbc_dir, line):
    """Merge, export re-check and resume scan: a VerificationError, never a TypeError out of the id hash."""
    run, manifest = _merged_run(tmp_path, bbc_dir, 8)
    path = mf.shard_path(run, 1)
    rows = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([rows[0], line, *rows[2:]]))
    words = rf"000001.jsonl: row 2 has no id \(a string, not {7 if b'7' in line else None}\)"
    with pytest.raises(VerificationError, match=words):
        mf.scan_done(run, manifest)
    if b"7" in line:  # a number for an id does not fit the id column: read_rows names the line
        words = r"000001.jsonl:2: not a result row"
    with pytest.raises(VerificationError, match=words):
        merge_results(run, manifest, write=False)
    assert len(check_export(run)) == 1 and re.search(words, check_export(run)[0])


def test_check_export_names_the_line_of_results_jsonl_and_survives_rows_that_are_not_objects(tmp_path, bbc_dir):
    run, manifest = _merged_run(tmp_path, bbc_dir, 4)
    good = (run / "results.jsonl").read_bytes()
    lines = good.split(b"\n")
    assert len(lines) > 10
    for n in (1, 7, 10):  # line n of the file (in the first, second, third shard's rows)
        (run / "results.jsonl").write_bytes(b"\n".join([*lines[:n - 1], b'{"id": oops', *lines[n:]]))
        assert check_export(run)[0].startswith(f"cannot read the copy: results.jsonl:{n}: not valid JSON")
    (run / "results.jsonl").write_bytes(b"\n".join([*lines[:5], b"", *lines[5:9], b'{"id": oops', *lines[9:]]))
    assert check_export(run)[0].startswith("cannot read the copy: results.jsonl:11: not valid JSON")  # a blank line 6
    (run / "results.jsonl").write_bytes(b"\n".join([b"[1]", b"[2]", *lines[2:]]))  # two rows without an id
    problems = check_export(run)
    assert "results.jsonl row 0 differs from shards/000/000000.jsonl" in problems
    assert "duplicate ids in results: ['None']" in problems


def test_check_export_recounts_the_copy(tmp_path, bbc_dir):
    spec = make_corpus(tmp_path / "c", bbc_dir, 6)
    corpus = read_corpus(CorpusConfig(path=str(spec["path"])), 200_000)
    cfg = BatchConfig(batch={"shard_docs": 8})
    run = tmp_path / "run"
    manifest = Manifest.of(_manifest(corpus, cfg))
    mf.write_manifest(run, manifest)
    for shard, docs in planned_shards(spec["path"], 8):
        mf.write_shard(run, shard.index, _rows(docs, "accepted" if shard.index == 0 else "rejected"))
    summary, problems = merge_results(run, manifest)  # results.jsonl and results.parquet
    assert problems == [] and (run / "results.parquet").is_file()
    (run / "summary.json").write_text(json.dumps(summary))
    assert summary["accepted"] + summary["rejected"] == len(corpus.docs) and summary["duplicate_rows"] == 1
    assert check_export(run) == []
    accepted = summary["accepted"]
    (run / "summary.json").write_text(json.dumps({**summary, "accepted": accepted + 1}))
    assert check_export(run) == [f"summary.json `accepted` is {accepted + 1} but the copied results give {accepted}"]
    (run / "summary.json").write_text("[]")  # JSON, but not the summary's object (was an AttributeError)
    assert check_export(run) == ["cannot read the copy: summary.json is not a JSON object"]


def test_unknown_adapter_is_refused_before_any_engine_starts(tmp_path, bbc_dir, monkeypatch):
    from batch.run.driver import parse_args, run_batch
    from classify.errors import AdapterNotFound

    monkeypatch.setenv("DOCPILOT_REGISTRY", str(tmp_path / "registry"))  # empty whatever other tests published

    spec = make_corpus(tmp_path / "c", bbc_dir, 4)
    args = parse_args(["--config", str(ROOT / "config" / "docpilot.json"), "--corpus", str(spec["path"]),
                       "--batch-id", "adapter-check", "--adapter", "nope@1", "--skip-pilot-gate"])
    with pytest.raises(AdapterNotFound, match=r"adapter 'nope' not found in registry .* \(known adapters: none\)"):
        run_batch(args)


def test_bad_batch_id_is_refused(tmp_path, bbc_dir):
    from batch.run.driver import parse_args, run_batch

    spec = make_corpus(tmp_path / "c", bbc_dir, 4)
    args = parse_args(["--config", str(ROOT / "config" / "docpilot.json"), "--corpus", str(spec["path"]),
                       "--batch-id", "../escape", "--skip-pilot-gate"])
    with pytest.raises(InputError, match=r"`--batch-id` must match .*, got '../escape'"):
        run_batch(args)
    early = parse_args(["--config", str(tmp_path / "no-such-config.json"), "--corpus", str(spec["path"]),
                        "--batch-id", "a/b", "--skip-pilot-gate"])
    with pytest.raises(InputError, match=r"`--batch-id` must match .*, got 'a/b'"):  # before the config is read
        run_batch(early)


def test_a_bad_batch_id_is_refused_before_any_line_says_it_starts(tmp_path, monkeypatch, caplog):
    from batch.run.driver import main

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    with caplog.at_level("INFO"), pytest.raises(InputError, match=r"`--batch-id` must match .*, got '../evil'"):
        main(["--batch-id", "../evil", "--corpus", str(tmp_path / "c.csv"), "--skip-pilot-gate"])
    assert "starting a new batch" not in caplog.text and "OVERRIDDEN" not in caplog.text


@pytest.mark.parametrize("n, cpus, expected", [
    (2, [0, 1], ["0", "1"]),  # this machine: one core per engine
    (2, list(range(16)), ["1,2,3,4,5,6,7", "9,10,11,12,13,14,15"]),  # first core of each half kept for its front end
    (3, [0, 1, 2, 3, 4], ["1", "3", "4"]),  # uneven split: earlier groups get the extra core
    (1, [0, 1], ["1"]),
    (3, [0, 1], None),  # fewer cores than actors: vLLM's auto binding
])
def test_cpu_core_groups_are_disjoint_per_actor(n, cpus, expected):
    from batch.pool.placement import cpu_core_groups

    groups = cpu_core_groups(n, cpus)
    assert groups == expected
    if groups:
        bound = [c for g in groups for c in g.split(",")]
        assert len(bound) == len(set(bound))  # no core in two engines


def test_a_corpus_that_cannot_be_planned_leaves_no_empty_run_folder(tmp_path, monkeypatch):
    """An empty corpus fails before any manifest: the new run folder is removed, so status and a rerun see no batch."""
    from batch.run.driver import parse_args, run_batch

    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    args = parse_args(["--config", str(ROOT / "config" / "docpilot.json"), "--corpus", str(tmp_path / "empty.jsonl"),
                       "--batch-id", "nothing-to-do", "--skip-pilot-gate"])
    with pytest.raises(InputError, match="holds no documents"):
        run_batch(args)
    assert not (tmp_path / "runs" / "nothing-to-do").exists()


def test_a_second_driver_on_a_held_run_folder_is_refused_and_told_how_to_watch(tmp_path):
    from filelock import FileLock

    from batch.run.driver import _driver_lock
    from classify.errors import InputError

    held = FileLock(str(tmp_path / ".driver.lock"))
    held.acquire()
    try:
        for watch in ("docpilot status b1", "docpilot status b1 --follow"):
            with pytest.raises(InputError, match=rf"batch b1 is already running .*watch it with `{watch}`"):
                _driver_lock("b1", tmp_path, watch)
    finally:
        held.release()
    _driver_lock("b1", tmp_path, "docpilot status b1").release()  # free again: taken and given back


def test_the_corpus_of_the_command_line_gets_its_own_ids_and_a_url_is_never_resolved(tmp_path, monkeypatch):
    """Issue 42 item 5: `corpus.id_prefix` names the configured corpus only (the driver's `corpus_settings_for`)."""
    from pathlib import Path

    from batch.corpus.plan import corpus_settings_for
    from classify.config.batch import CorpusConfig

    cfg = CorpusConfig(path=str(tmp_path / "test.csv"), id_prefix="bbc-test")
    assert corpus_settings_for(cfg, None).id_prefix == "bbc-test"
    assert corpus_settings_for(cfg, tmp_path / "sub" / ".." / "test.csv").id_prefix == "bbc-test"  # the same file
    assert corpus_settings_for(cfg, tmp_path / "news.csv").id_prefix is None  # -> news-NNNN
    monkeypatch.setattr(Path, "resolve", lambda self, strict=False: (_ for _ in ()).throw(AssertionError("resolved")))
    assert corpus_settings_for(cfg, "s3://bucket/news.csv").id_prefix is None
    url = CorpusConfig(path="s3://bucket/test.csv", id_prefix="bbc-test")
    assert corpus_settings_for(url, "s3://bucket/test.csv").id_prefix == "bbc-test"
