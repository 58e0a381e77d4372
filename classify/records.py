"""The one result record that pilot, batch and serve all emit, and the document it is about."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Status = Literal["accepted", "rejected"]


@dataclass(frozen=True)
class Document:
    """One input document after reading.

    Attributes:
        id: unique id given by the input (or derived: relative path, ``<prefix>-<row>``).
        text: decoded text, or ``None`` when the document is rejected at reading.
        input_sha256: sha256 hex digest of the raw input bytes (``""`` when unreadable).
        n_chars: characters of ``text`` (0 when rejected at reading).
        reject_reason: why the document cannot be classified, or ``None``.
        source: where it came from (file path or ``file:line``), for messages.
    """

    id: str
    text: str | None
    input_sha256: str
    n_chars: int
    reject_reason: str | None = None
    source: str = ""


class Result(BaseModel):
    """One output line: exactly one per input id.

    Attributes:
        id: the document id, as given.
        status: ``accepted`` (``category`` is one of the allowed set) or ``rejected`` (``reason`` says why).
        category: chosen category, ``None`` when rejected.
        score: probability (0-1) of ``category`` among the allowed categories, ``None`` when rejected.
        reason: why rejected; ``None`` when accepted.
        input_sha256: sha256 of the raw input bytes.
        n_chars: characters in the decoded document.
        n_tokens: prompt tokens sent to the model, every window's prompt summed (0 when rejected before the model).
        n_doc_tokens: document tokens the model read (over every window; 0 when rejected before the model).
        n_windows: prompts the document was scored with (1, or more with ``classify.long_documents: windows``;
            0 when rejected before the model).
        truncated: the document had tokens the model did not read (past ``classify.max_doc_tokens`` in ``cut``
            mode, past ``max_doc_tokens x max_windows`` in ``windows`` mode); ``False`` when rejected.
        review: only with ``classify.review_below_score`` set: ``True`` when an accepted result's score
            is under it (or unknown), ``False`` otherwise; ``None`` (rejected rows, or no threshold)
            is left out of the stored row, so rows without the threshold are what they always were.
        dropped: what of the document was not scored, in words (invisible characters and whitespace padding
            dropped before tokenising, windows without words: :meth:`classify.engine.prompt.PromptBuilder.build`);
            ``None`` (nothing dropped) is left out of the stored row.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: Status
    category: str | None = None
    score: float | None = Field(None, ge=0, le=1)
    reason: str | None = None
    input_sha256: str = ""
    n_chars: int = 0
    n_tokens: int = 0
    n_doc_tokens: int = 0
    n_windows: int = 0
    truncated: bool = False
    review: bool | None = None
    dropped: str | None = None

    @classmethod
    def rejected(cls, doc: Document, reason: str, n_tokens: int = 0) -> Result:
        """Build the rejected record for ``doc`` with ``reason``."""
        return cls(
            id=doc.id,
            status="rejected",
            reason=reason,
            input_sha256=doc.input_sha256,
            n_chars=doc.n_chars,
            n_tokens=n_tokens,
        )

    def row(self) -> dict[str, Any]:
        """The record as the JSON object written to shard files and ``results.jsonl`` (every field, JSON types;
        ``review`` and ``dropped`` only when set)."""
        row = dict(self.__dict__)  # the fields' values, already JSON types: model_dump's output at a tenth of its cost
        for optional in OPTIONAL_FIELDS:
            if row.get(optional) is None:
                row.pop(optional, None)
        return row

    @classmethod
    def of(cls, row: Result | Mapping[str, Any]) -> Result:
        """The record for ``row``: a :class:`Result` as is, a mapping validated (rows read back from JSON, or a test actor's dicts).

        Raises:
            pydantic.ValidationError: a mapping that is not a valid result.
        """
        return row if isinstance(row, Result) else cls.model_validate(row)

    @classmethod
    def from_json(cls, line: bytes | str) -> Result:
        """Read one stored line (a shard file, ``results.jsonl``) without refusing a bad record.

        A valid line is validated (pydantic-core's JSON parser, faster than ``json.loads``); a line that is
        JSON but not a valid result (unknown status, no reason, score out of range, wrong or missing fields)
        is kept as read, unvalidated, so the accounting check (:mod:`classify.runs.accounting`) names what is wrong.

        Args:
            line: one JSON object.

        Returns:
            The record (missing fields take their defaults; unknown fields are dropped).

        Raises:
            json.JSONDecodeError: the line is not JSON (or not UTF-8).
        """
        try:
            return cls.model_validate_json(line)
        except ValidationError:
            import json

            try:
                obj = json.loads(line)
            except UnicodeDecodeError as err:  # a ValueError, not a JSONDecodeError: named as one
                raise json.JSONDecodeError(f"not UTF-8 ({err.reason})", bytes(line).decode("utf-8", "replace"),
                                           err.start) from None
            obj = obj if isinstance(obj, dict) else {}
            values = {name: obj.get(name, None if field.is_required() else field.default)
                      for name, field in cls.model_fields.items()}
            return cls.model_construct(**values)


OPTIONAL_FIELDS = ("review", "dropped")
"""Fields of :class:`Result` a row holds only when they are set."""
