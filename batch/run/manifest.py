"""A new batch's ``manifest.json`` (:func:`build_manifest`), from the run's config, corpus plan, model and adapter.

The manifest's model (:class:`batch.runfiles.Manifest`) is part of the run-folder contract beside
:mod:`batch.layout`; building one needs the run's own objects, so it lives with the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batch.runfiles import MANIFEST_VERSION, Manifest
from classify.config.batch import BatchConfig, results_config, results_config_sha256
from classify.runs.records import code_revision, package_versions, utc_now

if TYPE_CHECKING:
    from batch.corpus.plan import CorpusPlan
    from batch.run.adapter import BatchAdapter
    from classify.model.model import ModelRef


def build_manifest(batch_id: str, cfg: BatchConfig, corpus: CorpusPlan, model: ModelRef, *,
                   adapter: BatchAdapter | None, gate: dict[str, Any]) -> Manifest:
    """The manifest this invocation would write for a new batch (see :mod:`batch.layout` for the layout).

    Args:
        batch_id: the run folder's name.
        cfg: the batch config.
        corpus: the planned corpus (:func:`batch.corpus.plan.plan_corpus`): its description and shard plan.
        model: the resolved base model.
        adapter: the resolved adapter, or ``None``.
        gate: the pilot-gate record.

    Returns:
        The :class:`~batch.runfiles.Manifest`: the resume keys, the shard plan and provenance.
    """
    return Manifest(
        manifest_version=MANIFEST_VERSION, batch_id=batch_id, created_at=utc_now(),
        corpus=corpus.describe(), corpus_fingerprint=corpus.fingerprint,
        config=results_config(cfg), config_sha256=results_config_sha256(cfg), full_config=cfg.model_dump(mode="json"),
        model={"name": model.name, "path": model.path, "source": model.source}, model_fingerprint=model.fingerprint,
        adapter=adapter.ref if adapter else None, adapter_sha256=adapter.sha256 if adapter else None,
        **(adapter.describe() if adapter else {"adapter_mode": None, "merged_model": None}),
        pilot_gate=gate, shard_docs=cfg.batch.shard_docs, shard_target_bytes=cfg.batch.shard_target_bytes,
        shards=corpus.shards, code=code_revision(), packages=package_versions(), attempts=[],
    )
