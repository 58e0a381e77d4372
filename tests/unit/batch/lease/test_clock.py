"""The lease clock: ``docpilot status`` compares ETA + export time with the lease end (synthetic run folders)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from batch import layout as mf
from batch.lease.clock import LeaseWatch, lease_check, lease_end, parse_lease_end
from batch.lot.status import batch_status
from batch.lot.status import main as status_main
from classify.errors import ConfigError

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _run(root, batch_id="b-lease", total=10_000, done=4_000, rate=2.0, shard_bytes=4 * 1024**2):
    """A running batch: manifest with 10 shards of 1000 ids, ``done/1000`` shard files, and its progress.json."""
    run = root / batch_id
    shards = [{"index": i, "row": i * 1000, "n_rows": 1000, "n_docs": 1000} for i in range(total // 1000)]
    mf.write_manifest(run, {"manifest_version": mf.MANIFEST_VERSION, "corpus": {"distinct_ids": total}, "shards": shards,
                            "pilot_gate": {"override": False}, "attempts": []})
    for i in range(done // 1000):  # shard_bytes spread over the complete shards
        mf.shard_path(run, i).parent.mkdir(parents=True, exist_ok=True)
        mf.shard_path(run, i).write_bytes(b"x" * (shard_bytes // (done // 1000)))
    (run / mf.PROGRESS).write_text(json.dumps({"state": "running", "host": "elsewhere", "pid": 1, "docs_per_s": rate,
                                               "accepted": done, "rejected": 0, "eta_s": (total - done) / rate if rate else None}))
    return run


def test_a_batch_whose_eta_passes_the_lease_end_does_not_fit(tmp_path):
    _run(tmp_path)
    st = batch_status("b-lease", tmp_path)
    assert (st["done"], st["total"]) == (4000, 10_000)
    # 6000 ids at 2 docs/s = 50 min; export: 4 MiB of shards x 10/4 x 2 = ~20 MiB at 10 MiB/s = ~2 s
    tight = lease_check(st, NOW + dt.timedelta(minutes=45), now=NOW)
    assert tight["fits"] is False and tight["eta_s"] == 3000.0 and 1.9 < tight["export_s"] < 2.2
    assert tight["message"].startswith("WILL NOT FINISH before the lease ends (5m02s short)")
    assert "add a lot" in tight["message"].lower() and "--export-partial DEST" in tight["message"]
    ok = lease_check(st, NOW + dt.timedelta(minutes=55), now=NOW)
    assert ok["fits"] is True and ok["message"].startswith("fits: ETA 50m00s + export ~0m02s") and "to spare" in ok["message"]
    # the export time alone can make it miss: a slow uplink (0.01 MiB/s -> ~35 min of upload)
    slow = lease_check(st, NOW + dt.timedelta(minutes=55), now=NOW, upload_mib_per_s=0.01)
    assert slow["fits"] is False and slow["export_s"] > 1800


def test_no_rate_yet_is_unknown_not_a_verdict(tmp_path):
    _run(tmp_path, done=0, rate=0.0)
    st = batch_status("b-lease", tmp_path)
    out = lease_check(st, NOW + dt.timedelta(hours=1), now=NOW)
    assert out["fits"] is None and "no rate yet" in out["message"]


def test_status_command_reads_the_lease_from_the_lots_config_or_the_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    _run(tmp_path / "runs")
    lots = json.loads(open("config/lots.json").read())
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "lots.json").write_text(json.dumps({**lots, "lease_ends_at": soon}))
    assert status_main(["b-lease", "--lots-config", str(tmp_path / "lots.json")]) == 0
    out = capsys.readouterr().out
    assert "  lease     WILL NOT FINISH before the lease ends" in out
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).isoformat()
    assert status_main(["b-lease", "--lots-config", str(tmp_path / "lots.json"), "--lease-ends", later, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["lease"]["fits"] is True
    assert status_main(["b-lease", "--lots-config", str(tmp_path / "none.json")]) == 0
    assert "  lease  " not in capsys.readouterr().out


def test_partial_export_copies_complete_shards_and_rechecks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))
    _run(tmp_path / "runs", shard_bytes=4000)
    assert status_main(["b-lease", "--lots-config", str(tmp_path / "none.json"), "--export-partial", str(tmp_path / "out")]) == 0
    copies = list((tmp_path / "out").iterdir())
    assert len(copies) == 1 and copies[0].name.startswith("b-lease-partial-")
    assert sorted(p.name for p in (copies[0] / mf.SHARDS / "000").iterdir()) == [f"{i:06d}.jsonl" for i in range(4)]
    assert (copies[0] / "SHA256SUMS").is_file()


def test_lease_end_parsing():
    assert parse_lease_end("2026-12-03T19:00:00+01:00") == dt.datetime(2026, 12, 3, 18, 0, tzinfo=dt.UTC)
    with pytest.raises(ConfigError, match=r"`lease_ends_at` must be ISO 8601 with a timezone .* got '2026-12-03 18:00'"):
        parse_lease_end("2026-12-03 18:00")
    assert lease_end("config/lots.json") is None  # shipped config: no lease end set
    assert lease_end(None, "2026-12-03T18:00:00Z") == dt.datetime(2026, 12, 3, 18, 0, tzinfo=dt.UTC)


class _FakeProgress:
    def __init__(self, total, done, rate):
        self.total, self.done, self._rate, self.lease = total, done, rate, None

    def rate(self):
        return self._rate

    lease_rate = rate  # no steady rate yet: the overall one


def test_the_batch_progress_line_says_whether_the_lease_fits(tmp_path):
    import io

    from tqdm import tqdm


    run = _run(tmp_path)
    out = io.StringIO()
    bar = tqdm(total=10_000, file=out, ascii=True)
    now = dt.datetime.now(dt.UTC)
    tight = LeaseWatch(now + dt.timedelta(minutes=45), run, "b-lease", every_s=3600)
    progress = _FakeProgress(10_000, 4_000, 2.0)  # 6000 ids at 2 docs/s = 50 min
    verdict = tight.tick(progress, bar)
    assert verdict["fits"] is False and progress.lease["short"].startswith("lease: WILL NOT FINISH")
    bar.refresh()
    assert "lease: WILL NOT FINISH" in out.getvalue()
    progress._rate = 100.0
    assert tight.tick(progress, bar) is verdict  # checked again only after every_s (it walks the run folder)
    assert tight.tick(progress, bar, force=True)["fits"] is True
    assert progress.lease["short"].startswith("lease: fits, ")
    assert LeaseWatch(None, run, "b-lease").tick(progress, bar) is None  # no lease end: nothing checked


def test_a_finished_batch_or_an_ended_lease_gets_the_right_advice(tmp_path):
    _run(tmp_path, done=10_000)
    st = batch_status("b-lease", tmp_path)
    later = lease_check(st, NOW + dt.timedelta(hours=1), now=NOW)
    assert later["fits"] is True and later["message"].startswith("batch finished, nothing left to classify; the lease ends")
    ended = lease_check(st, NOW - dt.timedelta(hours=1), now=NOW)
    assert ended["fits"] is False and "the lease ENDED 1h00m00s ago" in ended["message"] and "Add a lot" not in ended["message"]
    _run(tmp_path, batch_id="b-run", done=4_000)
    running = lease_check(batch_status("b-run", tmp_path), NOW - dt.timedelta(minutes=5), now=NOW)
    assert running["fits"] is False and running["message"].startswith("the lease ENDED 5m00s ago")
    assert "--export-partial" in running["message"]


def test_the_steady_rate_leaves_the_engine_start_out_and_drives_the_eta_and_the_lease(tmp_path, monkeypatch):
    """Issue 42 item 4: 60 s of engine start, then a shard of 100 documents every 10 s: the steady rate is 10 docs/s
    (the overall rate 3.3 docs/s); progress.json, the ETA and the lease clock go by the steady one."""
    from batch.run import progress as progress_mod
    from batch.run.progress import Progress

    clock = [1000.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    run = _run(tmp_path, total=1000, done=0)
    p = Progress(run, "b-lease", total=1000)
    p.start({})
    clock[0] += 60  # the engines start
    for _ in range(3):
        clock[0] += 10
        p.shard_counted(100, 100, 0, 20_000)
    assert p.steady() == (10.0, 2000.0) and round(p.rate(), 2) == 3.33
    p.save()
    saved = json.loads((run / mf.PROGRESS).read_text())
    assert (saved["steady_docs_per_s"], saved["steady_tokens_per_s"], saved["docs_per_s"]) == (10.0, 2000.0, 3.333)
    assert saved["eta_s"] == 70.0  # 700 documents left at 10 docs/s, not at 3.3
    watch = LeaseWatch(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3), run, "b-lease")
    assert watch.tick(p, force=True)["eta_s"] == 70.0
