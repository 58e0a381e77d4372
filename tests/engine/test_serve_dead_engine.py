"""A real server whose engine core dies: health and readiness say so, then the process exits 5.

Its own ``docpilot serve`` process (the one in ``test_serve_http.py`` stays untouched): wait
for ``/readyz`` 200, SIGKILL the ``VLLM::EngineCore`` child, then every route must tell the
truth within seconds and the process must exit with :attr:`EngineError.exit_code`.
"""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from classify.errors import EngineError
from tests.support.servers import AUTH, start_server, stop_server

# the module's server may take up to START_TIMEOUT_S (600 s) to start; its own server start makes it a long
# test (about 45 s on 2 cores): make test-slow
pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


EXIT_DELAY_S = 5.0
DETECT_TIMEOUT_S = 10.0
EXIT_TIMEOUT_S = 90.0


def _engine_core(pid: int) -> psutil.Process:
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    pytest.fail(f"no EngineCore child under server pid {pid}")


def _poll(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None


def test_killed_engine_core_turns_health_503_and_the_server_exits_5(tmp_path):
    log_path = tmp_path / "server.log"
    url, proc = start_server(log_path, "--engine-failure-exit-delay-s", str(EXIT_DELAY_S))
    try:
        core = _engine_core(proc.pid)
        core.send_signal(signal.SIGKILL)
        killed_at = time.time()
        while _poll(f"{url}/readyz") != 503:
            assert time.time() - killed_at < DETECT_TIMEOUT_S, log_path.read_text()[-3000:]
            time.sleep(0.2)
        ready = httpx.get(f"{url}/readyz", timeout=5).json()
        assert ready["status"] == "failed" and "engine core process died" in ready["error"], ready
        health = httpx.get(f"{url}/healthz", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert all(not a["servable"] for a in httpx.get(f"{url}/v1/adapters", headers=AUTH, timeout=5).json()["adapters"])
        metrics = httpx.get(f"{url}/metrics", headers=AUTH, timeout=5).text
        assert "docpilot_engine_ready 0.0" in metrics
        resp = httpx.post(f"{url}/v1/classify", json={"documents": [{"id": "a", "text": "Shares rose."}]},
                          headers=AUTH, timeout=30)
        assert resp.status_code == 503 and resp.json()["error"]["message"].startswith("the engine died: ")
        assert proc.wait(EXIT_TIMEOUT_S) == EngineError.exit_code, log_path.read_text()[-3000:]
        assert time.time() - killed_at >= EXIT_DELAY_S - 1
        log = log_path.read_text()
        assert "engine died: the vLLM engine core process died" in log
        assert "error [engine]: server stopped because its engine failed" in log
    finally:
        stop_server(proc)
