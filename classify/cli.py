"""The ``docpilot`` console command: one entry point, one subcommand per job.

Each subcommand lives in the package that owns it and is imported only when
called, so ``docpilot plan`` never imports vLLM. Every :class:`DocpilotError`
is mapped here, once, to its exit code and a one-line ``error:`` message.
"""

from __future__ import annotations

import importlib
import logging
import sys

from classify.errors import DocpilotError

COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("classify.model_cli:main", "provision the base model into the model cache"),
    "doctor": ("classify.doctor:main", "check interpreter, torch, devices, vLLM, Ray, disk and memory"),
    "pilot": ("batch.pilot:main", "run the 12-document pilot and record a decision"),
    "batch": ("batch.driver:main", "classify a corpus with Ray, resumable by manifest"),
    "status": ("batch.status:main", "show a batch run's progress from another shell"),
    "plan": ("batch.plan:main", "lot order summary and per-card memory fit"),
    "train": ("adapters.train:main", "LoRA fine-tuning with checkpoints and resume"),
    "adapters": ("adapters.cli:main", "adapter registry: list, show, verify, merge"),
    "serve": ("serve.cli:main", "HTTP endpoint over vLLM (FastAPI)"),
}


def _usage() -> str:
    lines = ["usage: docpilot COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``docpilot COMMAND ...``.

    Args:
        argv: arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit status: 0 on success, :attr:`DocpilotError.exit_code` on a known
        error, 1 on an unexpected one.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r} (allowed: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest) or 0)
    except DocpilotError as err:
        print(f"error [{err.kind}]: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
