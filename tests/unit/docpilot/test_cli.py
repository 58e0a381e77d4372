"""The ``docpilot`` front door: it lives above the packages it dispatches to, and nothing imports it back."""

from __future__ import annotations

import ast
import importlib.util
import os
import pkgutil
import subprocess
import sys

import pytest

from classify.machine.probe import installed_profile
from docpilot.cli import COMMANDS, DETACHABLE, main
from tests.support.corpora import ROOT

PACKAGES = ("classify", "batch", "adapters", "serve")
def test_every_command_names_a_function_its_module_defines():
    targets = {**{name: target for name, (target, _help) in COMMANDS.items()},
               **{f"{name} --detach": target for name, target in DETACHABLE.items()}}
    for name, target in targets.items():
        module, func = target.split(":")
        assert module.split(".")[0] in PACKAGES, name
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, name
        tree = ast.parse(open(spec.origin, encoding="utf-8").read())
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), name


def test_python_m_docpilot_is_the_same_command():
    out = subprocess.run([sys.executable, "-m", "docpilot", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: docpilot [--verbose] COMMAND")
    listed = [line for line in out.stdout.splitlines() if line.startswith("  ")]
    assert [line.split()[0] for line in listed] == list(COMMANDS) and "submit" in COMMANDS
    assert len({len(line) - len(line[2:].split(maxsplit=1)[1]) for line in listed}) == 1  # the help texts line up
    bad = subprocess.run([sys.executable, "-m", "docpilot", "nope"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "error: unknown command 'nope'" in bad.stderr


def test_no_arguments_is_usage_and_status_2(capsys):
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().out


def test_known_errors_map_to_their_exit_code(capsys):
    # `docpilot plan` with a missing config: ConfigError -> exit 2 and one `error [config]:` line
    assert main(["plan", "--config", "/no/such/lots.json"]) == 2
    assert capsys.readouterr().err.startswith("error [config]: ")


def test_help_into_a_reader_that_stops_early_ends_without_a_traceback():
    """``docpilot --help | true``: the reader is gone before the usage is written (``| head`` does the same once it
    has its lines); no BrokenPipeError traceback, status 141 (128 + SIGPIPE) as a shell reports such a writer."""
    proc = subprocess.run(f"{sys.executable} -m docpilot --help | true; exit ${{PIPESTATUS[0]}}", shell=True,
                          executable="/bin/bash", cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141


def test_option_help_texts_are_plain_text_without_markdown_backquotes():
    """``--help`` prints help= strings as they are: `field` would show its backquotes (descriptions keep the docstring)."""
    found = []
    for package in (*PACKAGES, "docpilot", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("add_argument", "add_parser"):
                    found += [f"{path.relative_to(ROOT)}:{kw.value.lineno}" for kw in node.keywords
                              if kw.arg == "help" and "`" in (ast.get_source_segment(source, kw.value) or "")]
    assert found == []


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0 and main(["-V"]) == 0
    assert capsys.readouterr().out == f"docpilot {version('docpilot')}\n" * 2
    assert version("docpilot") in (ROOT / "pyproject.toml").read_text()  # the editable install is this tree's


def test_batch_and_train_warn_once_when_a_card_sits_idle_beside_a_cpu_venv(tmp_path):
    # a fake nvidia-smi on PATH (the machine's edge), the venv's real record (cpu profile): the real front door
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA L4, 23034, 580.95.05, 8.9'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    if (installed_profile() or {}).get("profile") != "cpu":
        pytest.skip("this venv is not the cpu profile made by `make setup`")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("DOCPILOT_IDLE_CARD_SAID", None)
    for command in ("train", "batch"):
        out = subprocess.run([sys.executable, "-m", "docpilot", command, "--config", str(tmp_path / "none.json")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode != 0  # the config does not exist: the warning came first, once
        assert out.stderr.count("1 x NVIDIA L4 (23034 MiB, compute 8.9) on this machine, but this venv is the cpu "
                                "profile") == 1, out.stderr
    quiet = subprocess.run([sys.executable, "-m", "docpilot", "train", "--config", str(tmp_path / "none.json")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "sits idle" not in quiet.stderr  # no card on PATH: nothing said


def test_a_detach_plan_names_its_after_exit_check_by_an_import_string():
    """The supervisor asks no command's name: a batch's plan names its check of the run folder, training's none."""
    from batch.run.driver import attempt_recorded_by
    from docpilot.cli import _resolve

    batch = _resolve(DETACHABLE["batch"])(["--detach"])
    assert pkgutil.resolve_name(batch.after_exit) is attempt_recorded_by
    assert _resolve(DETACHABLE["train"])(["--detach"]).after_exit is None
