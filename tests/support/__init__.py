"""Helpers shared by the test tiers (``tests/unit``, ``tests/engine``, ``tests/ray``, ``tests/slow``).

Test modules import from here, never from one another. ``ROOT`` is the repository root.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
