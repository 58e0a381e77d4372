"""A clean SIGTERM of ``docpilot serve`` ends quietly (issue 42 item 8): exit 0, "server stopped", and no traceback
from vLLM's ``AsyncLLM.__del__`` as the interpreter collects the engine it had already shut down."""

from __future__ import annotations

import signal

import pytest

from tests.support.servers import start_server


@pytest.mark.slow  # about 1 min: a server of its own (make test-slow); test_serve_http's SIGTERM test stays in make test
@pytest.mark.timeout(900)
def test_sigterm_of_an_idle_server_ends_without_a_traceback(tmp_path):
    log_path = tmp_path / "server.log"
    _, proc = start_server(log_path, "--skip-pilot-gate")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0, log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert "server stopped" in text
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
