"""Label scoring: documents to prompts and sampling parameters, vLLM outputs to result records.

:class:`Scorer` is shared by the offline engine (:class:`classify.engine.build.Classifier`: pilot,
Ray batch actors, benchmarks) and the server's async engine (``serve/engine.py``), so a
document gets the same record on every path.

Scoring (design card, "Backends and models"):

* ``first-token``: one forward pass, ``max_tokens=1`` with ``allowed_token_ids``
  restricted to the categories' distinct first tokens; the engine runs with
  ``logprobs_mode="processed_logprobs"``, so the returned log-probs are already
  normalised over the allowed tokens and ``score`` is the chosen category's
  probability among the categories.
* ``choice``: structured output (``StructuredOutputsParams(choice=categories)``) when
  first tokens collide; ``score`` is ``exp(cumulative_logprob)`` of the constrained answer.

Calibration: an adapter card may hold ``calibration.temperature`` T (fitted on the validation
split by ``make train``). In ``first-token`` mode the score is then ``softmax(logprobs / T)``
over the categories, taken at the chosen category; T = 1 (no card value, or the base model)
gives the raw probability, bit for bit. The temperature rides on :class:`AdapterHandle`
(LoRA mode, pilot, batch and serve alike) or is passed explicitly when the adapter is merged
into the weights (:meth:`classify.engine.build.Classifier.classify`'s ``temperature``). ``choice`` scores are
left as they are: only the chosen answer's log-prob is known there, not the other categories'.

Long documents (``classify.long_documents: windows``): a document over ``max_doc_tokens`` tokens is scored as
several windows (:func:`classify.engine.prompt.window_spans`), all sent in the same engine call, and combined here
into one record (:meth:`Scorer.result` with one completion per window):

* ``first-token``: each category's log-prob is the MEAN of its per-window first-token log-probs (the
  renormalised geometric mean of the windows' probabilities), the category is the arg-max of that mean and
  the score its (tempered) softmax. Why the mean of log-probs: (1) it is the same kind of quantity as one
  window's log-probs, on the same scale whatever the window count, so the calibration temperature T fitted on
  it (training's check fits T on these combined log-probs) applies unchanged and confidence does not grow
  just because a document is long; (2) every window is equal evidence, so the part of a document that
  carries its topic counts wherever it sits; (3) a window that is confident AGAINST a category pulls it
  down (a geometric mean is a soft veto), which keeps a document whose windows disagree from a high score.
* ``choice``: each window's answer votes with its probability; the category with the largest summed vote
  wins and its score is that sum over the window count.

A document of one window (every document in ``cut`` mode) takes the one-window path unchanged: identical
categories and scores in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from classify.config.sections import ClassifyConfig
from classify.engine.prompt import Prompt, category_first_tokens, prompt_builder
from classify.errors import EngineError
from classify.records import Document, Result


@dataclass(frozen=True)
class AdapterHandle:
    """A LoRA adapter the engine can apply, already verified by the registry.

    Attributes:
        name: ``name@version`` handle (what results and logs show).
        path: local folder with ``adapter_config.json`` and the adapter weights.
        int_id: positive integer vLLM uses to tell adapters apart (stable per name@version).
        sha256: the adapter's content hash from its card.
        temperature: score temperature from the card's ``calibration.temperature`` (1.0: none).
    """

    name: str
    path: str
    int_id: int
    sha256: str = ""
    temperature: float = 1.0

    def lora_request(self) -> Any:
        """Return the ``vllm.lora.request.LoRARequest`` for this adapter."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.int_id, self.path)


def softmax_at(logprobs: Mapping[Any, float], key: Any, temperature: float = 1.0) -> float:
    """``softmax(logprobs / temperature)[key]``: the tempered probability of ``key`` among ``logprobs``' keys.

    Args:
        logprobs: natural-log probabilities (any scale; they are renormalised), one per category.
        key: the entry whose probability is returned (must be in ``logprobs``).
        temperature: T > 0; 1.0 renormalises without scaling (``v / 1.0 == v`` exactly).

    Returns:
        A probability in [0, 1].
    """
    if temperature == 1.0:  # the raw path, unchanged (the records of an uncalibrated adapter stay byte-identical)
        norm = math.log(sum(math.exp(v) for v in logprobs.values()))
        return math.exp(logprobs[key] - norm)
    scaled = {k: v / temperature for k, v in logprobs.items()}
    top = max(scaled.values())  # shift: with T < 1 every exp(v / T) may underflow to 0
    return math.exp(scaled[key] - top - math.log(sum(math.exp(v - top) for v in scaled.values())))


def mean_logprobs(windows: Sequence[Mapping[Any, float]]) -> dict[Any, float]:
    """The combined log-probs of a document's windows: per key, the mean of its per-window log-probs.

    Args:
        windows: one mapping key (category token id) -> log-prob per window.

    Returns:
        One window's mapping as it is (the one-window path, bit for bit); for several, the keys present in
        every window (in the first window's order), each with the mean of its log-probs.
    """
    if len(windows) == 1:
        return dict(windows[0])
    return {k: sum(w[k] for w in windows) / len(windows) for k in windows[0] if all(k in w for w in windows)}


class Scorer:
    """Prompts in, results out: the engine-independent half of classification.

    Args:
        tokenizer: the base model's tokenizer.
        classify_cfg: categories, instruction, budgets and scoring mode.
        max_model_len: the engine's context length in tokens.

    Raises:
        ConfigError-like ``EngineError``: ``scoring="first-token"`` asked for but first tokens collide, or the
            model's tokenizer/chat template cannot give token-id prompts (:class:`classify.engine.prompt.PromptBuilder`).
    """

    def __init__(self, tokenizer: Any, classify_cfg: ClassifyConfig, max_model_len: int):
        self.tokenizer = tokenizer
        self.cfg = classify_cfg
        self.max_model_len = max_model_len
        firsts = category_first_tokens(tokenizer, classify_cfg.categories)
        if classify_cfg.scoring == "first-token" and firsts is None:
            raise EngineError(
                "`classify.engine.scoring` is 'first-token' but two categories share a first token; "
                "use 'auto' or 'choice'"
            )
        self.mode = "choice" if classify_cfg.scoring == "choice" or firsts is None else "first-token"
        self.first_tokens = firsts or []
        self._token_to_category = dict(zip(self.first_tokens, classify_cfg.categories, strict=False))
        try:
            self.builder = prompt_builder(tokenizer, classify_cfg)
        except ValueError as err:
            raise EngineError(f"cannot build token-id prompts for this model: {err}") from err

    def prompt(self, doc: Document) -> Prompt | Result:
        """Build ``doc``'s prompt (token ids), or return its rejected result (:meth:`prompts` of one document)."""
        return self.prompts([doc])[0]

    def prompts(self, docs: Sequence[Document]) -> list[Prompt | Result]:
        """Build the prompts (token ids) of many documents in one batched tokenizer call.

        The one prompt path of pilot, batch and serve (:class:`classify.engine.prompt.PromptBuilder`: the
        template's ids rendered once, each document tokenized once as plain text and cut).

        Args:
            docs: documents; rejected ones (unreadable, empty, ...) come back as their rejected result.

        Returns:
            Per document, in order: its :class:`Prompt`, or a rejected :class:`Result` (rejected at
            reading, no word left to score (``no words: ...``), or prompt not under ``max_model_len``).
        """
        out: list[Prompt | Result] = [Result.rejected(d, d.reject_reason or "no text")
                                      if d.reject_reason is not None or d.text is None else None  # type: ignore[misc]
                                      for d in docs]
        todo = [i for i, r in enumerate(out) if r is None]
        built = self.builder.build([docs[i].text for i in todo])  # type: ignore[misc]
        for i, prompt in zip(todo, built, strict=True):
            if not prompt.words:
                out[i] = Result.rejected(docs[i], "no words: nothing to classify (no letter or digit"
                                         + (f"; dropped {prompt.dropped})" if prompt.dropped else ")"))
            elif prompt.longest >= self.max_model_len:
                out[i] = Result.rejected(
                    docs[i],
                    f"prompt is {prompt.longest} tokens, over max_model_len {self.max_model_len} "
                    "(lower classify.max_doc_tokens or raise model.max_model_len)",
                    prompt.n_tokens,
                )
            else:
                out[i] = prompt
        return out

    def sampling_params(self) -> Any:
        """The ``vllm.SamplingParams`` for the current scoring mode (greedy, seeded)."""
        from vllm import SamplingParams

        if self.mode == "first-token":
            return SamplingParams(
                max_tokens=1,
                temperature=0.0,
                allowed_token_ids=list(self.first_tokens),
                logprobs=len(self.first_tokens),
            )
        from vllm.sampling_params import StructuredOutputsParams

        longest = max(len(self.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in self.cfg.categories)
        return SamplingParams(
            max_tokens=longest + 1,
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(choice=list(self.cfg.categories)),
            logprobs=1,
        )

    def result(self, doc: Document, prompt: Prompt, completion: Any, temperature: float = 1.0) -> Result:
        """Turn the vLLM output(s) of one document into its result record.

        Args:
            doc: the document.
            prompt: its prompt(s) (:class:`classify.engine.prompt.Prompt`; ``n_windows`` windows).
            completion: vLLM's ``CompletionOutput``, or a sequence of them, one per window of ``prompt`` in
                window order (combined as the module docstring says).
            temperature: score temperature T (first-token mode: ``softmax(logprobs / T)``; 1.0 = raw).

        Returns:
            ``accepted`` with an allowed category and its probability (and ``review`` when
            ``classify.review_below_score`` is set: :func:`needs_review`), or ``rejected`` with the
            reason when the engine answered outside the allowed set (never silently dropped). The record
            carries ``n_tokens`` (every window's prompt), ``n_doc_tokens``, ``n_windows``, ``truncated``, and
            ``dropped`` when padding or windows without words were not scored.
        """
        completions = list(completion) if isinstance(completion, (list, tuple)) else [completion]
        if len(completions) != prompt.n_windows:
            raise EngineError(f"{len(completions)} engine outputs for a document of {prompt.n_windows} windows")
        if self.mode == "first-token":
            category, score = self._first_token(completions, temperature)
        else:
            category, score = self._choice(completions)
        if category not in self.cfg.categories:
            return Result.rejected(doc, f"engine answer {completions[0].text!r} is not an allowed category",
                                   prompt.n_tokens)
        score = None if score is None else min(1.0, max(0.0, round(score, 6)))
        return Result(
            id=doc.id,
            status="accepted",
            category=category,
            score=score,
            input_sha256=doc.input_sha256,
            n_chars=doc.n_chars,
            n_tokens=prompt.n_tokens,
            n_doc_tokens=prompt.n_doc_tokens,
            n_windows=prompt.n_windows,
            truncated=prompt.truncated,
            review=needs_review(score, self.cfg.review_below_score),
            dropped=prompt.dropped,
        )

    def window_logprobs(self, completion: Any) -> dict[int, float]:
        """First-token log-probs of the categories in one window's ``CompletionOutput``: category token id -> log-prob."""
        logprobs = completion.logprobs[0] if completion.logprobs else {}
        return {tid: lp.logprob for tid, lp in logprobs.items() if tid in self._token_to_category}

    def combined_logprobs(self, completions: Sequence[Any]) -> dict[int, float]:
        """A document's category log-probs (first-token mode): one window's as they are, several windows' averaged.

        Args:
            completions: one ``CompletionOutput`` per window.

        Returns:
            Category token id -> log-prob: for one window :meth:`window_logprobs`; for several, the mean over
            the windows of each category present in every window (:func:`mean_logprobs`).
        """
        return mean_logprobs([self.window_logprobs(c) for c in completions])

    def _first_token(self, completions: list[Any], temperature: float) -> tuple[str | None, float | None]:
        """Category and score of first-token scoring over a document's windows (one window: the chosen token)."""
        cat_lp = self.combined_logprobs(completions)
        if len(completions) == 1:
            c = completions[0]
            token = c.token_ids[0] if c.token_ids else None
        else:
            token = max(cat_lp, key=cat_lp.__getitem__) if cat_lp else None  # the first category on a tie
        category = self._token_to_category.get(token)  # type: ignore[arg-type]
        score = softmax_at(cat_lp, token, temperature) if category is not None and token in cat_lp else None
        return category, score

    def _choice(self, completions: list[Any]) -> tuple[str | None, float | None]:
        """Category and score of structured-output scoring over a document's windows (probability-weighted vote)."""
        answers = []
        for c in completions:
            score = math.exp(c.cumulative_logprob) if c.cumulative_logprob is not None else None
            answers.append((c.text.strip(), score))
        if len(answers) == 1:
            return answers[0]
        votes: dict[str, float] = {}
        for text, score in answers:
            if text in self.cfg.categories:
                votes[text] = votes.get(text, 0.0) + (score or 0.0)
        if not votes:
            return answers[0][0], None
        best = max(votes, key=votes.__getitem__)
        return best, votes[best] / len(answers)


def needs_review(score: float | None, review_below_score: float | None) -> bool | None:
    """The ``review`` flag of an accepted result (``classify.review_below_score``).

    Args:
        score: the result's score (0-1), or ``None`` when no log-prob came back.
        review_below_score: the threshold, ``None`` when off.

    Returns:
        ``None`` when the threshold is off (the record carries no ``review`` field); else ``True``
        when ``score < review_below_score`` or the score is unknown, ``False`` otherwise.
    """
    if review_below_score is None:
        return None
    return score is None or score < review_below_score


def resolve_temperature(adapter: AdapterHandle | None, temperature: float | None = None) -> float:
    """The temperature to score with: ``temperature`` if given, else the adapter's, else 1.0."""
    if temperature is not None:
        return temperature
    return adapter.temperature if adapter is not None else 1.0
