"""Altering files in place for the integrity tests: same size, different bytes."""

from __future__ import annotations

from pathlib import Path


def flip_byte(path: Path, at: int) -> None:
    """Invert every bit of the byte at offset ``at`` of ``path`` (the file keeps its size)."""
    with path.open("r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))
