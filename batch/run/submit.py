"""``docpilot submit`` / ``make submit``: submit the batch to a Ray cluster's job server and follow it.

Builds a small working directory (the ``docpilot``, ``classify``, ``batch`` and ``adapters``
packages and ``config/``: no model weights, no ``runs/``, no ``.git``), then submits it with
Ray's :class:`ray.job_submission.JobSubmissionClient` (no ``ray`` CLI subprocess)::

    submission id  docpilot-<batch-id>
    runtime_env    {"working_dir": <staging>, "env_vars": {DOCPILOT_* as absolute paths}}
    entrypoint     python -m docpilot batch --config config/<file> --corpus <abs> --batch-id <id> ...

and follows the job's log until it ends (``--no-wait``: returns once submitted). The job's
driver runs on the head node in the uploaded copy, so every path it needs (corpus, model cache,
runs, exports, registry, pilot records) is passed as an absolute path resolved here: on a
multi-node cluster they must exist on the head node (a shared volume).
With token authentication on (``RAY_AUTH_MODE=token``; Ray >= 2.59 can start clusters with it),
the client sends the token like every Ray client, read from ``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` (``ray get-auth-token``); a refused token is
reported with Ray's own explanation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from classify.config.batch import check_batch_id, load_batch_config
from classify.errors import ConfigError, InputError
from classify.paths import exports_dir, model_cache_dir, path_hint, registry_dir, runs_dir, state_dir
from classify.runs import storage
from classify.runs.records import new_run_dir
from classify.usercommand import user_flag

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("docpilot", "classify", "batch", "adapters")
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
POLL_S = 2.0
"""Seconds between status polls when the log stream ends before the job does."""


def stage_working_dir(dest: Path, config: Path) -> Path:
    """Copy the code the job needs (Python sources of :data:`PACKAGES`) and the config into ``dest``.

    Args:
        dest: an empty folder.
        config: the config file, copied to ``config/<its name>`` (the entrypoint's ``--config``).

    Returns:
        ``dest``.
    """
    for pkg in PACKAGES:
        if (ROOT / pkg).is_dir():
            shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    (dest / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy2(config, dest / "config" / config.name)
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


def build_entrypoint(args: argparse.Namespace, batch_id: str, corpus: Path | str) -> list[str]:
    """The job's entrypoint, ``python -m docpilot batch ...``, as an argument list (see the module docstring)."""
    entry = [args.python, "-m", "docpilot", "batch", "--config", f"config/{Path(args.config).name}",
             "--corpus", str(corpus), "--batch-id", batch_id, "--no-progress"]
    if args.adapter:
        entry += ["--adapter", args.adapter]
    if args.export_dir:
        entry += ["--export-dir", str(Path(args.export_dir).resolve())]
    if args.skip_pilot_gate:
        entry.append("--skip-pilot-gate")
    return entry


def job_request(args: argparse.Namespace, staging: Path, batch_id: str, corpus: Path | str) -> dict[str, Any]:
    """Keyword arguments of :meth:`JobSubmissionClient.submit_job` for this batch.

    Returns:
        ``{"entrypoint": str (shell-quoted), "submission_id": "docpilot-<batch_id>",
        "runtime_env": {"working_dir": str, "env_vars": dict[str, str]}}``.
    """
    return {
        "entrypoint": shlex.join(build_entrypoint(args, batch_id, corpus)),
        "submission_id": f"docpilot-{batch_id}",
        "runtime_env": {"working_dir": str(staging), "env_vars": job_env()},
    }


UNREACHABLE_HINT = (" (nothing answers there: the job server is the head's Ray dashboard, port 8265 unless "
                    "`ray start --head --dashboard-port` says otherwise; start the head with `--dashboard-host 0.0.0.0` "
                    "to reach it from another machine, or tunnel it: ssh -L 8265:localhost:8265 HEAD; then pass "
                    "--address http://HOST:8265 or set RAY_ADDRESS)")
"""Appended to an unreachable job server's error: where the job server is and how to reach it."""


def connect(address: str) -> Any:
    """A :class:`ray.job_submission.JobSubmissionClient` for ``address`` (imported here: Ray loads slowly).

    Raises:
        ConnectionError: no job server answers at ``address``.
        RuntimeError: the server refused the client (version, authentication).
    """
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def follow(client: Any, job_id: str) -> str:
    """Print the job's log as it is written until the job ends; return its final status.

    Args:
        client: a connected job client.
        job_id: the submission id.

    Returns:
        The terminal :class:`ray.job_submission.JobStatus` value as a string
        (``"SUCCEEDED"``, ``"FAILED"`` or ``"STOPPED"``).
    """

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    try:
        asyncio.run(tail())
    except RuntimeError as err:  # the log stream closed early: fall back to polling the status
        print(f"(log stream ended: {err}; polling the job status)", flush=True)
    while not (status := client.get_job_status(job_id)).is_terminal():
        time.sleep(POLL_S)
    return str(status.value)


def report(client: Any, job_id: str, status: str) -> int:
    """Print the job's outcome the way ``ray job submit`` does; 0 only when it succeeded."""
    if status == "SUCCEEDED":
        print(f"Job '{job_id}' succeeded")
        return 0
    print(f"Job '{job_id}' {'was stopped' if status == 'STOPPED' else status.lower()}")
    message = client.get_job_info(job_id).message
    if message:
        print(f"Status message: {message}")
    return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="docpilot submit", description="Submit the batch to a Ray cluster's job server.")
    p.add_argument("--config", default="config/docpilot.json", help="batch config (default: %(default)s)")
    p.add_argument("--corpus", help="corpus file or folder: checked here, read by the driver on the head node, so the same path must exist on both "
                        "(a shared mount), or an s3:// (fsspec) URL the head node reads; default: the config's corpus.path")
    p.add_argument("--adapter", help="adapter name@version")
    p.add_argument("--batch-id", help="batch id (default: a new one); an existing one is resumed")
    p.add_argument("--export-dir", help="parent folder of the export copy, on the head node")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS,
                   help="job server (dashboard) address (default: $RAY_ADDRESS or %(default)s)")
    p.add_argument("--skip-pilot-gate", action="store_true", help="passed on to docpilot batch (logged and recorded)")
    p.add_argument("--no-wait", action="store_true", help="return after submitting (follow with 'ray job logs -f')")
    p.add_argument("--python", default="python", help="interpreter on the head node (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Submit ``docpilot batch`` to a Ray job server, follow it, and report where the results are.

    Args:
        argv: command-line arguments after ``docpilot submit`` (default ``sys.argv[1:]``).

    Returns:
        0 when the job succeeded (or was submitted, with ``--no-wait``); 1 when it failed or was
        stopped, or the job server could not be reached or refused the submission.

    Raises:
        ConfigError: invalid config or address. InputError: the corpus does not exist.
    """
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    check_batch_id(args.batch_id)
    cfg = load_batch_config(args.config)
    location = args.corpus if args.corpus else cfg.corpus.resolved_location()
    corpus: Path | str = location if storage.is_url(str(location)) else Path(location).expanduser().resolve()
    if isinstance(corpus, Path) and not corpus.exists():  # a URL is read by the driver from the store
        hint = "" if args.corpus else path_hint(cfg.corpus.path)
        raise InputError(f"corpus {corpus} does not exist (pass {user_flag('--corpus', 'PATH')}){hint}")
    if args.address.startswith("ray://") or "://" not in args.address:
        raise ConfigError(f"`--address` (default: $RAY_ADDRESS) must be the job server's http://host:port (dashboard, e.g. "
                          f"http://HEAD:8265; not the HEAD:6379 address `make batch` joins), got {args.address!r}")
    if args.batch_id:
        batch_id = args.batch_id
    else:
        batch_id, folder = new_run_dir("batch", runs_dir())
        folder.rmdir()  # only the name is reserved here; the job creates the folder
    job_id = f"docpilot-{batch_id}"
    from ray.exceptions import RayError  # e.g. AuthenticationError: a missing or refused token

    try:
        client = connect(args.address)
        with tempfile.TemporaryDirectory(prefix="docpilot-job-") as tmp:
            request = job_request(args, stage_working_dir(Path(tmp), Path(args.config)), batch_id, corpus)
            print(f"submitting: job {job_id} to {args.address}: working_dir {request['runtime_env']['working_dir']} "
                  f"({', '.join(PACKAGES)}, config/{Path(args.config).name}), entrypoint: {request['entrypoint']}", flush=True)
            client.submit_job(**request)  # uploads the working_dir before it returns
        print(f"Job '{job_id}' submitted successfully", flush=True)
        rc = 0 if args.no_wait else report(client, job_id, follow(client, job_id))
    except (ConnectionError, RuntimeError, RayError) as err:  # unreachable, refused token, duplicate submission id, ...
        hint = UNREACHABLE_HINT if isinstance(err, ConnectionError) else ""
        print(f"error [ray]: job server {args.address}: {err}{hint}", file=sys.stderr)
        return 1
    run_dir = runs_dir() / batch_id
    outcome = f"submitted (follow: ray job logs -f {job_id})" if args.no_wait else f"exited {rc}"
    print(f"batch {batch_id}: job {job_id} {outcome}")
    print(f"results: {run_dir}/results.jsonl  summary: {run_dir}/summary.json  progress: docpilot status {batch_id}")
    return rc
