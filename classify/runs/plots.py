"""The one way docpilot draws PNGs: matplotlib's Agg backend (no display), one size and resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only; works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG (parent folders created) and close it.

    Args:
        fig: a matplotlib figure.
        path: the PNG file.
        dpi: dots per inch (110: about 700 x 530 pixels at matplotlib's default 6.4 x 4.8 inches).

    Returns:
        The written path.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out
