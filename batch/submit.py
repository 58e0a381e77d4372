"""``python -m batch.submit`` / ``make submit``: submit the batch to a Ray cluster's job server.

Builds a small working directory (the ``classify``, ``batch`` and ``adapters`` packages and
``config/``: no model weights, no ``runs/``, no ``.git``), then runs::

    ray job submit --address $RAY_ADDRESS --working-dir <staging> --submission-id <batch-id> \\
        --runtime-env-json '{"env_vars": {DOCPILOT_* as absolute paths}}' \\
        -- python -m classify.cli batch --config config/batch.json --corpus <abs> --batch-id <id> ...

The job's driver runs on the head node in the uploaded copy, so every path it needs (corpus,
model cache, runs, exports, registry, pilot records) is passed as an absolute path resolved
here: on a multi-node cluster they must exist on the head node (a shared volume).
With token authentication on (Ray >= 2.59 turns it on for ``ray start``), ``ray job submit``
reads the token like every Ray client: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token`` (``ray get-auth-token``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from batch._config import load_batch_config
from classify.errors import ConfigError, InputError
from classify.paths import exports_dir, model_cache_dir, registry_dir, runs_dir, state_dir
from classify.runrecords import new_run_dir

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("docpilot", "classify", "batch", "adapters")
DEFAULT_ADDRESS = "http://127.0.0.1:8265"


def stage_working_dir(dest: Path, config: Path) -> Path:
    """Copy the code the job needs (Python sources of :data:`PACKAGES`) and the config into ``dest``.

    Args:
        dest: an empty folder.
        config: the batch config file, copied to ``config/batch.json``.

    Returns:
        ``dest``.
    """
    for pkg in PACKAGES:
        if (ROOT / pkg).is_dir():
            shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    (dest / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy2(config, dest / "config" / "batch.json")
    return dest


def job_env() -> dict[str, str]:
    """The ``DOCPILOT_*`` locations as absolute paths for the job (its cwd is the uploaded copy)."""
    return {
        "DOCPILOT_HOME": str(state_dir()),
        "DOCPILOT_MODEL_CACHE": str(model_cache_dir()),
        "DOCPILOT_REGISTRY": str(registry_dir()),
        "DOCPILOT_RUNS": str(runs_dir()),
        "DOCPILOT_EXPORTS": str(exports_dir()),
    }


def build_command(args: argparse.Namespace, staging: Path, batch_id: str, corpus: Path) -> list[str]:
    """The ``ray job submit`` command line (see the module docstring)."""
    entry = [args.python, "-m", "docpilot", "batch", "--config", "config/batch.json",
             "--corpus", str(corpus), "--batch-id", batch_id, "--no-progress"]
    if args.adapter:
        entry += ["--adapter", args.adapter]
    if args.export_dir:
        entry += ["--export-dir", str(Path(args.export_dir).resolve())]
    if args.skip_pilot_gate:
        entry.append("--skip-pilot-gate")
    cmd = [args.ray, "job", "submit", "--address", args.address, "--working-dir", str(staging),
           "--submission-id", f"docpilot-{batch_id}", "--runtime-env-json", json.dumps({"env_vars": job_env()})]
    if args.no_wait:
        cmd.append("--no-wait")
    return [*cmd, "--", *entry]


def main(argv: list[str] | None = None) -> int:
    """Submit ``docpilot batch`` to a Ray job server and report where the results are.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        ``ray job submit``'s exit status (0: the job succeeded, or was submitted with ``--no-wait``).

    Raises:
        ConfigError: invalid config. InputError: the corpus does not exist.
    """
    p = argparse.ArgumentParser(prog="python -m batch.submit", description="Submit the batch to a Ray cluster's job server.")
    p.add_argument("--config", default="config/batch.json", help="batch config (default: %(default)s)")
    p.add_argument("--corpus", help="corpus file or folder on the head node (default: the config's `corpus.path`)")
    p.add_argument("--adapter", help="adapter name@version")
    p.add_argument("--batch-id", help="batch id (default: a new one); an existing one is resumed")
    p.add_argument("--export-dir", help="parent folder of the export copy, on the head node")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS,
                   help="job server (dashboard) address (default: $RAY_ADDRESS or %(default)s)")
    p.add_argument("--skip-pilot-gate", action="store_true", help="passed on to docpilot batch (logged and recorded)")
    p.add_argument("--no-wait", action="store_true", help="return after submitting (follow with `ray job logs -f`)")
    p.add_argument("--python", default="python", help="interpreter on the head node (default: %(default)s)")
    beside = Path(sys.executable).parent / "ray"  # the venv's own CLI, also when the venv is not activated
    p.add_argument("--ray", default=str(beside) if beside.is_file() else shutil.which("ray") or "ray",
                   help="the ray CLI (default: %(default)s)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_batch_config(args.config)
    corpus = Path(args.corpus or cfg.corpus.path).expanduser().resolve()
    if not corpus.exists():
        raise InputError(f"corpus {corpus} does not exist (pass --corpus)")
    if args.address.startswith("ray://") or "://" not in args.address:
        raise ConfigError(f"`--address` must be the job server's http://host:port (dashboard), got {args.address!r}")
    if args.batch_id:
        batch_id = args.batch_id
    else:
        batch_id, folder = new_run_dir("batch", runs_dir())
        folder.rmdir()  # only the name is reserved here; the job creates the folder
    with tempfile.TemporaryDirectory(prefix="docpilot-job-") as tmp:
        staging = stage_working_dir(Path(tmp), Path(args.config))
        cmd = build_command(args, staging, batch_id, corpus)
        print("submitting:", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, check=False).returncode
    run_dir = runs_dir() / batch_id
    print(f"batch {batch_id}: job docpilot-{batch_id} {'submitted' if args.no_wait else f'exited {rc}'}")
    print(f"results: {run_dir}/results.jsonl  summary: {run_dir}/summary.json  progress: docpilot status {batch_id}")
    return rc

