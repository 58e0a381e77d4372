"""Batch: the corpus, the Ray pool, a run and its files, the pilot, the end of a lot, the lease, reports and the lot plan.

Rooms, by floor: a module imports its own room, rooms of its floor without a loop, and lower floors (``tests/unit/project/test_rooms.py``
checks it, that there is no import circle, and that each room's ``__init__`` names its files).

floor 0
runfiles.py  Manifest, Shard, ProgressFile: ``manifest.json`` (and its shard plan) and ``progress.json`` as pydantic models
layout.py    the run folder: file names (manifest.json, progress.json, shards/, results.*) and their readers
rows.py      result rows as Arrow tables: the results schema, the one columnar reader and row matcher
floor 1
corpus/      the corpus plan, format readers (CSV and Parquet: tabular.py), shard bytes, duplicate ids, labels
plan/        ``docpilot plan``: the lot order summary, per-card memory fit and the lots file (lease end, stop command)
floor 2
pool/        the Ray pool: engine actors and the shard scheduler
report/      the quality report of a labelled run
lease/       the lease: its clock (when it ends, whether the batch fits) and its stop command
floor 3
run/         ``docpilot batch``: driver, attempt, manifest, merge, the export, submit
floor 4
lot/         the end of a lot: ``docpilot status`` from another shell, ``docpilot wrap-up``
pilot/       ``docpilot pilot``: a 12-document batch, its doctor and its decision

``make pilot`` (:mod:`batch.pilot.run`) proves the path on 12 documents; ``make batch`` runs the
full corpus over Ray engine actors, resumable by manifest; ``make plan`` sizes the lots.
"""
