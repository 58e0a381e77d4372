"""The batch's view of the config file: the shared model/engine/classify sections plus ``corpus`` and ``batch``.

Read from the one ``config/docpilot.json`` (:mod:`classify.config.file`), so the ``model`` and
``classify`` sections are the pilot's and the pilot gate key
(:func:`classify.config.sections.classification_sha256`) matches the pilot that cleared the combination.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from classify.config.sections import (
    ClassifyConfig,
    CommandConfig,
    EngineConfig,
    Frozen,
    ModelConfig,
    canonical_json,
    load_config,
)
from classify.errors import InputError
from classify.paths import DataPath, configured_path, expand_location
from classify.usercommand import user_flag


class CorpusConfig(Frozen):
    """Where the corpus is and how to read it.

    Attributes:
        path: a ``.jsonl`` file (``id`` plus ``text`` or ``path``), a ``.csv`` file, or a folder of
            files (id = relative path); ``${VAR}`` and ``${VAR:-default}`` are expanded from the
            environment (:func:`classify.paths.expand_path`), relative paths are taken from the
            current directory. ``--corpus`` replaces it; ``null`` (the default): ``--corpus`` is needed.
        format: ``auto`` (by suffix: ``.jsonl``/``.csv``/``.parquet``/folder), ``jsonl``, ``csv``,
            ``parquet`` or ``dir``.
        text_column: CSV and Parquet: the column holding the text.
        id_column: CSV and Parquet: the column holding the id (``docpilot batch`` refuses a header without
            it); ``null`` gives generated ids ``<id_prefix>-<row index, 4 digits>``, stable across runs.
        id_prefix: CSV and Parquet: prefix of generated ids (default: the file's stem).
        label_column: the expected category of each document, for the quality report (accuracy,
            confusion matrix): a CSV/Parquet column or a JSONL key; a corpus without it is
            unlabelled (no accuracy). ``null``: never read labels. Labels never change answers.
    """

    path: DataPath = None
    format: Literal["auto", "jsonl", "csv", "parquet", "dir"] = "auto"
    text_column: str = Field("text", min_length=1)
    id_column: str | None = None
    id_prefix: str | None = Field(None, min_length=1, max_length=100)
    label_column: str | None = Field("category", min_length=1)

    def resolved_path(self) -> Path:
        """``path`` with its ``${VAR}``/``${VAR:-default}`` and ``~`` expanded (still relative when ``path`` is).

        Raises:
            InputError: ``path`` is not set (``null``): the corpus must come from ``--corpus``.
            ConfigError: a malformed ``${`` (a config built without validation).
        """
        return configured_path(self.path, f"no corpus: set `corpus.path` in the config or pass {user_flag('--corpus', 'PATH')}")

    def resolved_location(self) -> str | Path:
        """As :meth:`resolved_path`, but an object-storage URL (``s3://bucket/key``) stays a string (``${VAR}`` expanded).

        Raises:
            InputError, ConfigError: as :meth:`resolved_path`.
        """
        if self.path is None:
            return self.resolved_path()  # raises, saying what to set
        return expand_location(self.path)


class RunConfig(Frozen):
    """Sharding, actor pool and output settings.

    Attributes:
        shard_docs: at most this many documents per shard (the shard is the unit of work, retry and resume).
        shard_target_bytes: a shard closes once its documents hold this many bytes (text or file
            bytes as read): shards are sized by content, so a shard is minutes of engine work at
            most whatever the document lengths. 4 MiB is about 1,000-2,000 news articles.
        cpu_actors: engine actors to start on a machine without GPUs (on GPUs: one per GPU).
        actor_num_cpus: Ray CPUs each CPU engine actor reserves; ``cpu_actors x actor_num_cpus``
            must fit the cluster's CPUs or the extra actors wait forever.
        cpu_bind: ``"split"`` (default): with 2 or more CPU actors on a local Ray, each actor's vLLM
            compute threads get their own cores (``VLLM_CPU_OMP_THREADS_BIND`` per actor,
            :func:`batch.pool.placement.cpu_core_groups`); ``"auto"``: vLLM's own binding in every actor,
            which puts all engines of one machine on the same cores. Ignored on GPUs, with
            ``RAY_ADDRESS`` (a cluster) and when ``VLLM_CPU_OMP_THREADS_BIND`` is set.
        max_shard_retries: times one shard is re-run on a fresh actor after its actor died, its
            engine died or hung, or its task failed, before the batch stops with the first error.
        shard_timeout_base_s: seconds a shard may run on a started engine, plus
            ``shard_timeout_per_doc_s`` per document of the shard; past that bound the engine counts
            as stuck: the actor is killed and the shard retried whole on a fresh one.
        shard_timeout_per_doc_s: seconds per document added to the shard bound (the default is
            about 10x the slowest CPU rate measured here, ~1 doc/s per engine).
        actor_start_timeout_s: seconds an engine actor may take to start (weights load, warm-up)
            before it counts as stuck and is replaced.
        actor_place_timeout_s: seconds an engine actor may wait for a node with the free resources
            it asks for (e.g. the replacement of an actor whose node was lost) before its slot is
            dropped and the other actors finish the batch; only while another slot has a placed actor.
        export_dir: parent folder of the export copy (``null``: ``exports/``, ``DOCPILOT_EXPORTS``);
            the copy is ``<export_dir>/<batch-id>/``.
    """

    shard_docs: int = Field(1000, ge=1, le=1_000_000)
    shard_target_bytes: int = Field(4 * 1024**2, ge=1, le=1024**3)
    cpu_actors: int = Field(1, ge=1, le=256)
    actor_num_cpus: float = Field(1.0, gt=0, le=1024)
    cpu_bind: Literal["split", "auto"] = "split"
    max_shard_retries: int = Field(2, ge=0, le=20)
    shard_timeout_base_s: float = Field(120.0, gt=0, le=86_400)
    shard_timeout_per_doc_s: float = Field(10.0, ge=0, le=3_600)
    actor_start_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    actor_place_timeout_s: float = Field(120.0, gt=0, le=86_400)
    export_dir: str | None = None


class BatchConfig(CommandConfig):
    """The batch's view of the config file: everything ``make batch`` needs.

    Its own fields are the file's top-level ``corpus`` and ``batch`` sections (``file_section`` is
    ``None``), so a file with only the shared sections, ``corpus`` and ``batch`` (the old
    ``config/docpilot.json``) is a valid config file as it is.
    """

    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    classify: ClassifyConfig = ClassifyConfig()
    corpus: CorpusConfig = CorpusConfig()
    batch: RunConfig = RunConfig()


def load_batch_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BatchConfig:
    """Read and validate the batch's view of a config file (``config/docpilot.json``).

    Args:
        path: the JSON file.
        overrides: dotted keys to set after reading, e.g. ``{"corpus.path": "/data/c.jsonl"}``.

    Returns:
        The frozen :class:`BatchConfig`.

    Raises:
        ConfigError: missing file, invalid JSON, or an invalid or unknown field.
    """
    return load_config(BatchConfig, path, overrides)


def results_config(cfg: BatchConfig) -> dict[str, Any]:
    """The part of the config that decides a batch's results and shard plan.

    Resuming a batch requires this to be unchanged. Engine sizing, actor counts, retries and the
    export folder do not change any answer and may differ between attempts; the corpus path
    does not either (the corpus fingerprint covers the content), nor does ``corpus.label_column``
    (labels add to the report only). ``classify.review_below_score`` counts only when set.

    Args:
        cfg: the batch config.

    Returns:
        A JSON-able dict with ``model``, ``classify``, ``corpus`` (reading options), ``shard_docs`` and
        ``shard_target_bytes`` (the shard plan depends on both).
    """
    return {
        "model": cfg.model.model_dump(mode="json"),
        # review_below_score only when set: rows then carry `review` (a changed threshold refuses the
        # resume), while manifests written before the field existed keep their config_sha256
        "classify": cfg.classify.model_dump(mode="json", exclude=set() if cfg.classify.review_below_score
                                            else {"review_below_score"}),
        "corpus": cfg.corpus.model_dump(mode="json", exclude={"path", "label_column"}),
        "shard_docs": cfg.batch.shard_docs,
        "shard_target_bytes": cfg.batch.shard_target_bytes,
    }


def results_config_sha256(cfg: BatchConfig) -> str:
    """sha256 of :func:`results_config` (canonical JSON), the manifest's ``config_sha256``."""
    return hashlib.sha256(canonical_json(results_config(cfg)).encode()).hexdigest()


BATCH_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A batch id: a plain folder name under the runs folder."""


def check_batch_id(batch_id: str | None) -> None:
    """Refuse a ``--batch-id`` that is not a plain folder name (before anything loads or starts).

    Raises:
        InputError: ``batch_id`` does not match :data:`BATCH_ID_RE` (``../x``, ``a/b``, empty, over 128 characters).
    """
    if batch_id is not None and not BATCH_ID_RE.match(batch_id):
        raise InputError(f"`--batch-id` must match {BATCH_ID_RE.pattern} (a folder name under the runs folder), got {batch_id!r}")
