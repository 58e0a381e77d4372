"""``docpilot serve``: start the HTTP endpoint (FastAPI over vLLM) with uvicorn.

Everything that can be checked before weights load is checked here first: settings and
token, config file, base model, and every ``--adapter`` (found, hashes and base model
verified, pilot passed), so a wrong start-up fails in seconds with a named error.
Graceful shutdown: on SIGTERM or Ctrl-C uvicorn stops accepting connections, lets
in-flight requests finish (``--graceful-timeout-s``), then the engine core is stopped.
A failed engine load or a dead engine core makes the server answer 503 for
``--engine-failure-exit-delay-s``, then stop the same way and exit with status 5
(:class:`classify.errors.EngineError`), so a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

from pydantic_settings import CliSettingsSource

from adapters.registry.resolved import parse_ref
from classify.errors import EngineError
from classify.usercommand import cli_description, user_flag
from serve.settings import ServeSettings, load_settings

log = logging.getLogger(__name__)

METAVARS = {"adapters": "NAME@VERSION"}
"""Flag placeholders other than the field's type name."""


def _add_argument(parser: Any, *names: str, **kwargs: Any) -> Any:
    """``parser.add_argument`` with the documented short flag first (``--config`` before ``--config-path``).

    A field hidden from the command line (``CliSuppress``: the token) gets no flag at all, so
    ``--api-token`` is refused as an unknown argument instead of being read from ``ps``-visible argv.
    """
    if kwargs.get("help") == argparse.SUPPRESS:
        return None
    short = {f"--{alias}" for alias in (ServeSettings.model_config.get("cli_shortcuts") or {}).values()}
    if kwargs.get("dest") in METAVARS and "metavar" in kwargs:
        kwargs["metavar"] = METAVARS[kwargs["dest"]]
    return parser.add_argument(*sorted(names, key=lambda name: name not in short), **kwargs)


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource[argparse.ArgumentParser]]:
    """The ``docpilot serve`` parser, built from :class:`ServeSettings` (its fields, help and env names).

    Returns:
        ``(parser, source)``: the argparse parser (for ``--help``) and the pydantic-settings source
        that turns ``argv`` into the values given on the command line.
    """
    parser = argparse.ArgumentParser(prog="docpilot serve", description=cli_description(__doc__))
    source = CliSettingsSource(ServeSettings, root_parser=parser, add_argument_method=_add_argument)
    return parser, source


def parse_settings(argv: list[str]) -> ServeSettings:
    """Settings from ``argv`` over the ``DOCPILOT_*`` environment over the defaults.

    Args:
        argv: arguments after ``docpilot serve``.

    Returns:
        The frozen settings.

    Raises:
        ConfigError: a missing or unsafe token, or a value out of bounds or of the wrong type (names the
            flag's field and the value).
        SystemExit: ``--help`` (status 0) or an unknown flag, ``--api-token`` included (status 2), from argparse.
    """
    _, source = build_parser()
    return load_settings(**source(args=argv)())


def uvicorn_config(app: Any, settings: ServeSettings) -> Any:
    """The ``uvicorn.Config`` the server runs under (also used by tests that run the app in-process).

    uvicorn's default HTTP parser (``httptools`` when installed) buffers request headers without a
    limit: a 128 MiB ``Authorization`` header from a client without a token was read in full and
    held ``/healthz`` for 11.5 s. The server therefore runs on ``h11`` with
    ``h11_max_incomplete_event_size = settings.max_header_bytes``: a request line plus headers over it
    is answered 400 and the connection closed, before the app sees it.

    Slow and idle clients (slowloris) are bounded by :func:`serve.conn.guarded_protocol` on top of uvicorn's h11
    protocol: a header deadline, a body deadline, a connection cap and a per-client-address cap; uvicorn's own ``timeout_keep_alive``
    closes idle keep-alive connections.

    Args:
        app: the ASGI app.
        settings: host, port, log level, graceful timeout, ``max_header_bytes`` and the connection limits.

    Returns:
        The ``uvicorn.Config``.
    """
    import uvicorn

    from serve.conn import guarded_protocol

    protocol = guarded_protocol(settings.max_connections, settings.header_timeout_s, settings.body_timeout_s,
                                settings.max_connections_per_client,
                                None if settings.insecure_no_auth or settings.api_token is None
                                else settings.api_token.get_secret_value())
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                          timeout_graceful_shutdown=int(settings.graceful_timeout_s), access_log=False,
                          http=protocol, h11_max_incomplete_event_size=settings.max_header_bytes,
                          timeout_keep_alive=settings.keep_alive_timeout_s)


def main(argv: list[str]) -> int:
    """Run the server until SIGTERM / Ctrl-C.

    Args:
        argv: arguments after ``docpilot serve``.

    Returns:
        0 after a graceful shutdown.

    Raises:
        ConfigError: no token (without ``--insecure-no-auth``), bad settings or config.
        EngineError: the base model cannot be resolved; or (raised once the server stopped) the engine
            failed to load or its core process died, so ``docpilot serve`` exits with status 5.
        AdapterError: a start-up adapter is unknown, altered, for another base model, or unpiloted.
    """
    settings = parse_settings(argv)
    for ref in settings.adapters:  # a malformed ref is refused before the model is resolved or anything loads
        parse_ref(ref)
    import uvicorn

    from serve.app import create_app

    if settings.insecure_no_auth:
        log.warning("!!! AUTHENTICATION DISABLED (--insecure-no-auth): anyone who reaches %s:%d can use the server",
                    settings.host, settings.port)
    if settings.skip_pilot_gate:
        log.warning("!!! PILOT GATE SKIPPED (%s): unpiloted adapters and base model will be served",
                    user_flag("--skip-pilot-gate"))
    from serve.conn import check_fd_budget

    check_fd_budget(settings.max_connections)  # before anything loads: the cap must fit `ulimit -n`
    app = create_app(settings)
    state = app.state.server
    for ref in settings.adapters:  # fail before any weights load
        adapter = state.adapters.resolve(ref)
        log.info("start-up adapter %s verified (sha256 %s, pilot %s)", adapter.ref, adapter.sha256[:12],
                 (adapter.card.get("pilot") or {}).get("status"))
    log.info("serving %s (%s) on http://%s:%d; engine loading, see GET /readyz", state.model.name,
             state.model.fingerprint[:19], settings.host, settings.port)
    config = uvicorn_config(app, settings)
    # uvicorn re-raises the signal that stopped it once it has shut down; these handlers take that
    # re-raise, so a SIGTERM / Ctrl-C after a graceful shutdown ends with exit status 0, not -15.
    stopped_by: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopped_by.append(signal.Signals(signum).name))
    server = uvicorn.Server(config)
    state.on_fatal = lambda: setattr(server, "should_exit", True)
    server.run()
    log.info("server stopped%s", f" ({', '.join(stopped_by)})" if stopped_by else "")
    if state.failure:
        raise EngineError(f"server stopped because its engine failed: {state.failure}")
    return 0

