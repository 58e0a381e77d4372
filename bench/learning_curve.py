"""Learning curve (issue 56): the adapter vs TF-IDF + LinearSVC at N labelled documents per category.

The question a user with a large unlabelled corpus and a few labels pays GPUs to answer: does the LLM
classify *their* corpus better than a cheap model would, at the labels they have?

* ``train.csv`` is split ONCE, before anything is scored, into two fixed halves (stratified, seed
  :data:`HALVES_SEED`): **half 1** is where the labelled rows are drawn from and where a recipe may be chosen;
  **half 2** is only scored (the figures). ``test.csv`` is never read here.
* Per point (N per category, draw d): N rows per category drawn from half 1 with ``Random(f"{N}:{d}")``
  (draws fixed in advance, nested nowhere).
* **Adapter**: ``docpilot train``'s own :func:`adapters.train.train.train` on those rows with the shipped config and
  the ``scaled`` recipe (:mod:`adapters.train.recipe`: step budget from the rows, early stopping on
  ``max(k, n // 4)`` check rows, final fit on all N x k rows), no vLLM end check (time). Scored on half 2 with the
  product's prompt ids (:func:`classify.engine.prompt.build_prompts`) and first-token scoring over the categories
  (argmax of the categories' first-token log-probs at the answer position), computed by transformers with the
  adapter merged, float32: the same argmax vLLM's first-token path takes, without vLLM's minute of start-up.
* **TF-IDF + LinearSVC** (1-2 grams, sublinear tf: the variant ``bench/baseline.py`` chose on a validation
  split): IDF fitted on ALL of ``train.csv``'s texts (the user's unlabelled corpus, labels unused), the SVM on
  the same N x k labelled rows (all of them: it needs no check rows).
* Per point: accuracy of both on the same scored rows, exact McNemar p (:func:`bench.baseline.mcnemar_p`), wall
  times (adapter training, adapter scoring, TF-IDF fit + score). The crossover is the smallest N where TF-IDF is
  at or above the adapter on the mean over draws.

Environment (so ``python -m bench.run --only learning_curve`` stays one command): ``DOCPILOT_LC_N`` (default
``4,8``), ``DOCPILOT_LC_DRAWS`` (``0,1,2``), ``DOCPILOT_LC_SCORE_ROWS`` (rows of half 2 scored, a fixed
shuffle's prefix; default all), ``DOCPILOT_LC_THREADS`` (torch threads for training and scoring; default
``train.training.threads``), ``DOCPILOT_LC_OUT`` (a JSON file the points are written to as each one ends,
so a long run that is stopped keeps what it measured). ``--quick``: N=2, one draw, 40 rows.
"""

from __future__ import annotations

import csv
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.baseline import mcnemar_p
from bench.common import ROOT, bbc_dir

HALVES_SEED = "issue56-halves"
"""Seed of the one split of train.csv into half 1 (draws, choices) and half 2 (scored)."""

VARIANT = {"sublinear_tf": True}
"""The TF-IDF variant (``bench/baseline.py`` chose it on the shipped validation split)."""


def load_train() -> list[dict[str, str]]:
    """train.csv's rows as ``{"id": "bbc-train-NNNN", "text", "category"}`` in file order."""
    with (bbc_dir() / "train.csv").open(encoding="utf-8", newline="") as fh:
        return [{"id": f"bbc-train-{i:04d}", "text": r["text"], "category": r["category"]}
                for i, r in enumerate(csv.DictReader(fh))]


def halves(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The fixed split: each category's rows shuffled with ``Random(f"{HALVES_SEED}:{category}")``, first half
    (rounded down) to half 1; half 2 then shuffled with ``Random(HALVES_SEED)`` (its prefixes mix categories)."""
    one, two = [], []
    for cat in sorted({r["category"] for r in rows}):
        group = [r for r in rows if r["category"] == cat]
        random.Random(f"{HALVES_SEED}:{cat}").shuffle(group)
        one += group[: len(group) // 2]
        two += group[len(group) // 2:]
    random.Random(HALVES_SEED).shuffle(two)
    return one, two


def draw(half1: list[dict[str, str]], n: int, d: int) -> list[dict[str, str]]:
    """``n`` rows per category from half 1 (draw ``d``), in a seeded order."""
    picked = []
    for cat in sorted({r["category"] for r in half1}):
        group = [r for r in half1 if r["category"] == cat]
        picked += random.Random(f"{n}:{d}:{cat}").sample(group, n)
    random.Random(f"{n}:{d}").shuffle(picked)
    return picked


def tfidf(corpus: list[str], labelled: list[dict[str, str]], scored: list[dict[str, str]]) -> dict[str, Any]:
    """TF-IDF (IDF from ``corpus``) + LinearSVC on ``labelled``, scored on ``scored``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    t0 = time.perf_counter()
    vec = TfidfVectorizer(ngram_range=(1, 2), **VARIANT).fit(corpus)
    svm = LinearSVC().fit(vec.transform([r["text"] for r in labelled]), [r["category"] for r in labelled])
    predicted = svm.predict(vec.transform([r["text"] for r in scored]))
    wrong = sorted(r["id"] for r, p in zip(scored, predicted, strict=True) if p != r["category"])
    return {"accuracy": round(1 - len(wrong) / len(scored), 4), "errors": len(wrong), "wrong_ids": wrong,
            "wall_s": round(time.perf_counter() - t0, 1)}


def train_adapter(labelled: list[dict[str, str]], workdir: Path) -> tuple[Any, Any]:
    """``adapters.train.train.train`` on ``labelled`` with the shipped config and the scaled recipe; returns (outcome, cfg)."""
    from adapters.train.train import train
    from classify.config.sections import load_config
    from classify.config.training import TrainConfig

    data = workdir / "labelled.csv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "category"])
        writer.writerows((r["text"], r["category"]) for r in labelled)
    cfg = load_config(TrainConfig, ROOT / "config" / "docpilot.json")
    k = len(cfg.classify.categories)
    cfg = cfg.model_copy(update={
        "data": cfg.data.model_copy(update={"path": str(data), "validation_rows": max(k, len(labelled) // 4)}),
        "training": cfg.training.model_copy(update={"recipe": "scaled", "checkpoint_every_steps": 1000,
                                                    "checkpoint_every_s": None, "threads": _threads(cfg.training.threads)}),
        "checks": cfg.checks.model_copy(update={"validation_engine": "none"}),
        "output": cfg.output.model_copy(update={"publish": False}),
    })
    return train(cfg), cfg


def score_adapter(cfg: Any, adapter_dir: Path, scored: list[dict[str, str]], batch: int = 8) -> dict[str, Any]:
    """First-token classification of ``scored`` by base + adapter (merged, float32) on the product's prompt ids."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from classify.engine.prompt import build_prompts, category_first_tokens
    from classify.model.model import resolve_model

    t0 = time.perf_counter()
    torch.set_num_threads(cfg.training.threads)
    path = resolve_model(cfg.model).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload().eval()
    cats = cfg.classify.categories
    firsts = category_first_tokens(tokenizer, cats)
    prompts = [p.ids for p in build_prompts(tokenizer, cfg.classify, [r["text"] for r in scored])]
    pad = tokenizer.pad_token_id or tokenizer.eos_token_id
    chosen = []
    with torch.no_grad():
        for at in range(0, len(prompts), batch):
            part = prompts[at:at + batch]
            width = max(len(p) for p in part)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in part])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part])
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1, :]
            chosen += [cats[int(i)] for i in logits[:, firsts].argmax(-1)]
    wrong = sorted(r["id"] for r, c in zip(scored, chosen, strict=True) if c != r["category"])
    return {"accuracy": round(1 - len(wrong) / len(scored), 4), "errors": len(wrong), "wrong_ids": wrong,
            "wall_s": round(time.perf_counter() - t0, 1), "never_said": sorted(set(cats) - set(chosen))}


def _threads(default: int) -> int:
    return int(os.environ.get("DOCPILOT_LC_THREADS") or default)


def _ints(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).split(",") if x.strip()]


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the curve (see the module docstring); returns ``{"title", "figures", "markdown"}``."""
    ns = [2] if quick else _ints("DOCPILOT_LC_N", "4,8")
    draws = [0] if quick else _ints("DOCPILOT_LC_DRAWS", "0,1,2")
    score_rows = 40 if quick else (int(os.environ["DOCPILOT_LC_SCORE_ROWS"]) if os.environ.get("DOCPILOT_LC_SCORE_ROWS") else None)
    out_file = os.environ.get("DOCPILOT_LC_OUT")
    rows = load_train()
    half1, half2 = halves(rows)
    scored = half2[:score_rows] if score_rows else half2
    corpus = [r["text"] for r in rows]
    points: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"half1_rows": len(half1), "half2_rows": len(half2), "scored_rows": len(scored),
                               "scored_ids_sha": _ids_sha(scored), "points": points}
    for d in draws:  # every N at draw 0 first: a stopped run has the whole curve once
        for n in ns:
            labelled = draw(half1, n, d)
            base = tfidf(corpus, labelled, scored)
            with tempfile.TemporaryDirectory(prefix="lc-") as tmp:
                t0 = time.time()
                outcome, cfg = train_adapter(labelled, Path(tmp))
                train_s = time.time() - t0
                ours = score_adapter(cfg, outcome.run_dir / "adapter", scored)
            recipe = outcome.summary["recipe"]
            point = {"n_per_category": n, "draw": d, "labelled": len(labelled), "adapter": ours, "tfidf": base,
                     "mcnemar_p": mcnemar_p(set(ours["wrong_ids"]), set(base["wrong_ids"])),
                     "adapter_train_s": round(train_s, 1), "run_id": outcome.run_id,
                     "recipe": {k: recipe[k] for k in ("rows", "epochs", "steps", "stopped", "summary")}
                     | {"best_step": recipe["selection"]["best_step"], "budget_steps": recipe["selection"]["budget_steps"],
                        "check_rows": recipe["selection"]["check_rows"],
                        "temperature": (recipe.get("calibration") or {}).get("temperature")}}
            points.append(point)
            print(f"[learning_curve] N={n} draw {d}: adapter {ours['accuracy']:.3f} ({train_s / 60:.1f} min train, "
                  f"{ours['wall_s'] / 60:.1f} min score), tfidf {base['accuracy']:.3f}, p={point['mcnemar_p']}", flush=True)
            if out_file:
                Path(out_file).write_text(json.dumps(figures, indent=2) + "\n")
    return {"title": "Learning curve: adapter vs TF-IDF + LinearSVC at N labels per category (issue 56)",
            "figures": figures, "markdown": markdown(figures)}


def _ids_sha(rows: list[dict[str, str]]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(r["id"] for r in rows).encode()).hexdigest()[:16]


def markdown(figures: dict[str, Any]) -> str:
    """The per-point table, the per-N means and the crossover, from :func:`run`'s figures."""
    pts = figures["points"]
    lines = [f"Scored on {figures['scored_rows']} rows of half 2 ({figures['half2_rows']} rows; half 1: "
             f"{figures['half1_rows']}); test.csv not read.", "",
             "| N/category | draw | adapter | TF-IDF (all labelled rows, IDF from train.csv texts) | McNemar p | "
             "recipe (steps, epochs, why it stopped) | T | train min | score min | TF-IDF s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pts:
        r = p["recipe"]
        lines.append(f"| {p['n_per_category']} | {p['draw']} | {100 * p['adapter']['accuracy']:.1f}% "
                     f"({p['adapter']['errors']} err) | {100 * p['tfidf']['accuracy']:.1f}% ({p['tfidf']['errors']} err) | "
                     f"{p['mcnemar_p']} | best step {r['best_step']} of budget {r['budget_steps']}; final {r['steps']} "
                     f"steps = {r['epochs']:.1f} epochs on {r['rows']} rows; {r['stopped']} | {r['temperature']} | "
                     f"{p['adapter_train_s'] / 60:.1f} | {p['adapter']['wall_s'] / 60:.1f} | {p['tfidf']['wall_s']} |")
    means = {}
    for n in sorted({p["n_per_category"] for p in pts}):
        mine = [p for p in pts if p["n_per_category"] == n]
        means[n] = (sum(p["adapter"]["accuracy"] for p in mine) / len(mine),
                    sum(p["tfidf"]["accuracy"] for p in mine) / len(mine), len(mine))
    lines += ["", "| N/category | draws | adapter mean | TF-IDF mean |", "|---|---|---|---|"]
    lines += [f"| {n} | {k} | {100 * a:.1f}% | {100 * b:.1f}% |" for n, (a, b, k) in means.items()]
    cross = [n for n, (a, b, _) in means.items() if b >= a]
    lines += ["", f"Crossover: TF-IDF at or above the adapter from N = {cross[0]} per category." if cross else
              f"Crossover: not within the measured N ({', '.join(map(str, means))}): the adapter is ahead on the mean at each."]
    return "\n".join(lines)


if __name__ == "__main__":
    from bench.common import run_alone

    run_alone(run, __doc__)
