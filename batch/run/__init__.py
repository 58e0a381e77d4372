"""A batch run: the command, its attempt, the run folder's files, the merge and what follows it.

driver.py       run_batch, parse_args: ``docpilot batch``
options.py      BatchOptions: the options of one batch
attempt.py      BatchRun: one attempt once the run folder is locked (plan, pool, merge, export)
adapter.py      resolve_adapter: the adapter a batch runs with, checked against the pilot
manifest.py     build_manifest: a new batch's manifest.json (its model: batch.runfiles.Manifest)
progress.py     the progress bar and log redirection
merge.py        merge_results, check_export, Tally: shards -> results.jsonl + results.parquet, and their re-check
lease.py        lease_check, stop_the_meter: the lease clock and the stop after a verified wrap-up
status.py       batch_status: ``docpilot status`` from another shell
submit.py       ``docpilot submit``: the batch as a Ray job
detach.py       start_detached, detach_train: a batch or training that outlives the SSH session
detached.py     pid_alive, read_exit: what a detached run leaves in its run folder (read by status)
wrapup.py       wrap_up: ``docpilot wrap-up``, copy off the pod, re-check, then stop the lease
mirror.py       the progress mirror to remote storage
debris.py       stale temporaries left by a killed run
disk.py         full-disk errors (an environment failure, exit 6)
"""

from batch import public_face

_PUBLIC = {
    "run_batch": "driver",
    "BatchOptions": "options",
    "parse_args": "driver",
    "BatchRun": "attempt",
    "resolve_adapter": "adapter",
    "build_manifest": "manifest",
    "pid_alive": "detached",
    "merge_results": "merge",
    "check_export": "merge",
    "Tally": "merge",
    "lease_check": "lease",
    "stop_the_meter": "lease",
    "batch_status": "status",
    "start_detached": "detach",
    "detach_train": "detach",
    "wrap_up": "wrapup",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_face(__name__, _PUBLIC)
