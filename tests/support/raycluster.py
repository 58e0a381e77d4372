"""A Ray cluster of several nodes on this machine, each node a ``ray start --block`` process this test started.

Every node runs on 127.0.0.1 with its own temp folder and ports, token authentication on (Ray >= 2.59 turns it on
for ``ray start``), and may declare GPUs it does not have (``--num-gpus``: the hardware faked at its edge, Ray's
count). Never ``ray stop`` (it would stop every Ray on the machine): each node is ended through the process this
helper started, and what is left under it or naming its temp folder, by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_ports() -> list[str]:
    """Own ports for every per-node Ray service, so two nodes (and other Rays) on one machine never collide."""
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    return [a for name, port in zip(names, free_ports(len(names)), strict=True) for a in (name, str(port))]


def raylet(node: subprocess.Popen):
    """The raylet process under a ``ray start --block`` process, or None."""
    import psutil

    try:
        for proc in psutil.Process(node.pid).children(recursive=True):
            try:
                if "raylet" in proc.name() or any(a.endswith("/raylet") for a in proc.cmdline()[:1]):
                    return proc
            except psutil.Error:
                continue
    except psutil.Error:
        return None
    return None


def under(pid: int, root_pid: int) -> bool:
    """Whether process ``pid`` is ``root_pid`` or one of its descendants."""
    import psutil

    try:
        return pid == root_pid or any(p.pid == root_pid for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def end_node(node: subprocess.Popen | None, temp_dir: str) -> None:
    """Stop one ``ray start --block`` node this helper started and every process under it or naming its temp dir."""
    import psutil

    if node is None:
        return
    procs = []
    try:
        procs = psutil.Process(node.pid).children(recursive=True)
    except psutil.Error:
        pass
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in a for a in proc.info["cmdline"] or ()) and proc.pid != os.getpid():
                procs.append(proc)
        except psutil.Error:
            continue
    if node.poll() is None:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(timeout=30)
    _, alive = psutil.wait_procs(procs, timeout=20)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


class LocalCluster:
    """A head and nodes joined to it, all on 127.0.0.1.

    Args:
        logs: folder for each node's log.

    Attributes:
        gcs: the head's ``host:port`` (what ``RAY_ADDRESS`` names).
        env: the environment a driver or node of this cluster needs (token authentication).
        nodes: ``(process, temp dir)`` per node, head first.
    """

    def __init__(self, logs: Path):
        self.logs = logs
        self.gcs_port, self.client_port = free_ports(2)
        self.gcs = f"127.0.0.1:{self.gcs_port}"
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VLLM_CPU_OMP_THREADS_BIND")}
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
        self.env = env
        self.nodes: list[tuple[subprocess.Popen, str]] = []

    def alive(self) -> int:
        """Alive nodes, asked from a fresh driver process (this process may hold its own Ray)."""
        code = (f"import ray; ray.init(address={self.gcs!r}, log_to_driver=False); "
                "print('ALIVE', sum(bool(n['Alive']) for n in ray.nodes())); ray.shutdown()")
        probe = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True, timeout=120)
        for line in probe.stdout.splitlines():
            if line.startswith("ALIVE "):
                return int(line.split()[1])
        return 0

    def add(self, *, cpus: int, gpus: int = 0, resources: dict | None = None, node_env: dict | None = None,
            wait_s: float = 240) -> subprocess.Popen:
        """Start the head (first call) or join a node, and wait until the cluster counts it alive.

        Raises:
            RuntimeError: the node did not come up within ``wait_s`` (its log's tail in the message).
        """
        head = not self.nodes
        temp = tempfile.mkdtemp(prefix="dpray-", dir="/tmp")
        where = (["--head", "--port", str(self.gcs_port), "--ray-client-server-port", str(self.client_port),
                  "--include-dashboard", "false"] if head else ["--address", self.gcs])
        extra = ["--resources", json.dumps(resources)] if resources else []
        log = self.logs / f"ray-node{len(self.nodes)}.log"
        proc = subprocess.Popen(
            [RAY, "start", "--block", *where, "--node-ip-address", "127.0.0.1", "--temp-dir", temp,
             "--num-cpus", str(cpus), "--num-gpus", str(gpus), "--disable-usage-stats", *extra, *node_ports()],
            env={**self.env, **(node_env or {})}, stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True)
        self.nodes.append((proc, temp))
        deadline = time.monotonic() + wait_s
        while self.alive() < len(self.nodes):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node {len(self.nodes) - 1} did not come up: {log.read_text()[-2000:]}")
            time.sleep(2)
        return proc

    def remove(self, proc: subprocess.Popen) -> None:
        """End one node of this cluster."""
        for entry in [n for n in self.nodes if n[0] is proc]:
            end_node(*entry)
            shutil.rmtree(entry[1], ignore_errors=True)
            self.nodes.remove(entry)

    def stop(self) -> None:
        """End every node, the head last."""
        for proc, temp in reversed(self.nodes):
            end_node(proc, temp)
            shutil.rmtree(temp, ignore_errors=True)
        self.nodes.clear()
