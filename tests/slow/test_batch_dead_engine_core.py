"""Slow: ``docpilot batch`` with the real vLLM engine survives its ``VLLM::EngineCore`` killed or frozen.

The engine core is killed (``SIGKILL``) or frozen (``SIGSTOP``) part-way; the actor is replaced, the
shard retried whole, and the batch finishes with results equal to an uninterrupted run. The
scheduler's rules with stand-in actors are ``tests/ray/test_batch_dead_engine.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.answers import assert_same_answers, score_tolerance
from tests.support.corpora import (
    ROOT,
    kill_recorded,
    make_corpus,
    write_config,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(3600)]  # long tests: an hour each at most


def _progress(run: Path) -> dict:
    try:
        return json.loads((run / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _engine_core(progress: dict):
    import psutil

    for actor in progress.get("actors", []):
        for rec in actor.get("procs", []):
            try:
                proc = psutil.Process(rec["pid"])
                if "EngineCore" in f"{proc.name()} {' '.join(proc.cmdline())}":
                    return proc
            except psutil.Error:
                continue
    return None


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["engine-killed", "engine-frozen"])
def test_real_batch_survives_a_dead_or_frozen_engine_core(tmp_path, bbc_dir, engine, sig):
    from classify.config.batch import load_batch_config
    from classify.paths import runs_dir
    from classify.runs.records import read_jsonl
    from tests.support.corpora import read_corpus

    spec = make_corpus(tmp_path / "corpus", bbc_dir, 20)
    config = write_config(tmp_path / "batch.json", shard_docs=4, shard_timeout_base_s=30, shard_timeout_per_doc_s=5)
    batch_id = f"dead-engine-{sig.name.lower()}"
    run = runs_dir() / batch_id
    cmd = [sys.executable, "-m", "docpilot", "batch", "--config", str(config), "--corpus", str(spec["path"]),
           "--batch-id", batch_id, "--skip-pilot-gate", "--no-progress"]
    log = open(tmp_path / "batch.log", "w")
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            progress = _progress(run)
            core = _engine_core(progress) if progress.get("done", 0) >= 4 else None
            if core is not None or driver.poll() is not None:
                break
            time.sleep(0.5)
        assert core is not None, f"no engine core seen; driver exit {driver.poll()}"
        seen += [rec for a in progress["actors"] for rec in a["procs"]]
        os.kill(core.pid, sig)
        assert driver.wait(timeout=900) == 0, (tmp_path / "batch.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
        seen += [rec for a in _progress(run).get("actors", []) for rec in a.get("procs", [])]
        kill_recorded(seen)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["this_attempt"]["retries"] >= 1
    want = "engine stuck" if sig == signal.SIGSTOP else "Actor"
    assert want in summary["this_attempt"]["errors"][0]
    rows = read_jsonl(run / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(spec["ids"])
    assert not any("engine" in (r.get("reason") or "") for r in rows)
    # equal to an uninterrupted run: the same documents through the session's engine (float32: to rounding;
    # bfloat16 on AMX Xeons: a batch's products depend on which prompts share it, so a near tie may swap)
    cfg = load_batch_config(config)
    corpus = read_corpus(cfg.corpus, cfg.classify.max_doc_bytes, spec["path"])
    assert_same_answers(engine.classify(list(corpus.docs)), rows, score_tolerance(cfg.model),
                        min_clear=len([r for r in rows if r["status"] == "accepted"]) // 2)
