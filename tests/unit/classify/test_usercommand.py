"""Hints in the user's own command form (issue 42 item 7): make's variables when make started docpilot."""

from __future__ import annotations

import re

import pytest

from classify import usercommand
from classify.errors import PilotGateError
from classify.runs.gate import require_pilot
from classify.usercommand import MAKE_VARS, SWITCHES, VIA_MAKE_ENV, user_command, user_flag
from tests.support import ROOT


@pytest.mark.parametrize(
    ("cli", "make"),
    [
        ("docpilot status b1 --export-partial DEST", "make status BATCH=b1 EXPORT_PARTIAL=DEST"),
        ("docpilot batch --batch-id b1 --detach ...", "make batch BATCH=b1 DETACH=1 ..."),
        ("docpilot batch --resume-from s3://x/b1", "make batch RESUME_FROM=s3://x/b1"),
        ("docpilot status b1 --follow", "make status BATCH=b1 FOLLOW=1"),
        (
            "docpilot batch --no-progress",
            "docpilot batch --no-progress",
        ),  # no make variable passes it: the CLI form stays
    ],
)
def test_a_cli_hint_in_make_words_when_make_started_docpilot(monkeypatch, cli, make):
    monkeypatch.setenv(VIA_MAKE_ENV, "1")
    assert user_command(cli) == make
    monkeypatch.delenv(VIA_MAKE_ENV)
    assert user_command(cli) == cli


def test_every_make_variable_of_the_table_passes_that_flag_in_the_makefile():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for flag, var in MAKE_VARS.items():
        value = "" if flag in SWITCHES else rf" \$\({var}\)"
        passed = (
            rf"\$\(if \$\({var}\),{re.escape(flag)}{value}\)"
            if flag in SWITCHES
            else rf"{re.escape(flag)}{value}"
        )
        assert re.search(passed, makefile), (flag, var)
    lines = [
        line
        for line in makefile.splitlines()
        if line.startswith("\t") and ("$(DOCPILOT)" in line or "/docpilot " in line)
    ]
    assert lines and all("$(DOCPILOT) " in line for line in lines), (
        lines
    )  # every command line says make started it
    assert re.search(rf"^DOCPILOT\s*:=\s*{VIA_MAKE_ENV}=1 ", makefile, re.M)


@pytest.mark.parametrize(
    ("via_make", "words", "not_words"),
    [
        (True, "pass SKIP_PILOT_GATE=1 to override", "--skip-pilot-gate"),
        (False, "pass --skip-pilot-gate to override", "SKIP_PILOT_GATE"),
    ],
)
def test_the_gate_refusal_names_the_override_in_the_users_form(
    monkeypatch, tmp_path, via_make, words, not_words
):
    monkeypatch.setattr(usercommand.os, "environ", {VIA_MAKE_ENV: "1"} if via_make else {})
    with pytest.raises(PilotGateError) as err:
        require_pilot("k" * 64, "base model m (no adapter)", folder=tmp_path)
    assert words in str(err.value) and not_words not in str(err.value)
    assert user_flag("--skip-pilot-gate") == ("SKIP_PILOT_GATE=1" if via_make else "--skip-pilot-gate")


def test_help_descriptions_are_the_docstrings_first_line_without_rest_quotes():
    from batch.pilot import doctor
    from classify.usercommand import cli_description

    assert cli_description(doctor.__doc__) == "docpilot doctor: can this machine run the configured model? " \
        "The pilot runs these checks first (all but memory)."
    assert cli_description(None) == cli_description("  ") == ""
