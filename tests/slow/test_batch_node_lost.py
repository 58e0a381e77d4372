"""Slow: a batch on a two-node Ray cluster loses its second node part-way and finishes on the survivor.

Both nodes run on this machine, each started with ``ray start`` (token auth, as Ray >= 2.59
requires), each offering one CPU and its own temp folder, and each binding its engines to its
own core (``VLLM_CPU_OMP_THREADS_BIND`` in the node's environment, inherited by its workers).
The driver joins through ``RAY_ADDRESS`` with ``batch.cpu_actors: 2`` x ``actor_num_cpus: 1``,
so one engine actor lands on each node. On one machine both nodes have the IP 127.0.0.1, so
the second node's actor is told apart by its process tree: its worker is a descendant of that
node's raylet. Part-way (a shard done, the second node's actor working) the second node's
raylet and every process under it (workers, the vLLM engine core) get SIGKILL while that actor holds a shard
(its ``actors[].shards`` in ``progress.json``, seen before the kill), so the retry is certain, not a race. The pool sees
the actor lost, charges its running shard one retry, and its replacement cannot be placed
(the head's one CPU is taken by the surviving actor), so after ``batch.actor_place_timeout_s``
(default 120 s) the slot is dropped and the survivor finishes: every id exactly once.

Never ``ray stop`` here (it would stop every Ray on the machine): each node is ended through the
``ray start --block`` process this test started, and what is left under it by pid.

The scheduler's placement rules with stand-in actors are ``tests/ray/test_batch_lost_node.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.corpora import ROOT, kill_recorded, make_corpus, write_config
from tests.support.raycluster import end_node, free_ports, node_ports, raylet, under

pytestmark = [pytest.mark.ray, pytest.mark.timeout(3600)]  # long tests: an hour each at most

RAY = str(Path(sys.executable).parent / "ray")
"""A custom resource no node offers: an actor asking for it is never placed (like one waiting for a lost node)."""


def _progress(run: Path) -> dict:
    try:
        return json.loads((run / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _alive_nodes(env: dict, gcs: str) -> int:
    code = (f"import ray; ray.init(address={gcs!r}, log_to_driver=False); "
            "print('ALIVE', sum(bool(n['Alive']) for n in ray.nodes())); ray.shutdown()")
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    for line in probe.stdout.splitlines():
        if line.startswith("ALIVE "):
            return int(line.split()[1])
    return 0


@pytest.mark.slow
@pytest.mark.engine
def test_batch_finishes_on_the_survivor_when_a_node_is_lost(tmp_path, bbc_dir):
    import psutil

    from batch import layout
    from classify.paths import runs_dir
    from classify.runs.records import read_jsonl

    t0 = time.monotonic()
    spec = make_corpus(tmp_path / "corpus", bbc_dir, 24)
    config = write_config(tmp_path / "batch.json", shard_docs=4, cpu_actors=2, actor_num_cpus=1.0, max_shard_retries=2)
    gcs_port, client_port = free_ports(2)
    gcs = f"127.0.0.1:{gcs_port}"
    temps = [tempfile.mkdtemp(prefix="lnray-h-", dir="/tmp"), tempfile.mkdtemp(prefix="lnray-2-", dir="/tmp")]
    base_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VLLM_CPU_OMP_THREADS_BIND")}
    base_env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                     "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
    logs = [open(tmp_path / "ray-head.log", "w"), open(tmp_path / "ray-node2.log", "w"), open(tmp_path / "driver.log", "w")]
    head = node2 = driver = None
    recorded: list[dict] = []
    run = runs_dir() / "lostnode"
    try:
        # 1. the cluster: a head and a second node, one CPU and one core each
        head = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs_port),
             "--ray-client-server-port", str(client_port), "--include-dashboard", "false", "--temp-dir", temps[0],
             "--num-cpus", "1", "--disable-usage-stats", *node_ports()],
            env={**base_env, "VLLM_CPU_OMP_THREADS_BIND": "0"}, stdout=logs[0], stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 240
        while _alive_nodes(base_env, gcs) < 1:
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Ray head did not come up: {(tmp_path / 'ray-head.log').read_text()[-2000:]}")
            time.sleep(3)
        node2 = subprocess.Popen(
            [RAY, "start", "--block", "--address", gcs, "--node-ip-address", "127.0.0.1", "--temp-dir", temps[1],
             "--num-cpus", "1", "--resources", json.dumps({"node2": 1}), "--disable-usage-stats", *node_ports()],
            env={**base_env, "VLLM_CPU_OMP_THREADS_BIND": "1"}, stdout=logs[1], stderr=subprocess.STDOUT,
            start_new_session=True)
        while _alive_nodes(base_env, gcs) < 2:
            if node2.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"second Ray node did not join: {(tmp_path / 'ray-node2.log').read_text()[-2000:]}")
            time.sleep(3)
        head_raylet, node2_raylet = raylet(head), raylet(node2)
        assert head_raylet is not None and node2_raylet is not None and head_raylet.pid != node2_raylet.pid
        t_cluster = time.monotonic() - t0

        # 2. the batch joins the cluster through RAY_ADDRESS: one actor per node
        driver = subprocess.Popen(
            [sys.executable, "-m", "docpilot", "batch", "--config", str(config), "--corpus", str(spec["path"]),
             "--batch-id", "lostnode", "--skip-pilot-gate", "--no-progress"],
            cwd=ROOT, env={**base_env, "RAY_ADDRESS": gcs}, stdout=logs[2], stderr=subprocess.STDOUT,
            start_new_session=True)

        def both_working() -> dict | None:
            """progress.json once a shard is done and the second node's actor holds a shard (``actors[].shards``)."""
            p = _progress(run)
            actors = p.get("actors", [])
            if p.get("done", 0) < 4 or len(actors) < 2:
                return None
            on2 = [a for a in actors if under(a["pid"], node2_raylet.pid) and a.get("shards")]
            return p if on2 else None

        deadline = time.monotonic() + 900
        while not (before := both_working()):
            if driver.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"driver exited {driver.returncode} or timed out before both actors worked: "
                            f"{(tmp_path / 'driver.log').read_text()[-3000:]}")
            time.sleep(0.2)  # the kill follows the sighting within a poll, well inside one shard's classify time
        recorded += [rec for a in before["actors"] for rec in a.get("procs", [])]
        on_head = [a for a in before["actors"] if under(a["pid"], head_raylet.pid)]
        on_node2 = [a for a in before["actors"] if under(a["pid"], node2_raylet.pid)]
        assert len(on_head) == 1 and len(on_node2) == 1, before["actors"]
        assert on_head[0]["cpu_bind"] == "0" and on_node2[0]["cpu_bind"] == "1"  # each node's own core
        in_flight = on_node2[0]["shards"]  # the shard(s) the lost node holds: they must be retried on the survivor
        assert before["done"] < len(spec["ids"]), "the batch finished before the node could be lost"
        t_first = time.monotonic() - t0

        # 3. the second node is lost: its raylet and everything under it (workers, engine core), SIGKILL
        victims = [node2_raylet, *node2_raylet.children(recursive=True)]
        assert on_node2[0]["pid"] in {p.pid for p in victims}, "the second node's actor is not under its raylet"
        for proc in victims:
            try:
                proc.kill()
            except psutil.Error:
                pass
        t_kill = time.monotonic() - t0

        # 4. the batch finishes on the survivor
        try:
            rc = driver.wait(timeout=1500)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the batch hung after the node was lost: {(tmp_path / 'driver.log').read_text()[-3000:]}")
        log_text = (tmp_path / "driver.log").read_text()
        assert rc == 0, log_text[-4000:]
        t_done = time.monotonic() - t0
        rows = read_jsonl(run / "results.jsonl")
        ids = [r["id"] for r in rows]
        assert sorted(ids) == sorted(spec["ids"]) and len(ids) == len(set(ids))
        summary = json.loads((run / "summary.json").read_text())
        assert summary["accepted"] + summary["rejected"] == summary["total"] == len(spec["ids"])
        assert summary["attempts"] == 1  # no rerun needed
        attempt = summary["this_attempt"]
        # the lost actor's running shard (one of those progress.json showed it holding) was charged one retry ...
        charged = [int(e.split(":")[0].split()[1]) for e in attempt["errors"] if e.startswith("shard ") and "Actor" in e]
        assert in_flight and charged and set(charged) <= set(in_flight), (in_flight, attempt)
        assert attempt["retries"] == len(charged) >= 1, attempt
        # ... and written once by the survivor (the lost node's processes are gone): its shard file and every id
        assert all(layout.shard_path(run, i).is_file() for i in in_flight)
        assert attempt["processed_docs"] == len(spec["ids"])
        # the replacement asks for the lost node's CPU: it is dropped after batch.actor_place_timeout_s, unless
        # the survivor finished everything first (the fast tests check the drop itself)
        dropped = "could not be placed" in log_text
        after = _progress(run)
        recorded += [rec for a in after.get("actors", []) for rec in a.get("procs", [])]
        print(f"\nlost-node timings: cluster up {t_cluster:.0f} s, first shard + both actors {t_first:.0f} s, "
              f"node killed at {t_kill:.0f} s, batch done at {t_done:.0f} s; pool {attempt['pool_wall_s']} s, "
              f"retries {attempt['retries']} (shard(s) {charged}; the lost node held {in_flight}), "
              f"actors started {attempt['actors_started']}, slot dropped {dropped}")
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=60)
        kill_recorded(recorded)
        end_node(node2, temps[1])
        end_node(head, temps[0])
        for fh in logs:
            fh.close()
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
