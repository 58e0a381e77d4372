"""The quality report of a labelled run: the tally, ``quality.md`` and its figures.

quality.py  QualityTally, batch_report, write_report
plots.py    write_pictures: the confusion matrix and score figures
"""
