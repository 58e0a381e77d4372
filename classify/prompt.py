"""The one prompt builder, shared by training, pilot, batch and serve.

The prompt is the model's chat template over a system message (instruction +
category list) and a user message (the document cut to ``max_doc_tokens``
tokens), ending where the assistant's answer starts. The answer is the bare
category name followed by the end-of-turn token, so a LoRA adapter trained on
:func:`build_training_example` answers in exactly the format the engine scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from classify.config import ClassifyConfig


@dataclass(frozen=True)
class Prompt:
    """A rendered classification prompt.

    Attributes:
        text: the full prompt string (chat template applied, generation prompt appended).
        n_tokens: tokens of ``text`` as the engine will see it.
        n_doc_tokens: tokens of the (possibly cut) document inside the prompt.
        truncated: whether the document was cut to ``max_doc_tokens``.
    """

    text: str
    n_tokens: int
    n_doc_tokens: int
    truncated: bool


def _messages(cfg: ClassifyConfig, document: str) -> list[dict[str, str]]:
    categories = ", ".join(cfg.categories)
    return [
        {"role": "system", "content": f"{cfg.instruction}\nCategories: {categories}."},
        {"role": "user", "content": f"Article:\n{document}\n\nCategory:"},
    ]


def cut_document(tokenizer: Any, text: str, max_doc_tokens: int) -> tuple[str, int, bool]:
    """Cut ``text`` to at most ``max_doc_tokens`` tokens.

    Args:
        tokenizer: a Hugging Face tokenizer (``__call__`` and ``decode``).
        text: the document.
        max_doc_tokens: token budget for the document.

    Returns:
        ``(text, n_tokens, truncated)``; ``text`` is unchanged when it fits.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_doc_tokens:
        return text, len(ids), False
    return tokenizer.decode(ids[:max_doc_tokens]), max_doc_tokens, True


def build_prompt(tokenizer: Any, cfg: ClassifyConfig, text: str) -> Prompt:
    """Render the classification prompt for one document.

    Args:
        tokenizer: the base model's Hugging Face tokenizer (with a chat template).
        cfg: categories, instruction and ``max_doc_tokens``.
        text: the decoded document.

    Returns:
        A :class:`Prompt`; ``n_tokens`` counts the full prompt.

    Example:
        >>> p = build_prompt(tok, ClassifyConfig(), "Shares rose...")  # doctest: +SKIP
        >>> p.text.endswith("<|im_start|>assistant\\n")  # doctest: +SKIP
        True
    """
    cut, n_doc, truncated = cut_document(tokenizer, text, cfg.max_doc_tokens)
    rendered = tokenizer.apply_chat_template(_messages(cfg, cut), tokenize=False, add_generation_prompt=True)
    n_tokens = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return Prompt(rendered, n_tokens, n_doc, truncated)


def answer_text(tokenizer: Any, category: str) -> str:
    """The exact assistant answer the model is trained to give: the category, then end-of-turn."""
    return f"{category}{tokenizer.eos_token}"


def build_training_example(tokenizer: Any, cfg: ClassifyConfig, text: str, category: str) -> dict[str, list[int]]:
    """Token ids and labels for one supervised example; the loss is on the answer only.

    Args:
        tokenizer: the base model's tokenizer.
        cfg: the same classify config the engine will use.
        text: the document.
        category: its label; must be in ``cfg.categories``.

    Returns:
        ``{"input_ids": [...], "labels": [...]}`` of equal length; prompt positions carry ``-100``
        (ignored by ``torch.nn.CrossEntropyLoss``), answer positions carry the answer token ids.

    Raises:
        ValueError: ``category`` is not an allowed category.
    """
    if category not in cfg.categories:
        raise ValueError(f"`category` must be one of {list(cfg.categories)}, got {category!r}")
    prompt = build_prompt(tokenizer, cfg, text)
    prompt_ids = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer_text(tokenizer, category), add_special_tokens=False)["input_ids"]
    return {"input_ids": prompt_ids + answer_ids, "labels": [-100] * len(prompt_ids) + answer_ids}


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
