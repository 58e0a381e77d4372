"""The options of one ``docpilot batch`` (:class:`BatchOptions`), apart from the command that reads them.

:mod:`batch.run.driver` parses the command line into them and :class:`batch.run.attempt.BatchRun` runs
with them; keeping them here lets the attempt import them without importing its own command.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class BatchOptions(BaseModel):
    """The options of one ``docpilot batch`` (the command line's, one field per flag; see ``--help``).

    Attributes:
        config: the config JSON.
        corpus: corpus file or folder replacing ``corpus.path``, or ``None``.
        batch_id: the run folder name (an existing one is resumed), or ``None`` for a new one.
        adapter: ``name@version`` / ``name@latest``, or ``None`` for the base model.
        export_dir: parent of the export copy (folder or URL) replacing ``batch.export_dir``, or ``None``.
        cpu_actors: engine actors on a CPU-only cluster replacing ``batch.cpu_actors``, or ``None``.
        skip_pilot_gate: run without a passed pilot (logged and recorded).
        no_progress: no progress bar (``progress.json`` is still written).
        lease_ends: when the lot's lease ends (ISO 8601), or ``None`` to read ``lots_config``.
        lots_config: the lots config holding ``lease_ends_at``.
        detach: run in its own session, detached from the terminal (:mod:`docpilot.detach`).
        stop_when_done: detached only: once the batch succeeded, wrap up (:mod:`batch.lot.wrapup`) and run
            the lease's stop command if every copy verified.
        wrap_up_to: the wrap-up destination for ``stop_when_done`` (default: the export location).
        resume_from: the off-pod copy of a batch, ``<export root>/<batch-id>`` (an object-storage URL), to continue on
            this machine (:func:`batch.run.offpod.restore_run`), or ``None``.
        take_over_export: take the export location over from an owner whose heartbeat is stale (its pod is gone;
            :mod:`batch.run.owner`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str = "config/docpilot.json"
    corpus: str | None = None
    batch_id: str | None = None
    adapter: str | None = None
    export_dir: str | None = None
    cpu_actors: int | None = None
    skip_pilot_gate: bool = False
    no_progress: bool = False
    lease_ends: str | None = None
    lots_config: str | None = "config/lots.json"
    detach: bool = False
    stop_when_done: bool = False
    wrap_up_to: str | None = None
    resume_from: str | None = None
    take_over_export: bool = False
