"""``POST /v1/classify``: one or many documents, the base model or a registry adapter.

The order of the checks keeps a hostile or overloaded client cheap: the token is checked from the
headers before the body is read (:class:`serve.guard.AuthGuard`); a full server answers 429 before the
body is read; the body streams in under ``max_request_bytes``, then is decoded, parsed and validated in
a worker thread (:mod:`serve.body`), so ``/healthz`` stays fast; the request's documents are admitted
under ``max_in_flight_documents`` (:class:`serve.admission.Admission`) or refused with 429 and
``Retry-After``. While the engine works, the route watches the connection: a client that hangs up has
its documents aborted in the engine (:meth:`serve.engine.AsyncClassifier.classify`), and its request is
counted with status 499 (nginx's "client closed request"); no answer is sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from classify.documents.read import document_from_text
from classify.documents.text import escape_surrogates
from classify.errors import InputError, PayloadTooLarge, VerificationError
from classify.records import Document, Result
from classify.runs.accounting import account, duplicates
from serve.body import parse_classify_body, too_many_documents
from serve.deps import Authorized, Engine, State
from serve.schemas import ClassifyRequest, ClassifyResponse, ErrorResponse, ResultOut

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499
"""Status counted (never sent) for a request whose client hung up before its answer (nginx's convention)."""

router = APIRouter(prefix="/v1", tags=["classify"], dependencies=[Authorized])

_ERRORS = {
    status: {"model": ErrorResponse, "description": what}
    for status, what in {
        400: "body not UTF-8 / not JSON (or nested too deeply) / not a JSON object",
        404: "unknown adapter",
        409: "adapter or base model has not passed a pilot, or failed verification",
        413: "too many documents, a document or the body over its byte limit",
        422: "wrong types, unknown fields, empty list or text, duplicate ids, a key repeated in one JSON object, "
             "adapter not `name[@version|@latest]`",
        429: "the server has `max_in_flight_documents` in flight: retry after `Retry-After` seconds",
        503: "engine still loading, failed to load, or died (the process exits shortly after)",
    }.items()
}


def _check_limits(body: ClassifyRequest, max_documents: int, max_doc_bytes: int) -> None:
    if len(body.documents) > max_documents:
        raise too_many_documents(len(body.documents), max_documents)
    for doc in body.documents:
        size = len(doc.text.encode("utf-8", "surrogatepass"))
        if size > max_doc_bytes:
            raise PayloadTooLarge(
                f"document {doc.id!r} is {size} bytes, over the limit of {max_doc_bytes} bytes per document "
                "(`max_doc_bytes`); shorten or split it"
            )
    repeated = duplicates(escape_surrogates(d.id) for d in body.documents)
    if repeated:
        raise InputError(f"duplicate document ids in one request: {repeated[:10]}; give each document a unique `id`")


def _check_accounting(results: list[Result], docs: list[Document], categories: list[str]) -> None:
    """The accounting check of pilot and batch over one request: each id once, in request order.

    Raises:
        VerificationError: (500) the engine's results break it (a defect, never a client error).
    """
    problems = account(results, [d.id for d in docs], categories).problems()
    if not problems and [r.id for r in results] != [d.id for d in docs]:
        problems = ["results are not in request order"]
    if problems:
        raise VerificationError(f"the engine's results break the accounting of this request: {'; '.join(problems)}")


_BODY_SCHEMA = {"$ref": "#/components/schemas/ClassifyRequest"}


async def _until_disconnect(request: Request) -> None:
    """Return once the client has hung up (the ASGI ``http.disconnect`` message after the body)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_client_leaves(request: Request, work: Any) -> Any:
    """Await ``work`` (a coroutine); cancel it (aborting its engine requests) if the client hangs up first.

    Returns:
        ``work``'s result, or ``None`` when the client left (the work was cancelled and has ended).
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()  # AsyncClassifier.classify returns only once the engine has dropped every request
    await asyncio.gather(task, return_exceptions=True)
    return None


@router.post("/classify", response_model=ClassifyResponse, responses=_ERRORS, openapi_extra={
    "requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}})
async def classify(request: Request, state: State, engine: Engine) -> Any:
    """Classify documents with the base model or a registry adapter.

    One result per document, in request order, with the same record as pilot and batch
    (`id, status, category, score, reason`). A document that cannot be classified (only
    whitespace, binary content, prompt over the context length) comes back `rejected` with
    its reason, exactly as in a batch run; the other documents are still classified.
    Over `max_in_flight_documents` documents in flight (all clients): 429 with `Retry-After`.
    """
    state.admission.check(1)  # full: refuse before the body is even read
    raw = await request.body()  # streamed under max_request_bytes (ServeMiddleware)
    body: ClassifyRequest = await asyncio.to_thread(
        parse_classify_body, raw, request.headers.get("content-type"), state.settings.max_documents)
    del raw
    _check_limits(body, state.settings.max_documents, state.max_doc_bytes)
    n = len(body.documents)
    state.admission.admit(n)
    state.metrics.in_flight.set(state.admission.in_flight)
    finished = False
    try:
        if body.adapter is not None:
            adapter = await asyncio.to_thread(state.adapters.resolve, body.adapter)
            handle, label = adapter.handle(), adapter.ref
        else:
            await asyncio.to_thread(state.adapters.check_base)
            handle, label = None, None
        docs = [document_from_text(d.id, d.text, state.max_doc_bytes, source="request") for d in body.documents]
        results = await _unless_client_leaves(request, engine.classify(docs, handle))
        finished = results is not None
    finally:
        state.admission.release(n, finished=finished)
        state.metrics.in_flight.set(state.admission.in_flight)
    if results is None:
        state.metrics.aborted.inc(n)
        log.info("client hung up: %d documents of a %s request aborted in the engine", n, label or "base")
        return Response(status_code=CLIENT_CLOSED)
    _check_accounting(results, docs, state.config.classify.categories)
    for status, count in Counter(r.status for r in results).items():
        state.metrics.documents.labels(adapter=label or "base", status=status).inc(count)
    return JSONResponse(ClassifyResponse(model=state.model.name, adapter=label,
                                         results=[ResultOut.of(r) for r in results]).model_dump(mode="json"))
