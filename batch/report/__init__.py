"""The quality report of a labelled run: the tally, ``quality.md`` and its figures.

quality.py  QualityTally, batch_report, write_report
plots.py    write_pictures: the confusion matrix and score figures
"""

from batch import public_face

_PUBLIC = {
    "QualityTally": "quality",
    "batch_report": "quality",
    "write_report": "quality",
    "write_pictures": "plots",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_face(__name__, _PUBLIC)
