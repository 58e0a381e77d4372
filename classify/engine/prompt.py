"""The one prompt builder, shared by training, pilot, batch and serve: prompts as token ids.

The prompt is the model's chat template over a system message (instruction +
category list) and a user message (the document cut to ``max_doc_tokens``
tokens), ending where the assistant's answer starts. The answer is the bare
category name followed by the end-of-turn token, so a LoRA adapter trained on
:func:`build_training_examples` answers in exactly the format the engine scores.

The prompt is built as token ids, never as a string the engine tokenizes again
(:class:`PromptBuilder`):

* the chat template is rendered ONCE per (tokenizer, classify config), with a unique
  placeholder where the document goes, and split around it into prefix ids and suffix ids
  (each tokenized as template text: its control tokens are real control tokens);
* each document is tokenized once as plain text: a special-token string inside a document
  (``<|im_start|>``, ``<|im_end|>``, ...) stays text and never becomes a control token
  (the tokenizer's ``encode_special_tokens`` mode, on a private copy of the fast tokenizer),
  so a document cannot close its user turn and forge an assistant answer;
* what carries no text is dropped before tokenising (:func:`classify.documents.text.normalise_text`: invisible
  characters, whitespace padding), so padding cannot move a category; the row says what was dropped;
* the document's ids are cut to the builder's budget (``max_doc_tokens``; ``max_doc_tokens x max_windows``
  with ``classify.long_documents: windows``); a character pre-cut at a space bounds the work on long
  documents without changing the first ids;
* prompt = prefix + document + suffix; ``n_tokens`` is its exact length. With ``windows`` a document over
  ``max_doc_tokens`` ids gives several prompts (:func:`window_spans`: consecutive, no overlap, balanced),
  each prefix + window + suffix; :class:`Prompt` holds them all and the scorer combines their answers.

Documents are tokenized in batches by the ``tokenizers`` library (``encode_batch_fast``, its own thread pool,
sized by ``RAYON_NUM_THREADS``; :func:`set_tokenizer_threads`), a private copy of the model's fast tokenizer;
docpilot never re-implements a tokenizer. For a document without special-token
strings the ids equal the old string path's (template rendered around the document, then
tokenized) wherever the document was not cut; the tests check it on the demo set's news articles.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from classify.config.sections import ClassifyConfig
from classify.documents.text import Normalised, normalise_text

log = logging.getLogger(__name__)

PLACEHOLDER = "\u2063DOCPILOT-DOCUMENT-7f3a9c\u2063"
"""Stands for the document when the template is rendered once (split around it; must occur exactly once)."""

FIRST_CHUNK_CHARS_PER_TOKEN = 4.0
"""Characters per token of a document's first chunk before a builder has learned its documents' own figure
(English news: about 4.5 per token, from 3.9 to 5.4)."""
FIRST_CHUNK_QUANTILE = 0.5
"""The quantile of the documents' characters per token a builder sizes first chunks with (a document above it
needs a second, small chunk; one below it tokenizes characters beyond the cut)."""
LEARN_WINDOW = 500
"""Documents whose first chunks replace a builder's characters-per-token estimate entirely (fewer: blended)."""
NEXT_CHUNK_MARGIN = 1.1
"""A further chunk is sized for the ids still lacking times this, at the document's own characters per token..."""
NEXT_CHUNK_SLACK = 32
"""...plus this many characters."""
NORMALISE_CHARS_PER_TOKEN = 64
"""Characters of a document normalised per token of the budget (:meth:`PromptBuilder._normalised`); more is never read."""
BPE_CACHE_WORDS = 100_000
"""Words the private tokenizer copy's BPE cache holds: a word already seen skips the BPE merges. The
``tokenizers`` default, 10,000, fills with the first words seen and then caches nothing new (the 1,891 news
articles alone hold about 60,000 distinct words); a full cache of 100,000 costs about 40 MiB of memory."""


def window_spans(n_ids: int, window: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each window over ``n_ids`` document ids: consecutive, no overlap, balanced.

    ``ceil(n_ids / window)`` windows whose lengths differ by at most one id (the longer ones first), so a
    document of ``window + 5`` ids gives two windows of about half a window each rather than a full one and
    a 5-id scrap that would weigh as much in the combined score. No overlap: the windows' ids are the
    document's ids once each (``n_doc_tokens`` is the cost read), and a topic is rarely carried by the few
    words a window edge splits. A document of at most ``window`` ids (``0`` included) is one window.

    Args:
        n_ids: document ids to cover.
        window: most ids per window (``classify.max_doc_tokens``).

    Returns:
        At least one span; the spans tile ``[0, n_ids)``.
    """
    k = max(1, -(-n_ids // window))
    base, extra = divmod(n_ids, k)
    spans, start = [], 0
    for j in range(k):
        end = start + base + (j < extra)
        spans.append((start, end))
        start = end
    return spans


@dataclass(frozen=True)
class Prompt:
    """A document's classification prompt(s) as the engine receives them: token ids.

    Attributes:
        ids: the first (in ``cut`` mode the only) prompt's token ids (template prefix, document window,
            template suffix).
        n_doc_tokens: document tokens read, over every window (the document's tokens, or the budget when cut).
        truncated: whether the document was cut (tokens past ``max_doc_tokens``, or past
            ``max_doc_tokens x max_windows`` in ``windows`` mode, are not read).
        later_windows: the prompts of the document's later windows (``classify.long_documents: windows``),
            each the same prefix + its window + suffix; empty for a document of one window.
        dropped: what was not scored, in words (characters dropped before tokenising, windows without
            words), or ``None``; it goes into the result row.
        words: ``False`` when no window holds a word (a letter or digit): nothing is scored, the document is
            rejected (:meth:`classify.engine.scoring.Scorer.prompts`) and training skips it.
    """

    ids: list[int]
    n_doc_tokens: int
    truncated: bool
    later_windows: tuple[list[int], ...] = ()
    dropped: str | None = None
    words: bool = True

    @property
    def windows(self) -> list[list[int]]:
        """Every prompt of the document, first window first (one engine request each)."""
        return [self.ids, *self.later_windows]

    @property
    def n_windows(self) -> int:
        """Prompts (windows) of the document: 1 unless ``windows`` mode split it."""
        return 1 + len(self.later_windows)

    @property
    def n_tokens(self) -> int:
        """Prompt tokens the engine reads for the document, all windows together (exact: it gets these ids)."""
        return len(self.ids) + sum(len(w) for w in self.later_windows)

    @property
    def longest(self) -> int:
        """Tokens of the document's longest prompt (what must stay under ``max_model_len``)."""
        return max(len(w) for w in self.windows)

    def engine_inputs(self) -> list[dict[str, list[int]]]:
        """The vLLM prompts of every window, in order (one engine request each, all in the same call)."""
        return [{"prompt_token_ids": w} for w in self.windows]

    def text(self, tokenizer: Any) -> str:
        """The prompt decoded to a string, for display and logs only (never give it to an engine to tokenize:
        a special-token string of the document would turn into a control token)."""
        return tokenizer.decode(self.ids, skip_special_tokens=False)


def category_list(cfg: ClassifyConfig) -> str:
    """The system message's category list: one line of names, or with ``classify.descriptions`` one line per
    category (``- name: description``; a category without a description by name only)."""
    if not cfg.descriptions:
        return f"Categories: {', '.join(cfg.categories)}."
    lines = [f"- {c}: {cfg.descriptions[c]}" if c in cfg.descriptions else f"- {c}" for c in cfg.categories]
    return "Categories:\n" + "\n".join(lines)


def _messages(cfg: ClassifyConfig, document: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"{cfg.instruction}\n{category_list(cfg)}"},
        {"role": "user", "content": f"Article:\n{document}\n\nCategory:"},
    ]


def template_text(cfg: ClassifyConfig) -> str:
    """The template's own words around the document (instruction, category list, the user turn's frame), without
    the chat markup a tokenizer's template adds: what ``make plan`` bounds the template's tokens by."""
    return "".join(m["content"] for m in _messages(cfg, ""))


def render_text(tokenizer: Any, cfg: ClassifyConfig, document: str) -> str:
    """The chat template rendered around ``document`` as one string (the pre-token-id prompt, kept for checks).

    Args:
        tokenizer: the base model's Hugging Face tokenizer (with a chat template).
        cfg: categories and instruction.
        document: the document text, already cut.

    Returns:
        The prompt string, generation prompt appended.
    """
    return tokenizer.apply_chat_template(_messages(cfg, document), tokenize=False, add_generation_prompt=True)


def _control_ids(tokenizer: Any) -> dict[str, int]:
    """Every added token of ``tokenizer`` (special tokens and other control strings), content -> id."""
    found: dict[str, int] = {}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for tid, tok in decoder.items():
        found[str(getattr(tok, "content", tok))] = int(tid)
    for content in getattr(tokenizer, "all_special_tokens", []) or []:
        tid = tokenizer.convert_tokens_to_ids(content)
        if isinstance(tid, int):
            found.setdefault(content, tid)
    return found


def _space_cut(text: str, start: int, limit: int) -> int:
    """End of a chunk of ``text`` from ``start``: at most ``limit`` characters, ending before a space that follows a
    non-space, found in the chunk's last quarter; ``-1`` when there is no such space (a raw cut would be needed).

    A cut before such a space is a pre-token boundary of the byte-level BPE (GPT-2, Llama 3, Qwen regexes) and
    SentencePiece (Metaspace) tokenizers: the text's ids are the chunks' ids, one after the other.
    """
    end = start + limit
    if end >= len(text):
        return len(text)
    lo = end - limit // 4
    at = text.rfind(" ", lo, end + 1)
    while at > lo and text[at - 1].isspace():
        at = text.rfind(" ", lo, at)
    return at if at > max(lo, start) and not text[at - 1].isspace() else -1


class PromptBuilder:
    """Prompts as token ids for one (tokenizer, classify config): the template rendered once.

    Build it with :func:`prompt_builder` (cached). Thread-safe: the document tokenizer is a private copy.

    Args:
        tokenizer: the base model's Hugging Face tokenizer (fast or slow; with a chat template).
        cfg: categories, instruction and ``max_doc_tokens``.

    Attributes:
        prefix_ids: template ids before the document.
        suffix_ids: template ids after the document (ends where the answer starts).
        control_ids: ids of the tokenizer's added/special tokens (never produced from document text).
        canonical: whether prefix + document + suffix equals the ids of the rendered prompt string.
        chars_per_token: the characters-per-token estimate that sizes documents' first chunks (learned from
            the documents tokenized so far; it changes how much text is tokenized, never the ids).

    Raises:
        ValueError: the chat template does not place the document once, or a special-token string
            would still become a control token (the tokenizer cannot keep it as text).
    """

    def __init__(self, tokenizer: Any, cfg: ClassifyConfig):
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.max_doc_tokens = cfg.max_doc_tokens
        self.budget = cfg.max_doc_tokens * (cfg.max_windows if cfg.long_documents == "windows" else 1)
        rendered = render_text(tokenizer, cfg, PLACEHOLDER)
        if rendered.count(PLACEHOLDER) != 1:
            raise ValueError("the model's chat template does not place the user message exactly once; "
                             "docpilot cannot split it into prefix and suffix ids (use another base model)")
        prefix, suffix = rendered.split(PLACEHOLDER)
        self.prefix_ids: list[int] = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        self.suffix_ids: list[int] = list(tokenizer(suffix, add_special_tokens=False)["input_ids"])
        self.control = _control_ids(tokenizer)
        self.control_ids = frozenset(self.control.values())
        self._lock = threading.Lock()
        self.chars_per_token = float(FIRST_CHUNK_CHARS_PER_TOKEN)
        self._fast = self._fast_copy(tokenizer)
        self._word_ids: bytes | None = None
        self._self_check()

    @staticmethod
    def _fast_copy(tokenizer: Any) -> Any:
        """A private copy of the Rust tokenizer that keeps special-token strings as text, or ``None`` (slow tokenizer)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            return None
        from tokenizers import AddedToken, Tokenizer

        fast = Tokenizer.from_str(backend.to_str())
        fast.no_truncation()
        fast.no_padding()
        plain = [tok.content for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
                 if not getattr(tok, "special", True)]
        if plain:  # added tokens not flagged special (``<think>``...) are control strings too: keep them as text
            fast.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in plain])
        fast.encode_special_tokens = True  # added special tokens are matched as plain text
        resize = getattr(fast.model, "_resize_cache", None)  # BPE: words already seen skip the merges
        if resize is not None:
            resize(BPE_CACHE_WORDS)
        return fast

    def _self_check(self) -> None:
        """Raise unless special-token strings stay text; note whether prefix + document + suffix == the rendered ids.

        ``canonical`` is False (and a warning logged) for a tokenizer whose pre-tokenizer joins the template's
        text with the document's (SentencePiece ``Metaspace`` without a split at the newline): the prompt is
        then the same ids on every path (training included), only not the ids of the rendered string.
        """
        forged = self.control_ids - {getattr(self.tokenizer, "unk_token_id", None)}  # <unk>: unknown text, no structure
        for content in self.control:
            ids = self.encode([f"a {content} b", content])
            if any(t in forged for doc in ids for t in doc):
                raise ValueError(f"the tokenizer turns the document text {content!r} into a control token even in "
                                 "plain-text mode; docpilot cannot keep documents from forging the prompt")
        sample = "Shares rose 3% on Monday. The striker scored twice; the minister said \"no\"."
        whole = self.tokenizer(render_text(self.tokenizer, self.cfg, sample), add_special_tokens=False)["input_ids"]
        self.canonical = self.prefix_ids + self.encode([sample])[0] + self.suffix_ids == list(whole)
        if not self.canonical:
            log.warning("this tokenizer joins the chat template's text with the document's: the token-id prompt "
                        "differs from the rendered string's tokens at the document's edges (the same on every path, "
                        "training included)")

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text as plain text (special-token strings stay text), in one batched call.

        Args:
            texts: document texts (not cut).

        Returns:
            One id list per text.
        """
        if not texts:
            return []
        if self._fast is not None:
            return [e.ids for e in self._fast.encode_batch_fast(list(texts), add_special_tokens=False)]
        with self._lock:  # a slow tokenizer: its own plain-text mode, one batch call
            out = self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [list(ids) for ids in out]

    def document_ids(self, texts: Sequence[str]) -> list[tuple[list[int], bool]]:
        """Each document's ids cut to the builder's :attr:`budget`, and whether it was cut.

        The budget is ``max_doc_tokens`` (``cut``), or ``max_doc_tokens x max_windows`` (``windows``); below
        it is written ``max_doc_tokens``. The ids are the whole document's first ``max_doc_tokens`` ids, computed from as little text as
        possible, in rounds of one batched tokenizer call each:

        * first round: every document's first chunk, ending before a space, sized for ``max_doc_tokens + 1``
          ids at the builder's current characters-per-token estimate (:attr:`chars_per_token`: learned from
          the documents it has tokenized, :data:`FIRST_CHUNK_CHARS_PER_TOKEN` before any);
        * later rounds, only for a document still short of ``max_doc_tokens + 1`` ids: a chunk sized for
          the ids it still lacks at its own characters per token so far (:data:`NEXT_CHUNK_MARGIN`), ending
          before a space;
        * a document with no space near a chunk's end (long unbroken text) is tokenized from its start
          again, 4x longer each round, until it has 32 ids beyond the budget or is whole.

        The estimate changes only how much text is tokenized, never the ids.

        Args:
            texts: document texts.

        Returns:
            ``(ids, truncated)`` per text, in order.
        """
        n = self.budget
        need = n + 1  # ids that show the document is over the budget
        out: list[tuple[list[int], bool] | None] = [None] * len(texts)
        first = int(need * self.chars_per_token) + 16
        state: dict[int, list[Any]] = {}  # document -> [ids so far, characters done, raw length (0: chunks)]
        ratios: list[float] = []  # characters per id of the first chunks that were not whole
        todo: Sequence[int] = range(len(texts))
        while todo:
            jobs: list[tuple[int, int]] = []  # (document, end of its chunk)
            pieces: list[str] = []
            for i in todo:
                text = texts[i]
                st = state.get(i)
                if st is not None and st[2]:
                    end = min(len(text), st[2])
                    jobs.append((i, end))
                    pieces.append(text[:end])
                    continue
                if st is None:
                    pos, step = 0, first
                else:
                    pos, got = st[1], len(st[0])
                    rate = max(1.0, pos / max(1, got))  # this document's characters per id so far
                    step = int((need - got) * NEXT_CHUNK_MARGIN * rate) + NEXT_CHUNK_SLACK
                end = _space_cut(text, pos, step)
                if end < 0 and pos:
                    step *= 4
                    end = _space_cut(text, pos, step)
                if end < 0:
                    raw = max(4 * (pos + step), 2 * step)
                    state[i] = [[], 0, raw]
                    end = min(len(text), raw)
                    jobs.append((i, end))
                    pieces.append(text[:end])
                else:
                    jobs.append((i, end))
                    pieces.append(text[pos:end])
            encoded = self.encode(pieces)
            again = []
            for (i, end), ids in zip(jobs, encoded, strict=True):
                whole = end >= len(texts[i])
                st = state.get(i)
                if st is None:  # a first chunk
                    if not whole and ids:
                        ratios.append(end / len(ids))
                    if whole or len(ids) > n:
                        out[i] = (ids[:n], len(ids) > n)
                    else:
                        state[i] = [ids, end, 0]
                        again.append(i)
                elif st[2]:
                    if whole or len(ids) > n + 32:
                        out[i] = (ids[:n], len(ids) > n)
                        del state[i]
                    else:
                        st[2] *= 4
                        again.append(i)
                else:
                    got = st[0]
                    got += ids
                    if whole or len(got) > n:
                        out[i] = (got[:n], len(got) > n)
                        del state[i]
                    else:
                        st[1] = end
                        again.append(i)
            if ratios:
                self._learn(ratios)
                ratios = []
            todo = again
        return out  # type: ignore[return-value]

    def _learn(self, ratios: list[float]) -> None:
        """Set :attr:`chars_per_token` from one round's first chunks (characters per id, one per document).

        The new estimate is their :data:`FIRST_CHUNK_QUANTILE` quantile (at least 8 documents), blended with
        the old one by their share of :data:`LEARN_WINDOW` documents, kept within [1, 16].
        """
        if len(ratios) < 8:
            return
        ratios.sort()
        seen = ratios[int(FIRST_CHUNK_QUANTILE * (len(ratios) - 1))]
        weight = min(1.0, len(ratios) / LEARN_WINDOW)
        self.chars_per_token = min(16.0, max(1.0, (1 - weight) * self.chars_per_token + weight * seen))

    def word_ids(self) -> bytes:
        """Per token id, ``1`` when the token's text holds a letter or a digit (or is part of a character split over
        several byte tokens), else ``0``: the table that tells a window with words from one without. Built once per
        builder (every id of the vocabulary decoded alone, one batched call); empty for a tokenizer that does not
        tell its size (every id then counts as a word)."""
        if self._word_ids is None:
            try:
                n = len(self.tokenizer)
            except TypeError:
                self._word_ids = b""
                return self._word_ids
            ids = [[i] for i in range(n)]
            pieces = (self._fast.decode_batch(ids, skip_special_tokens=False) if self._fast is not None
                      else self.tokenizer.batch_decode(ids, skip_special_tokens=False))
            table = bytearray(n)
            for i, piece in enumerate(pieces):
                if i not in self.control_ids and ("\ufffd" in piece or any(ch.isalnum() for ch in piece)):
                    table[i] = 1
            self._word_ids = bytes(table)
        return self._word_ids

    def has_words(self, ids: Sequence[int]) -> bool:
        """Whether document ids hold a word (:meth:`word_ids`); an id past the table counts as one."""
        table = self.word_ids()
        n = len(table)
        return any(i >= n or table[i] for i in ids)

    def _normalised(self, text: str) -> Normalised:
        """:func:`classify.documents.text.normalise_text` of the part of ``text`` the budget can read.

        A text over :data:`NORMALISE_CHARS_PER_TOKEN` x budget characters (+ 1,024) is normalised up to there only,
        so a 200 KB document costs what a short one does: at most 32 characters per token of what is left (no
        tokenizer comes near) still gives more ids than the budget. When padding leaves less than half of that
        prefix, the whole text is normalised (rare: a document that is mostly padding).
        """
        limit = self.budget * NORMALISE_CHARS_PER_TOKEN + 1024
        if len(text) <= limit:
            return normalise_text(text)
        head = normalise_text(text[:limit])
        return head if len(head.text) >= limit // 2 else normalise_text(text)

    def build(self, texts: Sequence[str]) -> list[Prompt]:
        """The prompts of ``texts``, normalised and tokenized in one batch.

        Each text is first normalised (:func:`classify.documents.text.normalise_text`: invisible characters and
        whitespace padding dropped), then tokenized and cut (:meth:`document_ids`) and split into windows
        (:func:`window_spans`). A window without a word (:meth:`has_words`) is never scored: it is left out of the
        prompts (and of ``n_doc_tokens``); a document with none left gets ``words=False``.

        Args:
            texts: decoded documents.

        Returns:
            One :class:`Prompt` per text, in order; ``ids`` = prefix + (first scored window of the) document + suffix;
            ``dropped`` says what was not scored.
        """
        prefix, suffix, window = self.prefix_ids, self.suffix_ids, self.max_doc_tokens
        normalised = [self._normalised(t) for t in texts]
        out = []
        for (ids, cut), norm in zip(self.document_ids([n.text for n in normalised]), normalised, strict=True):
            spans = window_spans(len(ids), window)
            kept = [(a, b) for a, b in spans if self.has_words(ids[a:b])]
            notes = [norm.note()] if norm.note() else []
            if len(kept) < len(spans) and kept:
                notes.append(f"{len(spans) - len(kept)} of {len(spans)} windows without words not scored")
            dropped = "; ".join(notes) or None
            if not kept:
                out.append(Prompt(prefix + ids + suffix, 0, cut, (), dropped, words=False))
                continue
            prompts = [prefix + ids[a:b] + suffix for a, b in kept]
            out.append(Prompt(prompts[0], sum(b - a for a, b in kept), cut, tuple(prompts[1:]), dropped))
        return out


_BUILDERS: dict[tuple[int, str], tuple[Any, PromptBuilder]] = {}
_BUILDERS_LOCK = threading.Lock()


def prompt_builder(tokenizer: Any, cfg: ClassifyConfig) -> PromptBuilder:
    """The :class:`PromptBuilder` of (``tokenizer``, ``cfg``), rendered once and cached (a few entries).

    Args:
        tokenizer: the base model's tokenizer.
        cfg: the classify config.

    Returns:
        The cached builder.

    Raises:
        ValueError: see :class:`PromptBuilder`.
    """
    key = (id(tokenizer), cfg.model_dump_json())
    with _BUILDERS_LOCK:
        hit = _BUILDERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    builder = PromptBuilder(tokenizer, cfg)
    with _BUILDERS_LOCK:
        if len(_BUILDERS) >= 8:
            _BUILDERS.pop(next(iter(_BUILDERS)))
        _BUILDERS[key] = (tokenizer, builder)  # holds the tokenizer: its id cannot be reused while cached
    return builder


def build_prompts(tokenizer: Any, cfg: ClassifyConfig, texts: Sequence[str]) -> list[Prompt]:
    """Build the prompts of many documents in one batch (the path of pilot, batch, serve and training).

    Args:
        tokenizer: the base model's Hugging Face tokenizer (with a chat template).
        cfg: categories, instruction and ``max_doc_tokens``.
        texts: decoded documents.

    Returns:
        One :class:`Prompt` per text, in order.
    """
    return prompt_builder(tokenizer, cfg).build(texts)


def build_prompt(tokenizer: Any, cfg: ClassifyConfig, text: str) -> Prompt:
    """Build the classification prompt (token ids) for one document.

    Args:
        tokenizer: the base model's Hugging Face tokenizer (with a chat template).
        cfg: categories, instruction and ``max_doc_tokens``.
        text: the decoded document.

    Returns:
        A :class:`Prompt`; ``n_tokens`` counts the full prompt.

    Example:
        >>> p = build_prompt(tok, ClassifyConfig(), "Shares rose...")  # doctest: +SKIP
        >>> p.text(tok).endswith("<|im_start|>assistant\\n")  # doctest: +SKIP
        True
    """
    return build_prompts(tokenizer, cfg, [text])[0]


def set_tokenizer_threads(n: int | None = None) -> int:
    """Size the Rust tokenizer's thread pool to this process's cores (call before the first batch encode).

    Sets ``RAYON_NUM_THREADS`` (the pool ``tokenizers`` uses for batch encoding) and
    ``TOKENIZERS_PARALLELISM=true`` unless already set by the user.

    Args:
        n: threads; ``None`` takes the CPUs this process may run on (``os.sched_getaffinity``).

    Returns:
        The thread count asked for.
    """
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, n)))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    return int(os.environ["RAYON_NUM_THREADS"])


def answer_text(tokenizer: Any, category: str) -> str:
    """The exact assistant answer the model is trained to give: the category, then end-of-turn."""
    return f"{category}{tokenizer.eos_token}"


def build_training_examples(tokenizer: Any, cfg: ClassifyConfig, texts: Sequence[str],
                            categories: Sequence[str]) -> list[dict[str, list[int]]]:
    """Token ids and labels for supervised examples, from the engine's own prompt ids; the loss is on the answer only.

    Training sees what inference sees: with ``classify.long_documents: windows`` a document over
    ``max_doc_tokens`` tokens gives one example per window (the engine's windows, at most ``max_windows``),
    each labelled with the document's category; in ``cut`` mode one example per document.

    Args:
        tokenizer: the base model's tokenizer.
        cfg: the same classify config the engine will use.
        texts: the documents.
        categories: their labels, each in ``cfg.categories``.

    Returns:
        ``{"input_ids": [...], "labels": [...]}`` per window (per document in ``cut`` mode), documents in order,
        each of equal length; prompt positions carry
        ``-100`` (ignored by ``torch.nn.CrossEntropyLoss``), answer positions the answer token ids.

    Raises:
        ValueError: a category is not an allowed category.
    """
    for category in categories:
        if category not in cfg.categories:
            raise ValueError(f"`category` must be one of {list(cfg.categories)}, got {category!r}")
    answers = {c: list(tokenizer(answer_text(tokenizer, c), add_special_tokens=False)["input_ids"])
               for c in set(categories)}
    out = []
    for prompt, category in zip(build_prompts(tokenizer, cfg, texts), categories, strict=True):
        if not prompt.words:  # nothing to learn from: no window holds a word (inference rejects it too)
            log.warning("a training document without words is skipped (%s)", prompt.dropped or "no letter or digit")
            continue
        answer = answers[category]
        out += [{"input_ids": ids + answer, "labels": [-100] * len(ids) + answer} for ids in prompt.windows]
    return out


def category_first_tokens(tokenizer: Any, categories: tuple[str, ...]) -> list[int] | None:
    """First answer token of each category, or ``None`` when two categories share one.

    Args:
        tokenizer: the base model's tokenizer.
        categories: the allowed categories.

    Returns:
        Token ids aligned with ``categories`` when all are distinct (the single-forward-pass
        scoring applies), else ``None`` (fall back to structured-output ``choice``).
    """
    firsts = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in categories]
    return firsts if len(set(firsts)) == len(firsts) else None
