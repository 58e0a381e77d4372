"""Schema fuzzing of the real server (schemathesis, every check) on 127.0.0.1.

A separate ``docpilot serve`` process (real uvicorn, real vLLM engine) starts for this module:
the one in ``test_serve_http.py`` is module-scoped and stopped by its last test. The pilot
gate is skipped so schema-valid requests reach the engine. Examples per operation are bounded
(``MAX_EXAMPLES``) and so is every request (``REQUEST_TIMEOUT_S``).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support.servers import AUTH, REQUEST_TIMEOUT_S, start_server, stop_server

# about 1 min with its own server (make test-slow); the OpenAPI document itself is checked in tests/unit/serve
pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]  # the server may take START_TIMEOUT_S (600 s) to start


MAX_EXAMPLES = 12
MAX_DOCUMENTS = 4

# Statuses a request may legitimately get besides 2xx, each documented in the OpenAPI schema:
# 404 unknown adapter (any well-formed name may be unknown), 413 a document over `max_doc_bytes`
# (a byte limit JSON Schema cannot state), 422 duplicate document ids (JSON Schema cannot state
# uniqueness by key). A schema-violating request must get a 4xx from the same documented set.
CONFIG = schemathesis.Config.from_dict({
    "headers": AUTH,
    "request-timeout": REQUEST_TIMEOUT_S,
    "checks": {
        "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "413", "422"]},
        "negative_data_rejection": {"expected-statuses": ["400", "401", "404", "409", "413", "422"]},
    },
})


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    """A real ``docpilot serve`` (pilot gate skipped, small limits); yields its base URL."""
    log_path = tmp_path_factory.mktemp("serve-schema") / "server.log"
    url, proc = start_server(log_path, "--skip-pilot-gate", "--max-documents", str(MAX_DOCUMENTS),
                             "--max-doc-bytes", "4000")
    try:
        yield url
    finally:
        stop_server(proc)
        assert proc.returncode == 0, log_path.read_text()[-3000:]


def test_every_answer_matches_the_openapi_schema(fuzz_server):
    # schemathesis.pytest.from_fixture needs pytest's private Node._nodeid, gone in pytest 9: drive
    # hypothesis directly, one bounded run per operation and generation mode (valid, then invalid data).
    schema = schemathesis.openapi.from_url(f"{fuzz_server}/openapi.json", config=CONFIG, timeout=30)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/classify", "GET /v1/adapters", "GET /healthz", "GET /readyz"}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                case.call_and_validate(headers=AUTH, timeout=REQUEST_TIMEOUT_S)

            try:
                fuzz()
            except Unsatisfiable:  # no parameters and no body: nothing to make invalid
                assert mode is GenerationMode.NEGATIVE, operation.label
            except Exception as err:
                raise AssertionError(f"{operation.label} ({mode.value} data): {err}") from err
