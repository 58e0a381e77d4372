"""The one docpilot exception hierarchy, mapped once to CLI exit codes and HTTP statuses.

User-input and configuration problems (fix what you gave) are kept apart from
environment and engine problems (fix the machine), as Ray Data does in
``ray/data/exceptions.py``.
"""

from __future__ import annotations


class DocpilotError(Exception):
    """Base class of every error docpilot raises on purpose.

    Attributes:
        exit_code: process exit status the CLI uses for this error.
        http_status: HTTP status ``serve/`` answers with.
        kind: short machine-readable name (used in JSON error bodies and metrics).
    """

    exit_code = 1
    http_status = 500
    kind = "internal"


class ConfigError(DocpilotError):
    """A configuration file or option is invalid (names the field, the value and what is allowed)."""

    exit_code = 2
    http_status = 422
    kind = "config"


class InputError(DocpilotError):
    """The input documents or labels cannot be used as given (missing path, wrong count, duplicate ids...)."""

    exit_code = 3
    http_status = 422
    kind = "input"


class PayloadTooLarge(InputError):
    """A request or document exceeds a configured size or count limit."""

    http_status = 413
    kind = "too_large"


class AdapterError(DocpilotError):
    """An adapter cannot be resolved, verified or published."""

    exit_code = 4
    http_status = 400
    kind = "adapter"


class AdapterNotFound(AdapterError):
    """No adapter of that name or version exists in the registry."""

    http_status = 404
    kind = "adapter_not_found"


class AdapterIntegrityError(AdapterError):
    """An adapter file's sha256 or its base-model fingerprint does not match its card."""

    http_status = 409
    kind = "adapter_integrity"


class AdapterIncompatible(AdapterError):
    """The engine's LoRA support cannot apply the adapter (rank over ``engine.max_lora_rank``, DoRA, saved modules...).

    Raised by :func:`adapters.registry.compat.check_engine_compat` before vLLM sees the adapter: vLLM refuses
    such an adapter only inside the engine, which kills the engine for every client.
    """

    http_status = 422
    kind = "adapter_incompatible"


class PilotGateError(DocpilotError):
    """The (base model, adapter, config) combination has not passed a pilot."""

    exit_code = 7
    http_status = 409
    kind = "not_piloted"


class EngineError(DocpilotError):
    """The model or the vLLM engine could not be loaded or failed while running."""

    exit_code = 5
    http_status = 503
    kind = "engine"


class ModelIntegrityError(EngineError):
    """A base model's weight file does not match the fingerprint it was verified under (altered, truncated, missing).

    Raised by :func:`classify.model.model.verify_model` before a pilot, a batch or a server start; the message names the file.
    """

    kind = "model_integrity"


class EnvironmentCheckError(DocpilotError):
    """The doctor found a blocker (no working compute, too little memory or disk...)."""

    exit_code = 6
    http_status = 503
    kind = "environment"


class StoreUnreachable(EnvironmentCheckError, OSError):
    """An object store (``s3://...``) did not answer a call within its deadline and retry budget (:mod:`classify.runs.storage`).

    Also an ``OSError``, so code that already treats a failed store call as an I/O error (the progress mirror, the
    remote status) keeps doing so; uncaught it is exit 6 with the message, never a hang.
    """

    kind = "store_unreachable"


class VerificationError(DocpilotError):
    """An exported copy failed its re-check (hash mismatch, broken invariant)."""

    exit_code = 8
    http_status = 500
    kind = "verification"


class OffPodPending(DocpilotError):
    """A batch's work is done on this machine but its copy off the pod did not finish within the store deadline
    (``DOCPILOT_STORE_DEADLINE_S``, :func:`classify.runs.storage.store_deadline_s`): the run folder is complete, the
    message gives the command that finishes the copy later."""

    exit_code = 9
    http_status = 503
    kind = "offpod_pending"


class Interrupted(DocpilotError):
    """The run was stopped by SIGTERM or SIGINT (:func:`classify.runs.records.signals_raise_interrupted`)."""

    exit_code = 130
    http_status = 503
    kind = "interrupted"
