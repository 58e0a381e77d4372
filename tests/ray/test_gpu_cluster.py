"""Two lots, one cluster: two Ray nodes on this machine declaring one GPU each (``ray start --num-gpus 1``, token
authentication), the batch's real pool, run folders and merge with the bench's instant engine
(:mod:`tests.support.gpu_probe`), the run's device made ``cuda`` at its edge (torch's answer).

One engine actor per card on its own node; TP=2 refused (no node has 2 GPUs); ``make cluster-check`` against the
cluster; a third node joined while a batch runs gets an actor and shards, every shard run once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from classify.errors import ConfigError
from tests.support.corpora import ROOT, news_rows, write_config, write_jsonl
from tests.support.raycluster import LocalCluster

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a second node, one GPU (declared) each. Drivers are their own processes (Ray reads its token
    settings when first imported): :func:`tests.support.gpu_probe.run`."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.add(cpus=2, gpus=1)
        c.add(cpus=1, gpus=1)
        yield c
    finally:
        c.stop()


def batch(tmp_path, cluster, batch_id: str, tp: int = 1, n: int = 40, shard_docs: int = 5) -> subprocess.CompletedProcess:
    """The batch driver (:func:`tests.support.gpu_probe.run`) joined to the cluster; its summary on the last line."""
    corpus = write_jsonl(tmp_path / "c.jsonl", news_rows(n))
    config = write_config(tmp_path / "c.json", shard_docs=shard_docs)
    data = json.loads(config.read_text())
    data["engine"]["tensor_parallel_size"] = tp
    config.write_text(json.dumps(data))
    env = {**cluster.env, "RAY_ADDRESS": cluster.gcs, "DOCPILOT_RUNS": str(tmp_path / "runs"),
           "DOCPILOT_EXPORTS": str(tmp_path / "exports")}
    return subprocess.run([sys.executable, "-m", "tests.support.gpu_probe", str(config), str(corpus), batch_id],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def summary_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def results(tmp_path, batch_id: str) -> list[str]:
    from classify.runs.records import read_jsonl

    return [r["id"] for r in read_jsonl(tmp_path / "runs" / batch_id / "results.jsonl")]


def test_two_nodes_one_gpu_each_give_one_actor_per_card(cluster, tmp_path):
    summary = summary_of(batch(tmp_path, cluster, "two-nodes"))
    actors = json.loads((tmp_path / "runs" / "two-nodes" / "progress.json").read_text())["actors"]
    assert summary["this_attempt"]["actors"] == 2 and len(actors) == 2
    assert len({a["node_id"] for a in actors}) == 2  # one per node (lot)
    assert [a["cuda_visible_devices"] for a in actors] == ["0", "0"]  # each node's one card
    ids = results(tmp_path, "two-nodes")
    assert sorted(ids) == sorted(r["id"] for r in news_rows(40)) and len(ids) == len(set(ids))


def test_tp2_on_two_one_gpu_nodes_is_refused(cluster, tmp_path):
    done = batch(tmp_path, cluster, "tp2-refused", tp=2)
    assert done.returncode == ConfigError.exit_code, done.stderr[-3000:]
    assert ("error [ConfigError]: `engine.tensor_parallel_size` 2 needs 2 GPUs on one node, but the Ray cluster's nodes "
            "have [1, 1] GPU(s): a tensor-parallel group never spans nodes (lots)") in done.stderr


def test_make_cluster_check_places_one_probe_per_card(cluster, tmp_path):
    out = subprocess.run(["make", "-s", "cluster-check"], cwd=ROOT, env={**cluster.env, "RAY_ADDRESS": cluster.gcs},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Ray cluster: 2 node(s), 2 GPU(s), tensor parallel 1: 2 engine actor(s)" in out.stdout
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "CUDA_VISIBLE_DEVICES" in line and "TP group" in line)
    rows = [line.split() for line in lines[header + 1:] if not line.startswith("cluster check")]
    assert len(rows) == 2 and len({r[0] for r in rows}) == 2  # one probe per card, on two nodes
    assert sorted((r[2], r[3], r[4]) for r in rows) == [("0", "0", "0"), ("0", "0", "1")]  # card, CVD, TP group
    assert out.stdout.rstrip().endswith("cluster check: ok")
    # the same cluster with TP=2 in the config: no node has 2 GPUs, said before anything is placed
    config = tmp_path / "tp2.json"
    config.write_text(json.dumps({"engine": {"tensor_parallel_size": 2}}))
    refused = subprocess.run(["make", "-s", "cluster-check", f"BATCH_CONFIG={config}"], cwd=ROOT,
                             env={**cluster.env, "RAY_ADDRESS": cluster.gcs}, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "needs 2 GPUs on one node" in refused.stderr


@pytest.mark.slow  # about 23 s (make test-slow); one actor per card on two nodes stays in make test
def test_a_node_joined_mid_run_gets_an_actor_and_shards_exactly_once(cluster, tmp_path):
    """Runs last: it adds a third node. The first two actors hold their shards until the late node has classified one
    (:mod:`tests.support.gpu_probe`), so the late node finds shards waiting on any machine."""
    seen = tmp_path / "seen"
    seen.mkdir()
    (seen / "wait-for-late").touch()
    progress = tmp_path / "runs" / "joined" / "progress.json"
    joined: dict = {}

    def join_when_two_actors_work() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if len(json.loads(progress.read_text()).get("actors", [])) >= 2:
                    joined["node"] = cluster.add(cpus=1, gpus=1, node_env={"PROBE_LATE": "1"})
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)

    thread = threading.Thread(target=join_when_two_actors_work, daemon=True)
    thread.start()
    summary = summary_of(batch(tmp_path, cluster, "joined", n=60, shard_docs=2))
    thread.join(timeout=60)
    assert "node" in joined, "the third node never joined"
    attempt = summary["this_attempt"]
    assert (attempt["actors"], attempt["actors_started"], attempt["retries"]) == (3, 3, 0)
    actors = json.loads(progress.read_text())["actors"]
    late = [a for a in actors if a["late"]]
    assert len(late) == 1 and late[0]["cuda_visible_devices"] == "0"
    shards_by_late = [json.loads(p.read_text()) for p in seen.glob("d-*.json")]
    assert sum(s["late"] for s in shards_by_late) >= 1  # the late node's actor ran shards
    ids = results(tmp_path, "joined")
    assert sorted(ids) == sorted(r["id"] for r in news_rows(60)) and len(ids) == len(set(ids))  # exactly once
    planned = json.loads((tmp_path / "runs" / "joined" / "manifest.json").read_text())["shards"]
    assert len(shards_by_late) == len(planned)  # every planned shard ran (recorded by its first id)
