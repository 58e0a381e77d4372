"""``POST /v1/classify``: one or many documents, the base model or a registry adapter."""

from __future__ import annotations

import asyncio
from collections import Counter

from fastapi import APIRouter

from classify.accounting import account, duplicates
from classify.documents import document_from_text
from classify.errors import InputError, PayloadTooLarge, VerificationError
from classify.records import Document, Result
from classify.textcheck import escape_surrogates
from serve.deps import Authorized, Engine, State
from serve.schemas import ClassifyRequest, ClassifyResponse, ErrorResponse, ResultOut

router = APIRouter(prefix="/v1", tags=["classify"], dependencies=[Authorized])

_ERRORS = {
    status: {"model": ErrorResponse, "description": what}
    for status, what in {
        400: "body not UTF-8 / not JSON / not a JSON object",
        404: "unknown adapter",
        409: "adapter or base model has not passed a pilot, or failed verification",
        413: "too many documents, a document or the body over its byte limit",
        422: "wrong types, unknown fields, empty list or text, duplicate ids, adapter not `name[@version|@latest]`",
        503: "engine still loading, failed to load, or died (the process exits shortly after)",
    }.items()
}


def _check_limits(body: ClassifyRequest, max_documents: int, max_doc_bytes: int) -> None:
    if len(body.documents) > max_documents:
        raise PayloadTooLarge(
            f"request holds {len(body.documents)} documents, over the limit of {max_documents} per request "
            "(`max_documents`); send them in several requests"
        )
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


@router.post("/classify", response_model=ClassifyResponse, responses=_ERRORS)
async def classify(body: ClassifyRequest, state: State, engine: Engine) -> ClassifyResponse:
    """Classify documents with the base model or a registry adapter.

    One result per document, in request order, with the same record as pilot and batch
    (`id, status, category, score, reason`). A document that cannot be classified (only
    whitespace, binary content, prompt over the context length) comes back `rejected` with
    its reason, exactly as in a batch run; the other documents are still classified.
    """
    _check_limits(body, state.settings.max_documents, state.max_doc_bytes)
    if body.adapter is not None:
        adapter = await asyncio.to_thread(state.adapters.resolve, body.adapter)
        handle, label = adapter.handle(), adapter.ref
    else:
        await asyncio.to_thread(state.adapters.check_base)
        handle, label = None, None
    docs = [document_from_text(d.id, d.text, state.max_doc_bytes, source="request") for d in body.documents]
    results = await engine.classify(docs, handle)
    _check_accounting(results, docs, state.config.classify.categories)
    for status, n in Counter(r.status for r in results).items():
        state.metrics.documents.labels(adapter=label or "base", status=status).inc(n)
    return ClassifyResponse(model=state.model.name, adapter=label, results=[ResultOut.of(r) for r in results])
