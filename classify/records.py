"""The one result record that pilot, batch and serve all emit, and the document it is about."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
        n_tokens: prompt tokens sent to the model (0 when rejected before the model).
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
