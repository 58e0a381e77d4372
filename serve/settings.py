"""Server settings: command-line options over ``DOCPILOT_*`` environment variables (pydantic-settings).

:class:`ServeSettings` is the single source of ``docpilot serve``'s command line: each field is a
flag (``--max-documents``), its description is the flag's help, and its ``DOCPILOT_*`` variable is
shown there too (:mod:`serve.cli` builds the parser from the class with pydantic-settings).
The bearer token comes only from the environment (``DOCPILOT_API_TOKEN``), never from a
config file or the command line, so it stays out of shell history and ``ps``. The server
refuses to start without one, or with a known placeholder, unless ``--insecure-no-auth``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, CliSuppress, SettingsConfigDict, SettingsError

from classify.config import format_validation_error
from classify.errors import ConfigError

UNSAFE_TOKENS = frozenset({"changeme", "changethis", "secret", "token", "password", "test", "admin"})
"""Placeholder tokens refused by name (the FastAPI full-stack template's habit)."""

MIN_TOKEN_CHARS = 16


class ServeSettings(BaseSettings):
    """Everything the server needs besides the pilot config file.

    Attributes:
        api_token: bearer token clients must send (env ``DOCPILOT_API_TOKEN``; at least 16 characters).
        insecure_no_auth: serve without authentication (logged loudly; for loopback experiments only).
        host: interface to bind.
        port: TCP port to bind.
        config_path: the pilot config (model, engine, classify sections) the server runs with.
        base_model: overrides ``model.base_model`` from the config (alias, folder or HF id).
        adapters: ``name@version`` refs verified and loaded at start-up (others load on first use).
        max_documents: most documents one ``/v1/classify`` request may hold (more: 413).
        max_doc_bytes: most UTF-8 bytes per document text (more: 413); ``None`` = the config's
            ``classify.max_doc_bytes``.
        max_request_bytes: most bytes in one request body (more: 413, checked before parsing).
        skip_pilot_gate: the pilot-gate override: serve adapters and a base model that have not
            passed a pilot (every such request is logged as a warning).
        graceful_timeout_s: seconds in-flight requests get to finish after SIGTERM.
        engine_failure_exit_delay_s: seconds the server keeps answering 503 (``/healthz``, ``/readyz``,
            every request) after the engine failed to load or died, before it exits with status 5 so
            its supervisor restarts it; long enough for a probe or load balancer to see the failure.
        log_level: uvicorn's log level (``debug``, ``info``, ``warning``, ``error``).

    Each field but ``api_token`` is also a ``docpilot serve`` flag (``--max-doc-bytes``; ``config_path``,
    ``base_model`` and ``adapters`` are ``--config``, ``--model`` and the repeatable ``--adapter``).
    """

    model_config = SettingsConfigDict(
        env_prefix="DOCPILOT_", extra="forbid", frozen=True,
        # the command line (serve.cli): --kebab-case flags, bools as plain switches, the documented short names
        cli_kebab_case=True, cli_implicit_flags="toggle", cli_show_env_vars=True, cli_hide_none_type=True,
        cli_shortcuts={"config-path": "config", "base-model": "model", "adapters": "adapter"},
    )

    api_token: CliSuppress[SecretStr | None] = None
    insecure_no_auth: bool = Field(False, description="serve WITHOUT the bearer token (logged; loopback experiments only)")
    host: str = Field("127.0.0.1", min_length=1, description="interface to bind")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    config_path: Path = Field(Path("config/docpilot.json"), description="config JSON (its model, engine and classify sections)")
    base_model: str | None = Field(
        None, description="override model.base_model (alias, local folder or HF id); null: the config's")
    adapters: tuple[str, ...] = Field(
        (), description="verify and load this registry adapter at start-up (repeatable); others load on first use")
    max_documents: int = Field(64, ge=1, le=10_000, description="documents per request")
    max_doc_bytes: int | None = Field(
        None, ge=1, le=100_000_000, description="bytes per document; null: the config's classify.max_doc_bytes")
    max_request_bytes: int = Field(16 * 2**20, ge=1024, le=2**31, description="bytes per request body")
    skip_pilot_gate: bool = Field(
        False, description="serve adapters / a base model without a passed pilot (every use is logged as a warning)")
    graceful_timeout_s: float = Field(30.0, gt=0, le=3600, description="seconds in-flight requests get after SIGTERM")
    engine_failure_exit_delay_s: float = Field(
        5.0, ge=0, le=600,
        description="seconds the server answers 503 after its engine failed or died, before it exits with status 5")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="uvicorn's log level")

    @model_validator(mode="after")
    def _check_token(self) -> ServeSettings:
        token = self.api_token.get_secret_value() if self.api_token else ""
        if self.insecure_no_auth:
            return self
        if not token:
            raise ConfigError(
                "DOCPILOT_API_TOKEN must be set to the bearer token clients send "
                "(e.g. `export DOCPILOT_API_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`), "
                "got nothing; or start with --insecure-no-auth for a loopback-only experiment"
            )
        if token.lower() in UNSAFE_TOKENS or len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"DOCPILOT_API_TOKEN must be at least {MIN_TOKEN_CHARS} characters and not a placeholder "
                f"({', '.join(sorted(UNSAFE_TOKENS))}), got a {len(token)}-character token"
            )
        return self


def load_settings(**overrides: object) -> ServeSettings:
    """Build :class:`ServeSettings` from the environment with command-line ``overrides`` on top.

    Args:
        **overrides: field values from the command line (``None`` values are dropped).

    Returns:
        The frozen settings.

    Raises:
        ConfigError: a missing or unsafe token, or a field out of bounds (names the field and value).
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ServeSettings(**given)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "serve settings")) from None
    except SettingsError as err:  # a DOCPILOT_* variable that is not parseable at all, e.g. DOCPILOT_ADAPTERS=a@1 (not JSON)
        raise ConfigError(f"serve settings: {err} (a list variable takes JSON: DOCPILOT_ADAPTERS='[\"name@1\"]')") from None
