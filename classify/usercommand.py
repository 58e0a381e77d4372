"""The user's own command form in every hint: ``make`` variables when ``make`` started docpilot, CLI flags otherwise.

The Makefile runs each ``docpilot`` command with ``DOCPILOT_VIA_MAKE=1`` in its environment
(:data:`VIA_MAKE_ENV`); a hint written once in the CLI form (``docpilot batch --batch-id X --detach``) is
then shown as the make user types it (``make batch BATCH=X DETACH=1``). The table :data:`MAKE_VARS` is the
Makefile's own (``$(if $(BATCH),--batch-id $(BATCH))``); ``tests/unit/classify/test_usercommand.py`` reads the
Makefile to keep the two in step. A hint naming a flag that no make variable passes stays in the CLI form,
the one form that works.
"""

from __future__ import annotations

import os
import shlex

VIA_MAKE_ENV = "DOCPILOT_VIA_MAKE"
"""Set to ``1`` by the Makefile on every ``docpilot`` command line."""

MAKE_VARS: dict[str, str] = {
    "--batch-id": "BATCH",
    "--corpus": "CORPUS",
    "--resume-from": "RESUME_FROM",
    "--adapter": "ADAPTER",
    "--cpu-actors": "CPU_ACTORS",
    "--skip-pilot-gate": "SKIP_PILOT_GATE",
    "--export-dir": "EXPORT_DIR",
    "--lease-ends": "LEASE_ENDS",
    "--detach": "DETACH",
    "--stop-when-done": "STOP_WHEN_DONE",
    "--wrap-up-to": "DEST",
    "--export-partial": "EXPORT_PARTIAL",
    "--follow": "FOLLOW",
    "--from": "FROM",
    "--smoke": "SMOKE",
    "--input": "INPUT",
    "--to": "DEST",
    "--no-stop": "NO_STOP",
    "--json": "JSON",
}
"""docpilot flag -> the Makefile variable that passes it (the Makefile's ``$(if $(VAR),--flag ...)``)."""

SWITCHES = frozenset(
    {"--skip-pilot-gate", "--detach", "--stop-when-done", "--follow", "--smoke", "--no-stop"}
)
"""Flags without a value: ``VAR=1`` in the make form."""

CONFIG_VARS: dict[str, str] = {"batch": "BATCH_CONFIG", "train": "TRAIN_CONFIG", "pilot": "CONFIG", "doctor": "CONFIG"}
"""The make variable that passes ``--config``, by target (``make batch BATCH_CONFIG=...``; the others default to ``CONFIG``)."""

POSITIONAL: dict[str, str] = {"status": "BATCH"}
"""Commands whose positional argument a make variable passes (``docpilot status ID`` = ``make status BATCH=ID``)."""


def started_by_make() -> bool:
    """Whether this docpilot was started by ``make`` (:data:`VIA_MAKE_ENV` is ``1``)."""
    return os.environ.get(VIA_MAKE_ENV) == "1"


def user_command(cli: str) -> str:
    """A ``docpilot ...`` command line in the form the user started docpilot with.

    Args:
        cli: the CLI form, words separated by spaces (``"docpilot status ID --export-partial DEST"``;
            ``...`` stands for "the rest as before" and is kept).

    Returns:
        ``cli`` itself outside make, or where a word has no make variable; else the make form
        (``"make status BATCH=ID EXPORT_PARTIAL=DEST"``).

    Example:
        >>> os.environ[VIA_MAKE_ENV] = "1"; user_command("docpilot batch --batch-id b1 --detach")
        'make batch BATCH=b1 DETACH=1'
    """
    if not started_by_make():
        return cli
    try:
        words = shlex.split(cli)  # a quoted path with a space is one word
    except ValueError:
        return cli
    if len(words) < 2 or words[0] != "docpilot":
        return cli
    target, out, i = words[1], ["make", words[1]], 2
    while i < len(words):
        word = words[i]
        if word in SWITCHES:
            out.append(f"{MAKE_VARS[word]}=1")
        elif word == "--config" and target in CONFIG_VARS and i + 1 < len(words):
            out.append(f"{CONFIG_VARS[target]}={shlex.quote(words[i + 1])}")
            i += 1
        elif word in MAKE_VARS and i + 1 < len(words):
            out.append(f"{MAKE_VARS[word]}={shlex.quote(words[i + 1])}")
            i += 1
        elif word == "..." or (not word.startswith("-") and target in POSITIONAL):
            out.append(word if word == "..." else f"{POSITIONAL[target]}={word}")
        else:
            return cli
        i += 1
    return " ".join(out)


def user_flag(flag: str, value: str | None = None) -> str:
    """One flag in the user's form: ``--skip-pilot-gate`` or ``SKIP_PILOT_GATE=1``; ``--export-partial DEST`` or
    ``EXPORT_PARTIAL=DEST``.

    Args:
        flag: the CLI flag.
        value: its value, ``None`` for a switch.
    """
    if started_by_make() and flag in MAKE_VARS:
        return f"{MAKE_VARS[flag]}={'1' if value is None else value}"
    return flag if value is None else f"{flag} {value}"


def cli_description(doc: str | None) -> str:
    """A command's ``--help`` description from its module docstring: the first line, without reST's literal quotes.

    >>> cli_description('''``docpilot doctor``: can this machine run the configured model?\\n\\nMore.''')
    'docpilot doctor: can this machine run the configured model?'
    """
    lines = (doc or "").strip().splitlines()
    return lines[0].replace("``", "") if lines else ""
