"""The ``docpilot`` console command: one entry point, one subcommand per job.

This module sits above the packages it dispatches to (``classify``, ``batch``, ``adapters``,
``serve``); none of them imports it. Each subcommand lives in the package that owns it and is
imported only when called, so ``docpilot plan`` never imports vLLM. Every :class:`DocpilotError`
is mapped here, once, to its exit code and a one-line ``error:`` message.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading

from classify.errors import DocpilotError, Interrupted
from classify.machine.probe import idle_card_warning
from classify.paths import verbose_logs
from docpilot.logs import configure_logging

COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("classify.model.model_cli:main", "provision the base model into the model cache"),
    "doctor": ("batch.pilot.doctor:main", "check interpreter, torch, devices, vLLM, Ray, disk and memory"),
    "pilot": ("batch.pilot.run:main", "run the 12-document pilot and record a decision"),
    "batch": ("batch.run.driver:main", "classify a corpus with Ray, resumable by manifest"),
    "status": ("batch.lot.status:main", "show a batch run's progress from another shell"),
    "plan": ("batch.plan.plan:main", "lot order summary and per-card memory fit"),
    "train": ("adapters.train.train:main", "LoRA fine-tuning with checkpoints and resume"),
    "adapters": ("adapters.registry.cli:main", "adapter registry: list, show, verify, merge, export, import"),
    "serve": ("serve.cli:main", "HTTP endpoint over vLLM (FastAPI)"),
    "cluster-check": ("batch.pool.cluster_check:main", "one probe actor per card across the Ray cluster: node, card, "
                      "CUDA_VISIBLE_DEVICES, TP group"),
    "submit": ("batch.run.submit:main", "submit the batch to a Ray cluster's job server and follow it"),
    "wrap-up": ("batch.lot.wrapup:main", "copy every adapter and run off the pod, re-check each copy, then stop the lease"),
}

DETACHABLE: dict[str, str] = {
    "batch": "batch.run.driver:prepare_detach",
    "train": "adapters.train.train:prepare_detach",
}
"""Commands that take ``--detach`` / ``--stop-when-done``: each one's ``prepare_detach(argv)`` checks its options
and returns a :class:`~classify.runs.detached.DetachPlan`, which :func:`docpilot.detach.detach` starts."""
DETACH_FLAGS = ("--detach", "--stop-when-done")

IDLE_CARD_COMMANDS = ("batch", "train")
"""Commands that warn once, at their start, when the machine has a card and the venv computes on the CPU
(:func:`classify.machine.probe.idle_card_warning`; the pilot's doctor says it as a blocker or a warning)."""


def _verbose(argv: list[str]) -> tuple[bool, list[str]]:
    """``--verbose`` anywhere before ``--`` (removed from argv), or ``DOCPILOT_VERBOSE=1``."""
    end = argv.index("--") if "--" in argv else len(argv)
    flag = "--verbose" in argv[:end]
    rest = [a for i, a in enumerate(argv) if not (a == "--verbose" and i < end)]
    return flag or verbose_logs(), rest


def _usage() -> str:
    lines = ["usage: docpilot [--verbose] COMMAND [ARGS...]  (docpilot --version: the installed version)", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "--verbose (or DOCPILOT_VERBOSE=1): show vLLM's, Ray's and transformers' own log lines"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``docpilot COMMAND ...``; output cut short by the reader (``docpilot --help | head``) ends quietly.

    Args:
        argv: arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        :func:`_main`'s exit status; 141 (128 + SIGPIPE, as a shell reports a writer the pipe stopped) when
        the reader closed standard output early (the remaining output is dropped, with no traceback:
        the Python documentation's recipe, "Note on SIGPIPE" in the ``signal`` module).
    """
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail the same way
        return 141


def _main(argv: list[str] | None = None) -> int:
    """Run ``docpilot COMMAND ...``.

    Args:
        argv: arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit status: 0 on success, :attr:`DocpilotError.exit_code` on a known
        error, 1 on an unexpected one.
    """
    verbose, argv = _verbose(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(f"docpilot {version('docpilot')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r} (allowed: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    configure_logging(verbose)
    if name in IDLE_CARD_COMMANDS and not os.environ.get(IDLE_CARD_SAID):
        _warn_idle_card()
    func = _resolve(COMMANDS[name][0])
    if name in DETACHABLE and _wants_detach(rest):
        from docpilot.detach import detach  # lazy: only a detach needs the lot's wrap-up and stop

        prepare = _resolve(DETACHABLE[name])
        func = lambda argv: detach(argv, prepare)  # noqa: E731
    try:
        return int(func(rest) or 0)
    except DocpilotError as err:
        if isinstance(err, Interrupted):
            _ignore_further_stops()
        try:
            print(f"error [{err.kind}]: {err}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP after a dropped SSH connection): the run folder has the record
            pass
        return err.exit_code


IDLE_CARD_SAID = "DOCPILOT_IDLE_CARD_SAID"
"""Set once the idle-card warning was given, so a detached child of the same command does not repeat it."""


def _warn_idle_card() -> None:
    line = idle_card_warning()
    if line:
        logging.getLogger("docpilot").warning(line)
        os.environ[IDLE_CARD_SAID] = "1"


def _resolve(target: str):
    """The function an import string ``"package.module:function"`` names (its module imported now)."""
    module_name, func_name = target.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def _wants_detach(argv: list[str]) -> bool:
    """``--detach`` or ``--stop-when-done`` before any ``--``, and no ``--help`` (the command's own help answers it)."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = argv[:end]
    return any(f in head for f in DETACH_FLAGS) and not ({"-h", "--help"} & set(head))


def _ignore_further_stops() -> None:
    """After a stop by SIGTERM / Ctrl-C / SIGHUP, ignore these signals for the rest of the process (SIGKILL still stops it).

    A repeated signal must not turn exit 130 into 143 while the process winds down: Python's and torch's
    teardown take a second or more, and Python puts its own handlers back to the default action when it
    finalizes (``signal`` module, ``_PySignal_Fini``), so only ``SIG_IGN`` holds until the process exits.
    """
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
