"""The two JSON files of a batch run folder that several modules read: ``manifest.json`` and ``progress.json``.

Both are pydantic models over the same JSON as before: a file is read with
:meth:`Manifest.read` / :meth:`ProgressFile.read` and written with ``write``; the JSON holds
exactly the keys that were read or set (``exclude_unset``), fields a later docpilot adds are
kept (``extra="allow"``), and keys are sorted (:func:`classify.runs.records.write_json_atomic`).
The shard plan is a list of :class:`Shard` (made by :func:`batch.corpus.plan.plan_corpus`, read by the
run, the merge and ``status``); it lives here, beside the manifest that stores it, because every floor
above reads it. Nested parts whose layout belongs to another module (the corpus description, the config
sections, each attempt record) stay JSON objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from classify.errors import InputError
from classify.runs.records import write_json_atomic

MANIFEST_VERSION = 2
"""The run folder layout this docpilot writes and reads (``shards/GGG/NNNNNN.jsonl``, a corpus plan read in streams)."""


class EarlierRunFolder(InputError):
    """A run folder written by an earlier docpilot (``manifest_version`` below :data:`MANIFEST_VERSION`): not read.

    Attributes:
        batch_id: the batch named in its manifest (``None`` when it names none).
        version: its ``manifest_version`` (1 when the field is absent).
    """

    def __init__(self, message: str, batch_id: str | None, version: int):
        super().__init__(message)
        self.batch_id, self.version = batch_id, version


def earlier_run_folder(batch_id: str | None, version: int, doing: str = "read") -> EarlierRunFolder:
    """The one refusal of a run folder of an earlier layout (resume, ``docpilot status``, the export re-check).

    Args:
        batch_id: the batch (run folder name), or ``None`` when the manifest does not say.
        version: its ``manifest_version`` (1 when the field is absent: the first layout).
        doing: what is refused, a verb (``"resume"``, ``"read"``).

    Returns:
        The error to raise, naming the batch, both layouts and what to do instead.
    """
    what = f"batch {batch_id}" if batch_id else "this run folder"
    return EarlierRunFolder(
        f"{what} was made by an earlier docpilot (run folder manifest_version {version}, "
        f"shards/NNNNN.jsonl over a corpus read whole); this version plans and reads corpora in streams "
        f"(manifest_version {MANIFEST_VERSION}) and cannot {doing} it. Use the docpilot that made it "
        "(its complete shards stay in the folder), or start a new batch id", batch_id, version)


class _RunFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    @classmethod
    def of(cls, data: Any) -> Any:
        """``data`` as this model: an instance as is, a JSON object validated."""
        return data if isinstance(data, cls) else cls.model_validate(data)

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to disk: the keys read or set, and unknown keys kept."""
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: Path) -> None:
        """Write the file atomically (indented, keys sorted)."""
        write_json_atomic(path, self.to_json())


class Shard(_RunFile):
    """One planned shard of ``manifest.json``: where its rows are in the corpus, how many, and which ids.

    The JSON holds the keys a plan sets and no others (a missing key stays missing when the manifest is
    written back): ``offset``/``end``/``bytes_sha256`` only for JSONL and CSV, ``files`` only for a
    folder, ``dups``/``skip`` only for a shard with duplicated ids.

    Attributes:
        index: the shard's position in the plan (its file is :func:`batch.layout.shard_path` of it).
        n_docs: distinct ids in the shard (its result rows), after duplicate folding.
        ids_sha256: :func:`classify.runs.files.ids_sha256` of those ids, in order (a shard file must match it).
        first_id, last_id: its first and last id (for messages).
        row: the key of its first row: JSONL line number (from 1), CSV/Parquet row index or folder file index (from 0).
        n_rows: rows (lines, records, files) it spans, duplicates included.
        bytes: the size of its documents' text in bytes (the plan's cut; the corpus's ``bytes``).
        offset, end: JSONL and CSV: its byte range in the corpus file (whole lines or records).
        bytes_sha256: JSONL and CSV: sha256 hex of that byte range (absent in plans made before the check).
        files: a folder: its files, relative to the folder.
        dups: row key (as a string) -> reject reason of a duplicated id's first occurrence.
        skip: row keys left out: later occurrences of a duplicated id.
    """

    index: int
    n_docs: int
    ids_sha256: str | None = None
    first_id: str | None = None
    last_id: str | None = None
    row: int = 0
    n_rows: int = 0
    bytes: int = 0
    offset: int | None = None
    end: int | None = None
    bytes_sha256: str | None = None
    files: list[str] | None = None
    dups: dict[str, str] = {}
    skip: list[int] = []

    def fold_first(self, key: int, reason: str) -> None:
        """Reject the row ``key`` (a duplicated id's first occurrence) with ``reason``."""
        if "dups" not in self.model_fields_set:
            self.dups = {}
        self.dups[str(key)] = reason

    def fold_later(self, key: int) -> None:
        """Leave the row ``key`` out (a later occurrence of a duplicated id)."""
        if "skip" not in self.model_fields_set:
            self.skip = []
        self.skip.append(key)


class Manifest(_RunFile):
    """``manifest.json``: what a batch is (resume keys, shard plan, provenance) and one record per attempt.

    Attributes:
        manifest_version: the run folder layout, :data:`MANIFEST_VERSION` (absent in the first layout, which
            is refused: :func:`earlier_run_folder`).
        batch_id: the run folder's name.
        created_at: UTC ISO 8601.
        corpus: :meth:`batch.corpus.plan.CorpusPlan.describe` (``path``, ``format``, ``input_rows``,
            ``distinct_ids``, ``duplicate_rows``, ``fingerprint``, ...).
        corpus_fingerprint, config_sha256, model_fingerprint, adapter_sha256: the resume keys
            (a batch id resumes only while all four are unchanged).
        config: the config sections that decide results (:func:`classify.config.batch.results_config`).
        full_config: the whole batch config.
        model: ``{name, path, source}`` of the base model.
        adapter: ``name@version`` or ``None``; ``adapter_mode``, ``merged_model``: how engines ran it.
        pilot_gate: the gate record (``key``, ``passed``, ``override``, ``pilot_run_id``, ``checked_at``).
        shard_docs, shard_target_bytes: the plan's limits.
        shards: the shard plan, one :class:`Shard` per shard.
        code, packages: provenance.
        attempts: one object per attempt (``started_at``, ``pid``, ``host``, then ``finished_at`` or
            ``failed_at`` and ``error``), appended by the driver.
    """

    manifest_version: int | None = None
    batch_id: str | None = None
    created_at: str | None = None
    corpus: dict[str, Any] = {}
    corpus_fingerprint: str | None = None
    config: dict[str, Any] = {}
    config_sha256: str | None = None
    full_config: dict[str, Any] | None = None
    model: dict[str, Any] = {}
    model_fingerprint: str | None = None
    adapter: str | None = None
    adapter_sha256: str | None = None
    adapter_mode: str | None = None
    merged_model: dict[str, Any] | None = None
    pilot_gate: dict[str, Any] = {}
    shard_docs: int | None = None
    shard_target_bytes: int | None = None
    shards: list[Shard] = []
    code: dict[str, Any] | None = None
    packages: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = []

    @model_validator(mode="after")
    def _current_layout(self) -> Manifest:
        """Refuse a manifest of an earlier layout (:class:`EarlierRunFolder`, raised as is: not a ``ValueError``)."""
        version = int(self.manifest_version or 1)
        if version < MANIFEST_VERSION:
            raise earlier_run_folder(self.batch_id, version)
        return self

    @property
    def version(self) -> int:
        """The run folder layout (:data:`MANIFEST_VERSION` or later: an earlier one does not validate)."""
        return int(self.manifest_version or 1)

    @property
    def categories(self) -> list[str]:
        """The allowed categories of the batch's ``classify`` section."""
        return list(self.config["classify"]["categories"])

    def add_attempt(self, attempt: dict[str, Any]) -> None:
        """Append an attempt record (kept by reference: update it in place, then :meth:`write` again)."""
        self.attempts = [*self.attempts, attempt]

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest at ``path``, or ``None`` when there is no file.

        Raises:
            InputError: a damaged file (not JSON, not an object, or fields of the wrong type), named.
            EarlierRunFolder: a manifest of an earlier layout (:func:`earlier_run_folder`).
        """
        if not path.is_file():
            return None
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
            errors = getattr(err, "errors", None)
            first = (f"`{'.'.join(map(str, errors()[0]['loc'])) or '(root)'}`: {errors()[0]['msg']}" if errors
                     else str(err).splitlines()[0])
            raise InputError(f"{path} is damaged ({first}); it is the run's plan and cannot be rebuilt from it: "
                             "start the batch under a new --batch-id (the shard files of this folder are not reused)") from err


class ProgressFile(_RunFile):
    """``progress.json``: one attempt's counts, rate and state, rewritten by the driver (:class:`batch.run.progress.Progress`).

    Attributes:
        batch_id: the batch.
        state: ``starting``, ``running``, ``done`` or ``failed`` (``not started`` when there is no file).
        total: distinct ids in the corpus; done, accepted, rejected: ids in complete shards.
        processed_this_attempt: ids classified by this attempt.
        docs_per_s: this attempt's rate (engine start included); eta_s: seconds left at the steady rate once
            known, else at ``docs_per_s`` (``None``: unknown).
        steady_docs_per_s, steady_tokens_per_s: documents and prompt tokens per second from this attempt's first
            complete shard to its latest (``None`` before a second shard): the rate to size a lease by.
        elapsed_s: seconds since the attempt started running.
        retries: shard retries; last_error: the latest error text.
        actors: one object per engine actor (``slot``, ``pid``, ``node``, ``procs``, ...).
        pid, host: the driver process; pid_started, boot_id: its start time and boot
            (:func:`classify.runs.detached.process_identity`), so a reused pid or a reboot is not taken for it.
        started_at, updated_at: UTC ISO 8601.
        lease: the latest lease verdict (:class:`batch.lease.clock.LeaseWatch`), or ``None``.
        offpod: the copy of complete shards off the pod (:meth:`batch.run.offpod.ShardUploader.lag`: shards
            copied, shards waiting and the oldest one's age in seconds, failures), or ``None`` without one.
    """

    batch_id: str | None = None
    state: str | None = "not started"
    total: int | None = None
    done: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    processed_this_attempt: int | None = None
    docs_per_s: int | float | None = None  # int | float: a number is written back as it was read
    eta_s: int | float | None = None  # int | float: a number is written back as it was read
    steady_docs_per_s: int | float | None = None
    steady_tokens_per_s: int | float | None = None
    elapsed_s: int | float | None = None  # int | float: a number is written back as it was read
    retries: int | None = 0
    last_error: str | None = None
    actors: list[dict[str, Any]] | None = []
    pid: int | None = None
    host: str | None = None
    pid_started: float | None = None
    boot_id: str | None = None
    started_at: str | None = None
    updated_at: str | None = None
    lease: dict[str, Any] | None = None
    offpod: dict[str, Any] | None = None

    @classmethod
    def read(cls, path: Path) -> ProgressFile:
        """The file at ``path``; an empty record (state ``not started``) when there is none.

        Raises:
            json.JSONDecodeError, pydantic.ValidationError: a damaged file.
        """
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else cls()

    @classmethod
    def read_or_none(cls, path: Path) -> ProgressFile | None:
        """Like :meth:`read`, but ``None`` for a missing, unreadable or damaged file."""
        try:
            return cls.read(path) if path.is_file() else None
        except (OSError, ValueError):  # json.JSONDecodeError and pydantic.ValidationError are ValueErrors
            return None


