"""Request and response bodies of the HTTP API (separate models, with length limits).

The result subset (``id, status, category, score, reason``, how much of the document was read:
``n_doc_tokens, n_windows, truncated``, and ``review`` when the server's
``classify.review_below_score`` is set, ``dropped`` when padding was not scored) is the one result record
:class:`classify.records.Result` that pilot and batch write, minus the bookkeeping fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictStr,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
)

from adapters.registry.registry import NAME_RE
from classify.documents.text import escape_surrogates
from classify.records import Result

MAX_ID_CHARS = 512
MAX_REF_CHARS = 100
ADAPTER_REF_PATTERN = NAME_RE.pattern.removesuffix("$") + r"(@(latest|0*[1-9][0-9]*))?$"
"""``name``, ``name@latest`` or ``name@<positive int>``: the registry's name rule (``adapters.registry.registry.NAME_RE``)
plus the versions :func:`adapters.registry.registry.parse_ref` accepts."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _pass_lone_surrogates(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    # A JSON "\ud83d" escape without its pair gives a str pydantic refuses; check its escaped form
    # (type, length) and keep the original, so that one document is rejected, not the whole request.
    if isinstance(value, str) and (escaped := escape_surrogates(value)) != value:
        handler(escaped)
        return value
    return handler(value)


class DocumentIn(_Body):
    """One document to classify.

    Attributes:
        id: the caller's id, unique within the request; echoed in its result. An id with a lone
            surrogate is echoed escaped (``\\ud83d`` as text) and that document rejected.
        text: the document text (UTF-8 in the JSON body; at most ``max_doc_bytes`` bytes). A text
            with a lone surrogate or with no visible character is a rejected result, not a 422.
    """

    id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS), WrapValidator(_pass_lone_surrogates)]
    text: Annotated[StrictStr, Field(min_length=1), WrapValidator(_pass_lone_surrogates)]


class ClassifyRequest(_Body):
    """``POST /v1/classify`` body.

    Attributes:
        adapter: ``name@version``, ``name@latest`` or ``name`` from the adapter registry;
            omitted or ``null`` = the base model alone.
        documents: one or more documents (at most the server's ``max_documents``).
    """

    adapter: StrictStr | None = Field(None, min_length=1, max_length=MAX_REF_CHARS, pattern=ADAPTER_REF_PATTERN)
    documents: list[DocumentIn] = Field(min_length=1)

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {"adapter": "topics@1", "documents": [{"id": "a1", "text": "Shares in the bank rose 5% ..."}]}
            ]
        },
    )


class ResultOut(_Body):
    """One result: the shared result record's public fields."""

    id: str
    status: Literal["accepted", "rejected"]
    category: str | None = None
    score: float | None = None
    reason: str | None = None
    n_doc_tokens: int = Field(0, description="document tokens the model read, over every window")
    n_windows: int = Field(0, description="prompts the document was scored with (more than 1 only with "
                           "`classify.long_documents: windows`); 0 when rejected before the model")
    truncated: bool = Field(False, description="true when the document had tokens the model did not read "
                            "(past `classify.max_doc_tokens`, or past `max_doc_tokens x max_windows` with windows)")
    review: bool | None = Field(None, description="present only when the server's `classify.review_below_score` is "
                                "set: true when an accepted result's score is under it")

    dropped: str | None = Field(None, description="present only when something was not scored: invisible characters "
                                 "or whitespace padding dropped before tokenising, windows without words")

    @model_serializer(mode="wrap")
    def _review_only_when_set(self, handler: SerializerFunctionWrapHandler):  # noqa: ANN202 - keeps the field schema
        data = handler(self)
        if self.review is None:
            data.pop("review", None)  # no threshold: the response is what it was before review flags existed
        if self.dropped is None:
            data.pop("dropped", None)
        return data

    @classmethod
    def of(cls, result: Result) -> ResultOut:
        """The public view of a :class:`classify.records.Result`."""
        return cls(id=result.id, status=result.status, category=result.category, score=result.score, reason=result.reason,
                   n_doc_tokens=result.n_doc_tokens, n_windows=result.n_windows, truncated=result.truncated,
                   review=getattr(result, "review", None), dropped=getattr(result, "dropped", None))


class ClassifyResponse(_Body):
    """``POST /v1/classify`` answer: one result per document, in request order."""

    model: str
    adapter: str | None
    results: list[ResultOut]


class AdapterOut(_Body):
    """One registry adapter version as ``GET /v1/adapters`` lists it.

    ``servable`` is true when the adapter matches the base model, has passed its pilot (or the
    gate is skipped) and the server's engine is loaded and alive.
    """

    ref: str
    sha256: str
    base_model: dict[str, Any]
    base_model_matches: bool
    pilot_status: str
    servable: bool
    loaded: bool
    created: str | None = None


class AdaptersResponse(_Body):
    """``GET /v1/adapters`` answer."""

    model: str
    model_fingerprint: str
    skip_pilot_gate: bool
    adapters: list[AdapterOut]
    unreadable: list[str] = Field(default_factory=list, description="why a version's card.json could not be read")


class ErrorDetail(_Body):
    """The one error shape: HTTP status, machine-readable kind, human message."""

    status: int
    kind: str
    message: str


class ErrorResponse(_Body):
    """Every 4xx/5xx answer: ``{"error": {"status", "kind", "message"}}``."""

    error: ErrorDetail


class HealthOut(_Body):
    """``GET /healthz`` answer while the process is alive (loading or serving)."""

    status: Literal["ok"]
    uptime_s: float


class ReadyOut(_Body):
    """``GET /readyz`` answer once the engine answers requests."""

    status: Literal["ready"]
    model: str
    fingerprint: str
    tensor_parallel_size: int = Field(description="GPUs the engine spans (`engine.tensor_parallel_size`, `auto` "
                                                  "resolved as the batch resolves it; 1 on CPU)")


class NotReadyOut(_Body):
    """503 from ``/readyz`` (loading, failed) or ``/healthz`` (failed): ``error`` says why it failed."""

    status: Literal["loading", "failed"]
    error: str | None = None
