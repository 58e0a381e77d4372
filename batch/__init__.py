"""Batch: the corpus, the Ray pool, a run and its files, the pilot, reports and the lot plan.

Rooms (each ``__init__`` names its public face; a room imports only from rooms above it in this list):

config.py   BatchConfig, RunConfig, CorpusConfig: the user-facing ``corpus`` and ``batch`` config sections
layout.py   the run folder: file names (manifest.json, progress.json, shards/, results.*) and their readers
corpus/     the corpus plan, format readers, shard bytes, duplicate ids, labels
pool/       the Ray pool: engine actors and the shard scheduler
report/     the quality report of a labelled run
run/        ``docpilot batch``: driver, attempt, manifest, merge, export, status, lease, submit, detach, wrap-up
pilot/      ``docpilot pilot``: a 12-document batch and its decision
plan/       ``docpilot plan``: the lot order summary and per-card memory fit

``make pilot`` (:mod:`batch.pilot`) proves the path on 12 documents; ``make batch`` runs the
full corpus over Ray engine actors, resumable by manifest; ``make plan`` sizes the lots.
"""
