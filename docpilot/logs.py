"""docpilot's logging, set up once: its own INFO lines always, the libraries' only with ``--verbose``.

Every command through :func:`configure_logging` (called by :mod:`docpilot.cli`), and the detached run's supervisor
through :func:`log_lines` (:mod:`docpilot.detach`): both import it from here, so neither imports the other.
"""

from __future__ import annotations

import logging
import os
import warnings

QUIET_ENV: dict[str, str] = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vllm/envs.py; read when vllm is first imported, here and in engine processes
    "TRANSFORMERS_VERBOSITY": "error",
    "RAY_LOGGER_LEVEL": "error",  # the `ray` Python loggers (ray_constants.LOGGER_LEVEL)
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10 warnings printed as "[W... file.cpp:N] Warning: ..." (vLLM's NUMA binding note)
    "PYTHONWARNINGS": "ignore::FutureWarning",  # libraries' deprecation notices, in the engine's child processes too
}
"""Environment set by default (unless the user set the name) so vLLM, Ray and transformers log only errors.
Set before any of them is imported; child processes inherit it (Ray actors through runtime_env)."""

QUIET_LOGGERS = ("vllm", "ray", "transformers", "torch", "accelerate", "peft", "matplotlib")


def log_lines() -> None:
    """The one ``logging.basicConfig`` of docpilot: INFO and above to stderr as ``time level logger: message``
    (every command through :func:`configure_logging`, and the detached run's supervisor)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def configure_logging(verbose: bool) -> None:
    """docpilot's own INFO lines always; vLLM's, Ray's and transformers' only when ``verbose``.

    Quiet mode lowers third-party logging to errors through their own environment variables
    (:data:`QUIET_ENV`, set before they are imported) and Python loggers. Errors are never hidden:
    the first error of a failed command is still printed whole by :func:`docpilot.cli.main`.

    Args:
        verbose: ``docpilot --verbose`` or ``DOCPILOT_VERBOSE=1``: everything, as the libraries log it.
    """
    if verbose:
        os.environ["DOCPILOT_VERBOSE"] = "1"  # seen by the batch driver (Ray log_to_driver) and child processes
    else:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)
    log_lines()
    if not verbose:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        if os.environ.get("PYTHONWARNINGS") == QUIET_ENV["PYTHONWARNINGS"]:  # this process read it before it was set
            warnings.filterwarnings("ignore", category=FutureWarning)
