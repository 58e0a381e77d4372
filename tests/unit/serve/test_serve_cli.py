"""``docpilot serve``'s command line is built from :class:`serve.settings.ServeSettings` (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from classify.errors import ConfigError
from serve.cli import build_parser, parse_settings
from serve.settings import ServeSettings

TOKEN = "tok-" + "0123456789abcdef" + "xyzw"
DOCUMENTED = {  # README / docs/serving.md: flag -> environment variable
    "--config": "DOCPILOT_CONFIG_PATH", "--host": "DOCPILOT_HOST", "--port": "DOCPILOT_PORT",
    "--model": "DOCPILOT_BASE_MODEL", "--adapter": "DOCPILOT_ADAPTERS", "--max-documents": "DOCPILOT_MAX_DOCUMENTS",
    "--max-doc-bytes": "DOCPILOT_MAX_DOC_BYTES", "--max-request-bytes": "DOCPILOT_MAX_REQUEST_BYTES",
    "--skip-pilot-gate": "DOCPILOT_SKIP_PILOT_GATE", "--insecure-no-auth": "DOCPILOT_INSECURE_NO_AUTH",
    "--graceful-timeout-s": "DOCPILOT_GRACEFUL_TIMEOUT_S",
    "--engine-failure-exit-delay-s": "DOCPILOT_ENGINE_FAILURE_EXIT_DELAY_S", "--log-level": "DOCPILOT_LOG_LEVEL",
    "--max-connections": "DOCPILOT_MAX_CONNECTIONS", "--header-timeout-s": "DOCPILOT_HEADER_TIMEOUT_S",
    "--body-timeout-s": "DOCPILOT_BODY_TIMEOUT_S", "--keep-alive-timeout-s": "DOCPILOT_KEEP_ALIVE_TIMEOUT_S",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in [*DOCUMENTED.values(), "DOCPILOT_API_TOKEN"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCPILOT_API_TOKEN", TOKEN)


def test_every_documented_flag_is_in_the_help_with_its_variable():
    parser, _ = build_parser()
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    for flag, env in DOCUMENTED.items():
        assert flag in actions, flag
        assert f"[env: {env}]" in actions[flag].help, (flag, actions[flag].help)
    assert actions["--adapter"].metavar == "NAME@VERSION"
    help_text = parser.format_help()
    assert "usage: docpilot serve" in help_text and "api-token" not in help_text and "API_TOKEN" not in help_text


def test_every_field_but_the_token_is_a_flag():
    parser, _ = build_parser()
    dests = {a.dest for a in parser._actions} - {"help"}
    assert dests == set(ServeSettings.model_fields) - {"api_token"}


def test_flags_give_the_settings():
    s = parse_settings(["--config", "x.json", "--host", "0.0.0.0", "--port", "9001", "--model", "m",
                        "--adapter", "a@1", "--adapter", "b@2", "--max-documents", "3", "--max-doc-bytes", "500",
                        "--max-request-bytes", "4096", "--skip-pilot-gate", "--graceful-timeout-s", "2.5",
                        "--engine-failure-exit-delay-s", "0", "--log-level", "warning"])
    assert (s.config_path, s.host, s.port, s.base_model, s.adapters) == (Path("x.json"), "0.0.0.0", 9001, "m", ("a@1", "b@2"))
    assert (s.max_documents, s.max_doc_bytes, s.max_request_bytes) == (3, 500, 4096)
    assert (s.skip_pilot_gate, s.insecure_no_auth, s.graceful_timeout_s, s.engine_failure_exit_delay_s,
            s.log_level) == (True, False, 2.5, 0.0, "warning")


def test_defaults_then_environment_then_flags(monkeypatch):
    s = parse_settings([])
    assert (s.port, s.config_path, s.adapters, s.max_doc_bytes, s.skip_pilot_gate, s.log_level) == (
        8000, Path("config/docpilot.json"), (), None, False, "info")
    monkeypatch.setenv("DOCPILOT_PORT", "7000")
    monkeypatch.setenv("DOCPILOT_SKIP_PILOT_GATE", "1")
    monkeypatch.setenv("DOCPILOT_ADAPTERS", '["z@1"]')
    s = parse_settings([])
    assert (s.port, s.skip_pilot_gate, s.adapters) == (7000, True, ("z@1",))
    s = parse_settings(["--port", "7001", "--adapter", "y@2"])
    assert (s.port, s.skip_pilot_gate, s.adapters) == (7001, True, ("y@2",))


def test_insecure_no_auth_flag_needs_no_token(monkeypatch):
    monkeypatch.delenv("DOCPILOT_API_TOKEN")
    with pytest.raises(ConfigError, match="DOCPILOT_API_TOKEN must be set"):
        parse_settings([])
    assert parse_settings(["--insecure-no-auth"]).insecure_no_auth is True


@pytest.mark.parametrize(("argv", "message"), [
    (["--port", "70000"], "serve settings: `port` must be less than or equal to 65535"),
    (["--port", "abc"], "serve settings: `port` must be a valid integer"),
    (["--max-documents", "0"], "`max_documents` must be greater than or equal to 1"),
    (["--log-level", "loud"], "`log_level` must be 'debug', 'info', 'warning' or 'error'"),
])
def test_bad_values_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_settings(argv)


def test_unparseable_list_variable_is_a_config_error(monkeypatch):
    monkeypatch.setenv("DOCPILOT_ADAPTERS", "bbc-news@1")  # not JSON: pydantic-settings raises SettingsError
    with pytest.raises(ConfigError, match='field "adapters".*DOCPILOT_ADAPTERS'):
        parse_settings([])


@pytest.mark.parametrize("flag", ["--bogus", "--api-token"])
def test_unknown_flag_and_help_exit_like_argparse(capsys, flag):
    with pytest.raises(SystemExit) as bad:
        parse_settings([flag, "x" * 30])  # the token is never read from the command line
    assert bad.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as helped:
        parse_settings(["--help"])
    assert helped.value.code == 0 and "--engine-failure-exit-delay-s" in capsys.readouterr().out


def test_a_malformed_adapter_ref_is_refused_before_the_model_is_resolved(monkeypatch):
    """``docpilot serve --adapter 'Bad@@'`` stops with the ref's error before create_app (model, registry) runs."""
    import serve.app
    from classify.errors import AdapterError
    from serve.cli import main

    def no_app(settings):
        raise AssertionError("create_app ran for a malformed adapter ref")

    monkeypatch.setattr(serve.app, "create_app", no_app)
    with pytest.raises(AdapterError, match="Bad@@"):
        main(["--adapter", "Bad@@"])
