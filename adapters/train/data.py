"""Training data: read and check every row before any training starts, split, tokenize, batch."""

from __future__ import annotations

import csv
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classify.config.training import DataSection
from classify.documents.text import check_text
from classify.engine.prompt import build_training_examples
from classify.errors import ConfigError, InputError
from classify.paths import path_hint
from classify.runs.files import file_sha256

MAX_LISTED = 5
"""Bad rows named in one error message (the rest are counted)."""


@dataclass(frozen=True)
class Row:
    """One labelled training row. ``id`` is ``<file stem>-<row index, 4 digits>``."""

    id: str
    text: str
    category: str


def _read_rows(path: Path, cfg: DataSection) -> list[dict[str, Any]]:
    fmt = cfg.format if cfg.format != "auto" else ("jsonl" if path.suffix in (".jsonl", ".json") else "csv")
    if fmt == "csv":
        csv.field_size_limit(sys.maxsize)
        try:
            with path.open(encoding="utf-8-sig", newline="") as fh:
                reader = csv.DictReader(fh, strict=True)  # an unclosed quote is an error, not one merged row
                header = list(reader.fieldnames or [])
                missing = [c for c in (cfg.text_column, cfg.category_column) if c not in header]
                if missing:
                    raise InputError(
                        f"{path}: training data has no column(s) {missing} (header: {header}); "
                        "set train.data.text_column / train.data.category_column"
                    )
                return list(reader)
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            raise InputError(f"{path}: cannot read training CSV: {err}") from None
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read training JSONL: {err}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{n}: not valid JSON: {err}") from None
        missing = [c for c in (cfg.text_column, cfg.category_column) if not isinstance(record, dict) or c not in record]
        if missing:
            raise InputError(f"{path}:{n}: training record has no key(s) {missing}; set train.data.text_column / train.data.category_column")
        rows.append(record)
    return rows


def load_rows(cfg: DataSection, categories: tuple[str, ...]) -> tuple[list[Row], str]:
    """Read and check every training row.

    Args:
        cfg: the data section.
        categories: the allowed categories (``classify.categories``).

    Returns:
        ``(rows, sha256 of the data file)``.

    Raises:
        InputError: missing file or column, unreadable file, empty/non-text text or an unknown
            category in any row (the message names the first rows and counts the rest).
    """
    path = cfg.resolved_path()
    if not path.is_file():
        raise InputError(f"training data {path} does not exist (`train.data.path` in the config file){path_hint(cfg.path)}")
    raw = _read_rows(path, cfg)
    if not raw:
        raise InputError(f"{path}: training data has no rows")
    rows, bad_text, bad_cat = [], [], []
    for index, record in enumerate(raw):
        text, category = record.get(cfg.text_column), record.get(cfg.category_column)
        row_id = f"{path.stem}-{index:04d}"
        reason = f"`{cfg.text_column}` must be a string, got {type(text).__name__}" if not isinstance(text, str) else check_text(text)[1]
        if reason:
            bad_text.append(f"{row_id} ({reason})")
        if category not in categories:
            bad_cat.append(f"{row_id} ({category!r})")
        if not reason and category in categories:
            rows.append(Row(row_id, text, category))
    problems = []
    if bad_cat:
        problems.append(
            f"{len(bad_cat)} row(s) have a `{cfg.category_column}` outside {list(categories)}: "
            + ", ".join(bad_cat[:MAX_LISTED]) + (" ..." if len(bad_cat) > MAX_LISTED else "")
        )
    if bad_text:
        problems.append(
            f"{len(bad_text)} row(s) have unusable `{cfg.text_column}`: "
            + ", ".join(bad_text[:MAX_LISTED]) + (" ..." if len(bad_text) > MAX_LISTED else "")
        )
    if problems:
        raise InputError(f"{path}: bad training data, nothing was trained: " + "; ".join(problems))
    return rows, file_sha256(path)


def split_rows(rows: list[Row], cfg: DataSection, seed: int) -> tuple[list[Row], list[Row]]:
    """Stratified, seeded split: ``validation_rows`` held out with each category's share of the data.

    A pure function of ``(rows, validation_rows, max_train_rows, seed)``: each category's rows
    (in file order) are shuffled with ``random.Random(f"{seed}:{category}")``; category ``c`` gives
    ``round(validation_rows * n_c / n)`` rows (largest remainders settle the rounding, ties by
    category name); the validation and training lists are then shuffled with ``random.Random(seed)``
    so that any prefix of them mixes the categories. At most ``max_train_rows`` training rows are kept.

    Returns:
        ``(train, validation)`` lists of :class:`Row`; no row is in both.

    Raises:
        InputError: fewer rows than the validation share plus one training row.
    """
    if len(rows) <= cfg.validation_rows:
        raise InputError(f"training data has {len(rows)} rows; need more than data.validation_rows={cfg.validation_rows}")
    by_cat: dict[str, list[Row]] = {}
    for row in rows:
        by_cat.setdefault(row.category, []).append(row)
    cats = sorted(by_cat)
    exact = {c: cfg.validation_rows * len(by_cat[c]) / len(rows) for c in cats}
    take = {c: int(exact[c]) for c in cats}
    for c in sorted(cats, key=lambda c: (-(exact[c] - take[c]), c))[: cfg.validation_rows - sum(take.values())]:
        take[c] += 1
    val, train = [], []
    for c in cats:
        group = list(by_cat[c])
        random.Random(f"{seed}:{c}").shuffle(group)
        val += group[: take[c]]
        train += group[take[c]:]
    random.Random(seed).shuffle(val)
    random.Random(seed + 1).shuffle(train)
    if cfg.max_train_rows is not None:
        train = train[: cfg.max_train_rows]
    return train, val


def tokenize(tokenizer: Any, classify_cfg: Any, rows: list[Row], max_seq_tokens: int) -> list[dict[str, list[int]]]:
    """Build every example with :func:`classify.engine.prompt.build_training_examples`: the engine's own prompt ids
    (one batched tokenizer call), then the answer ids.

    Raises:
        ConfigError: an example is longer than ``training.max_seq_tokens``.
    """
    examples = build_training_examples(tokenizer, classify_cfg, [r.text for r in rows], [r.category for r in rows])
    longest = max(len(e["input_ids"]) for e in examples)
    if longest > max_seq_tokens:
        raise ConfigError(
            f"`training.max_seq_tokens` must be >= the longest example ({longest} tokens with "
            f"classify.max_doc_tokens={classify_cfg.max_doc_tokens}), got {max_seq_tokens}"
        )
    return examples


def collate_left(examples: list[dict[str, list[int]]], pad_id: int) -> dict[str, Any]:
    """Left-pad a micro-batch so every answer ends at the last position.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids`` (counted from the first real token,
        as at inference) and ``labels`` tensors, plus ``answer_len`` (longest answer in tokens).
    """
    import torch

    width = max(len(e["input_ids"]) for e in examples)
    ids, mask, labels = [], [], []
    for e in examples:
        pad = width - len(e["input_ids"])
        ids.append([pad_id] * pad + e["input_ids"])
        mask.append([0] * pad + [1] * len(e["input_ids"]))
        labels.append([-100] * pad + e["labels"])
    mask_t = torch.tensor(mask)
    answer_len = max(sum(1 for t in e["labels"] if t != -100) for e in examples)
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": mask_t,
        "position_ids": (mask_t.cumsum(-1) - 1).clamp(min=0),
        "labels": torch.tensor(labels),
        "answer_len": answer_len,
    }


def micro_batch_indices(step: int, micro: int, *, accum: int, batch: int, n: int, seed: int) -> list[int]:
    """Example indices of one micro-batch, a pure function of (step, micro), so resume needs no data state.

    The stream is the concatenation of per-epoch permutations seeded with ``seed + epoch``.
    """
    start = (step * accum + micro) * batch
    out = []
    for i in range(start, start + batch):
        epoch, pos = divmod(i, n)
        out.append(_permutation(n, seed + epoch)[pos])
    return out


_PERMS: dict[tuple[int, int], list[int]] = {}


def _permutation(n: int, seed: int) -> list[int]:
    key = (n, seed)
    if key not in _PERMS:
        import torch

        _PERMS[key] = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return _PERMS[key]
