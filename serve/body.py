"""The ``/v1/classify`` body: read under the byte limit, then decoded, parsed and validated in a worker thread.

FastAPI parses a declared body model with ``json.loads`` and validates it with pydantic on the
event loop, so one 16 MiB body of one-character documents held ``/healthz`` for seconds before its
413. Here the route reads the raw bytes (the streamed limit is :class:`serve.metrics.ServeMiddleware`'s)
and hands them to :func:`parse_classify_body` in a thread. Its rules, in order:

1. a ``Content-Type`` other than JSON (``application/json``, ``*/*+json``) -> 400 ``bad_request``;
2. an empty body -> 422 ``input``; bytes that are not UTF-8 -> 400 ``bad_request`` (a leading BOM is allowed);
3. not JSON -> 400 ``bad_json``, naming the character; nested deeper than the parser can follow
   (thousands of ``[``) or a number of over 4300 digits -> 400 ``bad_json``;
4. a key repeated inside one JSON object (RFC 8259 leaves the meaning open; Python would keep the last)
   -> 422 ``input`` naming the key, everywhere in the body;
5. not a JSON object -> 400 ``bad_request``; more than ``max_documents`` documents -> 413 ``too_large``
   (counted before any document is validated);
6. the pydantic model :class:`serve.schemas.ClassifyRequest` -> 422 ``input`` (the same messages as before).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from classify.errors import InputError, PayloadTooLarge
from serve.errors import BadJson, BadRequestBody
from serve.schemas import ClassifyRequest

NOT_AN_OBJECT = "request body must be a JSON object sent with `Content-Type: application/json`"


class DuplicateKey(ValueError):
    """A key appears twice in one JSON object."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def is_json_content_type(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header means JSON (absent counts as JSON, as FastAPI reads it)."""
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def too_many_documents(count: int, max_documents: int) -> PayloadTooLarge:
    """The 413 for a request of ``count`` documents over ``max_documents``."""
    return PayloadTooLarge(
        f"request holds {count} documents, over the limit of {max_documents} per request "
        "(`max_documents`); send them in several requests"
    )


def parse_classify_body(raw: bytes, content_type: str | None, max_documents: int) -> ClassifyRequest:
    """Decode, parse and validate a ``POST /v1/classify`` body (CPU work: run it in a worker thread).

    Args:
        raw: the whole body (already under ``max_request_bytes``).
        content_type: the request's ``Content-Type`` header, ``None`` when absent.
        max_documents: the server's per-request document limit.

    Returns:
        The validated request.

    Raises:
        BadRequestBody: not JSON by content type, not UTF-8, or not a JSON object (400).
        BadJson: JSON syntax, nesting too deep, or a number too long (400).
        InputError: empty body or a repeated key (422).
        PayloadTooLarge: more than ``max_documents`` documents (413).
        RequestValidationError: the body does not match :class:`ClassifyRequest` (422 ``input``).
    """
    if not is_json_content_type(content_type):
        raise BadRequestBody(NOT_AN_OBJECT)
    if not raw.strip():
        raise InputError("request body is empty: send a JSON object such as "
                         '{"documents": [{"id": "a1", "text": "..."}]}')
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequestBody(f"request body is not valid UTF-8: byte 0x{err.object[err.start]:02x} at offset "
                             f"{err.start} (send JSON encoded as UTF-8)") from None
    text = text.removeprefix("\ufeff")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except DuplicateKey as err:
        raise InputError(f"request body repeats the key {str(err)[:60]!r} inside one JSON object; send each key "
                         "once (a repeated key is refused, never silently last-wins)") from None
    except json.JSONDecodeError as err:
        raise BadJson(f"request body is not valid JSON: {err.msg} at character {err.pos}") from None
    except RecursionError:
        raise BadJson("request body is not valid JSON for this server: arrays/objects nested too deeply "
                      "(a classify request needs 3 levels)") from None
    except ValueError as err:  # e.g. an integer of over 4300 digits (sys.get_int_max_str_digits)
        raise BadJson(f"request body is not valid JSON for this server: {err}"[:300]) from None
    if not isinstance(data, dict):
        raise BadRequestBody(NOT_AN_OBJECT)
    documents = data.get("documents")
    if isinstance(documents, list) and len(documents) > max_documents:
        raise too_many_documents(len(documents), max_documents)
    try:
        return ClassifyRequest.model_validate(data)
    except ValidationError as err:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
        raise RequestValidationError(errors) from None
