"""Server settings: command-line options over ``DOCPILOT_*`` environment variables (pydantic-settings).

:class:`ServeSettings` is the single source of ``docpilot serve``'s command line: each field is a
flag (``--max-documents``), its description is the flag's help, and its ``DOCPILOT_*`` variable is
shown there too (:mod:`serve.cli` builds the parser from the class with pydantic-settings).
The bearer token comes only from the environment (``DOCPILOT_API_TOKEN``), never from a
config file or the command line, so it stays out of shell history and ``ps``. The server
refuses to start without one unless ``--insecure-no-auth``, and refuses a token no client could
use or that anyone could guess (:func:`token_problem`): shorter than :data:`MIN_TOKEN_CHARS`,
longer than :data:`MAX_TOKEN_CHARS`, any character outside visible ASCII (whitespace, control
characters, non-ASCII, a byte that is not UTF-8), a placeholder, or too few distinct characters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, CliSuppress, SettingsConfigDict, SettingsError

from classify.config.sections import format_validation_error
from classify.errors import ConfigError

UNSAFE_TOKENS = frozenset({
    "changeme", "changethis", "replaceme", "secret", "token", "password", "passwd", "test", "admin", "example",
    "default", "placeholder", "dummy", "your", "my", "api", "bearer", "here", "insert", "put", "todo", "fixme",
    "none", "null", "undefined", "key", "docpilot", "xxx", "abc", "qwerty", "letmein", "123",
})
"""Placeholder words: a token made only of these (any case, any separators, repeated) is refused, e.g.
``changeme``, ``<your-token-here>``, ``secret-secret-secret``, ``DOCPILOT_API_TOKEN`` (the FastAPI
full-stack template's habit of refusing ``changethis``, widened)."""

MIN_TOKEN_CHARS = 16
"""Shortest accepted token (``secrets.token_urlsafe(32)`` gives 43 characters)."""

MAX_TOKEN_CHARS = 512
"""Longest accepted token; the server refuses an ``Authorization`` header longer than this plus ``Bearer ``."""

MIN_DISTINCT_TOKEN_CHARS = 6
"""Fewest distinct characters in an accepted token (``aaaa...``, ``abab...``, ``1234512345...`` are refused)."""

_PLACEHOLDER_RE = re.compile("(?:" + "|".join(sorted(map(re.escape, UNSAFE_TOKENS), key=len, reverse=True)) + ")+")
_TEMPLATE_RE = re.compile(r"^\s*(<.*>|\$\{.*\}|\{\{.*\}\}|%.*%|\$[A-Za-z_]+)\s*$")


def token_problem(token: str) -> str | None:
    """Why nobody could (or everybody could) use ``token`` as the bearer token; ``None`` when it is fine.

    The message never repeats the token: it names the rule, the length and at most the position
    and code point of an offending character.

    Args:
        token: the ``DOCPILOT_API_TOKEN`` value as the process sees it (a byte that is not UTF-8 arrives
            as a lone surrogate, Python's ``surrogateescape``).

    Returns:
        The problem in words, or ``None``.
    """
    if not token.strip():
        return f"is only whitespace ({len(token)} characters)"
    for i, ch in enumerate(token):
        if not "\x21" <= ch <= "\x7e":
            if 0xDC80 <= ord(ch) <= 0xDCFF:
                what = f"a byte that is not UTF-8 (0x{ord(ch) - 0xDC00:02x})"
            elif ch.isspace():
                what = f"whitespace (U+{ord(ch):04X})"
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                what = f"a control character (U+{ord(ch):04X})"
            else:
                what = f"the non-ASCII character U+{ord(ch):04X}"
            return (f"has {what} at position {i}; a bearer token must be visible ASCII (letters, digits and "
                    "punctuation, no spaces), which every HTTP client can send")
    letters = re.sub(r"[^a-z]", "", token.lower())  # "Password-123456!" -> "password"
    if (_TEMPLATE_RE.match(token) or _PLACEHOLDER_RE.fullmatch(re.sub(r"[^a-z0-9]", "", token.lower()) or "x")
            or (len(letters) >= 4 and _PLACEHOLDER_RE.fullmatch(letters))):
        return "is a placeholder, not a secret"
    if len(token) < MIN_TOKEN_CHARS:
        return f"is {len(token)} characters, under the minimum of {MIN_TOKEN_CHARS}"
    if len(token) > MAX_TOKEN_CHARS:
        return f"is {len(token)} characters, over the maximum of {MAX_TOKEN_CHARS}"
    if len(set(token)) < MIN_DISTINCT_TOKEN_CHARS:
        return (f"has only {len(set(token))} distinct characters (a repeated character or short pattern; "
                f"at least {MIN_DISTINCT_TOKEN_CHARS} needed)")
    return None


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
        max_request_bytes: most bytes in one request body (more: 413, checked while the body streams in,
            before parsing).
        max_in_flight_documents: most documents admitted to the engine at once, over all requests; a
            request that would go over it is answered 429 with ``Retry-After`` at once (at least
            ``max_documents``).
        max_header_bytes: most bytes of request line plus headers (uvicorn's ``h11_max_incomplete_event_size``;
            more: 400 and the connection is closed before the headers reach the app).
        max_connections: most open connections (:mod:`serve.conn`); over it the oldest connection still waiting
            for its request headers is closed, or the new one answered 503 when every one has a request in progress.
        max_connections_per_client: most open connections from one client address (over it that address's oldest
            connection waiting for its headers is closed, or the new one answered 429); behind a proxy or load
            balancer every client has its address: set it to ``max_connections`` there (a value over ``max_connections``
            acts as ``max_connections``).
        header_timeout_s: seconds a connection has to send its request line and headers, from its start or its
            previous response's end (more: 408 and the connection closed).
        body_timeout_s: seconds a request has to send its whole body after its headers (more: the connection is
            closed and the request counted as a hang-up, 499).
        keep_alive_timeout_s: seconds an idle keep-alive connection is kept after a response (uvicorn's
            ``timeout_keep_alive``).
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
    max_in_flight_documents: int = Field(
        256, ge=1, le=1_000_000,
        description="documents admitted to the engine at once, all requests together (more: 429 with Retry-After)")
    max_header_bytes: int = Field(
        16 * 1024, ge=1024, le=2**20,
        description="bytes of a request line plus headers still incomplete (uvicorn's h11 limit; more: 400, connection closed)")
    max_connections: int = Field(
        512, ge=16, le=65_536,
        description="open connections; over it the oldest one still sending its headers is closed (503 if none is)")
    max_connections_per_client: int = Field(
        64, ge=1, le=65_536,
        description="open connections from one client address (more: its oldest waiting one closed, else 429); "
                    "set it to max_connections behind a proxy")
    header_timeout_s: float = Field(
        10.0, gt=0, le=600, description="seconds to send the request line and headers (more: 408, connection closed)")
    body_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="seconds to send the whole body after the headers (more: connection closed, 499)")
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, le=600, description="seconds an idle keep-alive connection is kept (uvicorn's timeout_keep_alive)")
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
        problem = token_problem(token)
        if problem:
            raise ConfigError(
                f"DOCPILOT_API_TOKEN {problem}; it must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} visible ASCII "
                f"characters, at least {MIN_DISTINCT_TOKEN_CHARS} of them distinct, and not a placeholder: generate one "
                "with `export DOCPILOT_API_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`"
            )
        return self

    @model_validator(mode="after")
    def _check_admission(self) -> ServeSettings:
        if self.max_in_flight_documents < self.max_documents:
            raise ConfigError(
                f"serve settings: `max_in_flight_documents` ({self.max_in_flight_documents}) must be at least "
                f"`max_documents` ({self.max_documents}), or a full request could never be admitted"
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
