"""A batch run: the command, its attempt, the run folder's files, the merge and the export.

driver.py       run_batch, parse_args, prepare_detach: ``docpilot batch``
options.py      BatchOptions: the options of one batch
attempt.py      BatchRun: one attempt once the run folder is locked (plan, pool, merge, export)
hooks.py        RunHooks, STAGES: what a caller (the pilot) adds to a run, and the stages of a run
adapter.py      resolve_adapter: the adapter a batch runs with, checked against the pilot
manifest.py     build_manifest: a new batch's manifest.json (its model: batch.runfiles.Manifest)
progress.py     the progress bar and log redirection
merge.py        merge_results, Tally: shards -> results.jsonl + results.parquet
export.py       export_batch, check_export, export_partial, export_dest: the copy off the pod and its re-check
resume.py       the resume command of an interrupted batch, in the user's own form
offpod.py       finished shards copied off the pod while the batch runs, and their ledger
owner.py        ExportOwner: one writer per export location (a conditional create, a heartbeat, a take-over)
finish.py       off_pod_within: the end of a batch done here, under the store deadline (exit 9 past it)
mirror.py       the progress mirror to remote storage (written by the attempt and by the wrap-up)
submit.py       ``docpilot submit``: the batch as a Ray job
debris.py       stale temporaries left by a killed run
"""
