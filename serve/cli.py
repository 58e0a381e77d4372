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

from classify.errors import EngineError
from serve.settings import ServeSettings

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The ``docpilot serve`` argument parser (defaults come from ``DOCPILOT_*`` variables, then the fields)."""
    fields = ServeSettings.model_fields
    p = argparse.ArgumentParser(prog="docpilot serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", dest="config_path", help="pilot config JSON (model, engine, classify); default config/pilot.json")
    p.add_argument("--host", help=f"interface to bind (default {fields['host'].default})")
    p.add_argument("--port", type=int, help=f"TCP port (default {fields['port'].default})")
    p.add_argument("--model", dest="base_model", help="override model.base_model (alias, local folder or HF id)")
    p.add_argument("--adapter", dest="adapters", action="append", metavar="NAME@VERSION",
                   help="verify and load this registry adapter at start-up (repeatable); others load on first use")
    p.add_argument("--max-documents", type=int, help=f"documents per request (default {fields['max_documents'].default})")
    p.add_argument("--max-doc-bytes", type=int, help="bytes per document (default: the config's classify.max_doc_bytes)")
    p.add_argument("--max-request-bytes", type=int, help=f"bytes per request body (default {fields['max_request_bytes'].default})")
    p.add_argument("--skip-pilot-gate", action="store_true", default=None,
                   help="serve adapters / a base model without a passed pilot (every use is logged as a warning)")
    p.add_argument("--insecure-no-auth", action="store_true", default=None,
                   help="serve WITHOUT the bearer token (logged; loopback experiments only)")
    p.add_argument("--graceful-timeout-s", type=float, help="seconds in-flight requests get after SIGTERM (default 30)")
    p.add_argument("--engine-failure-exit-delay-s", type=float,
                   help="seconds the server answers 503 after its engine failed or died, before it exits with "
                        f"status 5 (default {fields['engine_failure_exit_delay_s'].default})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


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
    args = vars(build_parser().parse_args(argv))
    log_level = args.pop("log_level")
    if args.get("adapters"):
        args["adapters"] = tuple(args["adapters"])
    import uvicorn

    from serve.app import create_app
    from serve.settings import load_settings

    settings = load_settings(**args)
    if settings.insecure_no_auth:
        log.warning("!!! AUTHENTICATION DISABLED (--insecure-no-auth): anyone who reaches %s:%d can use the server",
                    settings.host, settings.port)
    if settings.skip_pilot_gate:
        log.warning("!!! PILOT GATE SKIPPED (--skip-pilot-gate): unpiloted adapters and base model will be served")
    app = create_app(settings)
    state = app.state.server
    for ref in settings.adapters:  # fail before any weights load
        adapter = state.adapters.resolve(ref)
        log.info("start-up adapter %s verified (sha256 %s, pilot %s)", adapter.ref, adapter.sha256[:12],
                 (adapter.card.get("pilot") or {}).get("status"))
    log.info("serving %s (%s) on http://%s:%d; engine loading, see GET /readyz", state.model.name,
             state.model.fingerprint[:19], settings.host, settings.port)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                            timeout_graceful_shutdown=int(settings.graceful_timeout_s), access_log=False)
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


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
