"""What a caller of :class:`batch.run.attempt.BatchRun` may add to a run (the pilot does), and the stages of a run.

:class:`RunHooks` is told each stage and event; :data:`STAGES` names them in the words a failed pilot reports.
"""

from __future__ import annotations

from typing import Any


class RunHooks:
    """What a caller of :class:`batch.run.attempt.BatchRun` may add without a second pipeline (the pilot does).

    Every method is a no-op here; :class:`batch.pilot.run.PilotHooks` overrides them.
    """

    mirror_progress = True
    """Mirror ``progress.json`` beside the export copy (``<export root>/<id>.progress.json``) while the run goes;
    a pilot (minutes, 12 documents) sets it off and leaves only its export copy there."""

    def stage(self, name: str) -> None:
        """The run enters stage ``name`` (:data:`STAGES`): a failure from here on is this stage's."""

    def pool_starting(self, device: str, tp: int, place_timeout_s: float) -> None:
        """The pool is about to place its engine actors (``tp`` GPUs each when ``device`` is not ``cpu``; Ray is
        joined); waiting up to ``place_timeout_s`` for a placement is allowed; raising fails ``start-pool``."""

    def actor_ready(self, info: dict[str, Any]) -> None:
        """An engine actor started (``info`` is :meth:`batch.pool.actor.EngineActor.info`)."""

    def shard_written(self, index: int, n_docs: int) -> None:
        """Shard ``index`` (``n_docs`` documents) was written, its engine actors still running."""

    def summarize(self, summary: dict[str, Any]) -> None:
        """Add to the merged run's summary (in place) before ``summary.json`` is written and the run exported."""


STAGES = ("doctor", "read-inputs", "plan", "start-pool", "load-model", "load-adapter", "classify", "write", "merge",
          "export", "verify")
"""The stages of one run, in the words a failed pilot reports (``stage_reached``); the pilot adds ``doctor``."""
