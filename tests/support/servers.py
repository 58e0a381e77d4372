"""A real ``docpilot serve`` process on a free loopback port: start it, wait for ``/readyz``, stop it.

Shared by the engine tests of the server (``tests/engine/test_serve_*.py``), which each start their own
process with the real vLLM engine. ``make_tiny_lora`` saves a random LoRA those servers load.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT

TOKEN = "test-token-" + "k" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 180


def make_tiny_lora(model_path: str, out: Path, seed: int) -> Path:
    """Save a random-init peft LoRA (r=8 on q_proj, v_proj; B not zero, so it changes answers)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, cfg).save_pretrained(out)
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen]:
    """Start ``docpilot serve`` on a free loopback port and wait until ``/readyz`` answers 200.

    Args:
        log_path: where the server's stdout and stderr go.
        *args: more ``docpilot serve`` options (``--config``, host and port are set here).
        env: more environment variables (``DOCPILOT_API_TOKEN`` is set here).

    Returns:
        ``(base_url, process)``; stop it with :func:`stop_server`.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "docpilot", "serve", "--config", str(ROOT / "config" / "docpilot.json"),
           "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "DOCPILOT_API_TOKEN": TOKEN, **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    return url, proc
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                pytest.fail(f"server not ready after {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
    except BaseException:
        stop_server(proc)
        raise


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server if it still runs; SIGKILL it after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
