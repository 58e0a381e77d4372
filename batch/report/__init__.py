"""The quality report of a labelled run: the tally, ``quality.md`` and its figures.

quality.py  QualityTally, batch_report, write_report
plots.py    write_pictures: the confusion matrix and score figures
"""

_PUBLIC = {
    "QualityTally": "quality",
    "batch_report": "quality",
    "write_report": "quality",
    "write_pictures": "plots",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562), so that importing one module of this room
    does not import the others (the pool's imports start Ray's, the run's start vLLM's)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
