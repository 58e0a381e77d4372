"""``docpilot train`` / ``make train``: LoRA fine-tuning with checkpoints, resume, checks and publish.

Stages (the first failing one is named in the support note): config -> read-data ->
tokenize -> disk-check -> load-model -> train -> save -> checks -> publish. A run lives in
``runs/<utc>-train-<id>/`` (``config.json``, ``train.log``, ``checkpoints/``, ``adapter/``,
``summary.json``, and ``support_note.md`` on failure); ``--resume`` continues one in a new process.
SIGTERM or Ctrl-C stops a run between two operations with exit 130 and the ``--resume`` command in
its message (no support note: nothing failed); a resume that finishes removes the support note an
earlier invocation of the run left.

Example:
    $ docpilot train --config config/docpilot.json --smoke
    $ docpilot train --config config/docpilot.json --resume latest
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.registry.merge import merge_adapter
from adapters.registry.registry import Registry, ResolvedAdapter
from adapters.train.checkpoint import check_inputs, run_inputs
from adapters.train.data import load_rows, split_rows, tokenize
from adapters.train.loop import build_lora_model, run_loop, total_steps
from adapters.train.recipe import RULE, EarlyStop, check_eval, final_steps, step_budget
from adapters.train.support import disk_plan, plot_loss, write_support_note
from adapters.train.validate import (
    FORMAT_ROWS,
    _calibration_or_none,
    checkpoints_exist,
    free_answers,
    loss_fell,
    through_engine,
)
from classify.config.sections import classification_sha256, config_sha256, load_config
from classify.config.training import TrainConfig
from classify.engine.prompt import category_first_tokens
from classify.errors import (
    AdapterError,
    ConfigError,
    DocpilotError,
    EnvironmentCheckError,
    InputError,
    Interrupted,
    VerificationError,
)
from classify.model.model import resolve_model
from classify.model.shape import lora_parameter_count, shape_from_folder
from classify.paths import runs_dir
from classify.runs.detached import DetachPlan
from classify.runs.disk import check_disk, free_mib, is_disk_full
from classify.runs.records import (
    code_revision,
    new_run_dir,
    signals_raise_interrupted,
    utc_now,
    write_json_atomic,
)
from classify.usercommand import user_command, user_flag

log = logging.getLogger("adapters.train")


@dataclass
class TrainOutcome:
    """What a finished run produced.

    Attributes:
        run_id: the run folder's name.
        run_dir: the run folder.
        summary: ``summary.json`` content (metrics, checks, throughput).
        adapter: the published adapter, or ``None`` when publishing was off.
    """

    run_id: str
    run_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)
    adapter: ResolvedAdapter | None = None


def find_run(resume: str, sha: str) -> Path:
    """Locate the run to resume: a folder path, a run id under ``runs/``, or ``latest``.

    ``latest`` is the newest unfinished train run (no ``summary.json``) with the same config hash.

    Raises:
        ConfigError: nothing matches.
    """
    root = runs_dir()
    if resume != "latest":
        path = Path(resume) if Path(resume).is_dir() else root / resume
        if not (path / "config.json").is_file():
            raise ConfigError(f"`--resume` must name a train run folder or id under {root}, got {resume!r}")
        return path
    candidates = sorted(root.glob("*-train-*"), reverse=True) if root.is_dir() else []
    for path in candidates:
        cfg_file = path / "config.json"
        if cfg_file.is_file() and not (path / "summary.json").is_file():
            if json.loads(cfg_file.read_text()).get("config_sha256") == sha:
                return path
    raise ConfigError(f"`--resume latest` found no unfinished train run with this config under {root}")


def resume_dtype(cfg: TrainConfig, run_dir: Path) -> tuple[TrainConfig, list[str]]:
    """Keep a resumed run in the compute dtype it started with, where this machine can.

    ``training.dtype: auto`` is in the config hash as ``auto``, so a run started on a CPU with native
    bf16 (bfloat16) may be resumed on one without (float32) and the other way round. The run's
    ``config.json`` records the dtypes its invocations trained in (``compute_dtypes``, in order):

    * the first one again here: nothing changes;
    * float32 first, bfloat16 here: the run continues in float32 (pinned; logged);
    * bfloat16 first, float32 here (no native bf16: a bf16 product runs ~100x slower than float32 on
      such a CPU, :func:`classify.machine.device.cpu_has_native_bf16`): the run continues in float32 with a
      warning. The LoRA weights and optimizer state are float32 either way, so the checkpoint loads;
      the base model's products change precision from that step on, and the record says so.

    A dtype the user set (not ``auto``) is in the config hash and is kept as set. Runs made before
    the record existed continue in this machine's dtype (nothing to compare with).

    Args:
        cfg: the config of this invocation (its hash matched the run's).
        run_dir: the run folder being resumed; its ``config.json`` is updated when the dtype changes.

    Returns:
        ``(cfg, dtypes)``: the config to continue with, and the run's compute dtypes in order
        (``["bfloat16", "float32"]`` after a switch), for ``summary.json``.
    """
    here = cfg.training.compute_dtype()
    path = run_dir / "config.json"
    record = json.loads(path.read_text())
    history = list(record.get("compute_dtypes") or [])
    if not history:
        return cfg, [here]
    use = here
    if cfg.training.dtype == "auto" and history[0] == "float32" and here != "float32":
        use = "float32"
        log.info("run %s started in float32 (`training.dtype: auto` on its first machine): continuing in float32, "
                 "not this machine's %s", run_dir.name, here)
        cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"dtype": "float32"})})
    elif cfg.training.dtype == "auto" and history[0] != here:
        log.warning("run %s started in %s (`training.dtype: auto`), but this CPU has no native bf16 (a bf16 product would "
                    "run ~100x slower): continuing in %s; summary.json records every dtype (`dtypes`)", run_dir.name,
                    history[0], here)
    if history[-1] != use:
        history.append(use)
        write_json_atomic(path, {**record, "compute_dtypes": history})
    return cfg, history


class _RunLog(logging.FileHandler):
    """``train.log``; on a full disk it stops writing after one console warning (no logging traceback)."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True
        err = sys.exc_info()[1]
        print(f"warning: cannot write {self.baseFilename} ({type(err).__name__}: {err}); "
              "the rest of the log goes to the console only", file=sys.stderr)


def _log_to(run_dir: Path) -> logging.Handler:
    handler = _RunLog(run_dir / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def _engine_check(cfg: TrainConfig, checks: dict[str, Any], recipe: dict[str, Any], *, adapter_dir: Path,
                  val_rows: list[Any], model_ref: Any, classifier: Any, label: str, n_checks: int) -> list[str]:
    """The last end check (the validation rows through vLLM with the new adapter, where configured) and, for the
    scaled recipe, the temperature from the check rows while they were held out; returns the failed checks' names."""
    if cfg.checks.validation_engine == "vllm":
        log.info("end check 4/%d: %d validation row(s) through vLLM with the new adapter", n_checks, len(val_rows))
        checks["engine"] = through_engine(cfg, adapter_dir, val_rows, model_ref, classifier=classifier, label=label)
    if recipe["name"] == "scaled":
        recipe["calibration"] = _calibration_or_none(recipe.pop("check_logprobs"), val_rows, cfg.classify.categories,
                                                     adapter_dir)
        if "engine" in checks:
            checks["engine"]["calibration"] = recipe["calibration"]
            checks["engine"]["note"] = "accuracy on the check rows, which the final fit trained on"
    return [name for name, c in checks.items() if not c["passed"]]


def train(cfg: TrainConfig, *, smoke: bool = False, resume: str | None = None, publish: bool | None = None,
          classifier: Any = None, registry: Registry | None = None, resume_command: str | None = None) -> TrainOutcome:
    """Run (or resume) one training run end to end.

    Args:
        cfg: the train config (``--smoke`` overrides already applied by the caller or via ``smoke``).
        smoke: apply :meth:`TrainConfig.for_smoke` first.
        resume: ``latest``, a run id or a run folder to continue from its newest checkpoint.
        publish: override ``output.publish``.
        classifier: a running LoRA-enabled classifier for the engine check (else one is built).
        registry: where to publish (default :class:`Registry` at ``DOCPILOT_REGISTRY``).
        resume_command: the shell command that continues this run, ``{run}`` standing for the run
            folder, for the messages of a stopped run (``docpilot train`` passes its own arguments);
            default ``docpilot train --config <your config> --resume {run}``.

    Returns:
        The :class:`TrainOutcome`.

    Raises:
        Interrupted: SIGTERM or SIGINT arrived inside :func:`classify.runs.records.signals_raise_interrupted`
            (as under ``docpilot train``); the message names the run folder to resume.
        InputError: bad training data (before any training).
        ConfigError: bad config, an example over ``max_seq_tokens``, or a resume mismatch (another config, or
            training data, tokenizer files or base model other than those the run's checkpoints were trained on:
            :func:`adapters.train.checkpoint.check_inputs`).
        EnvironmentCheckError: not enough free disk before training, or the disk filled up while writing a
            checkpoint or the adapter (the message names the folder and the free space).
        VerificationError: an end-of-run check failed (nothing is published).
        AdapterError: publishing failed.
    """
    t_run = time.time()
    resume_command = resume_command or "docpilot train --config <your config> --resume {run}"
    cfg = cfg.for_smoke() if smoke else cfg
    sha = config_sha256(cfg)
    card_cfg = cfg  # the adapter card keeps the config as given (its hash is the run's); a resume may pin the dtype
    cfg, run_dir, dtypes = _open_run(cfg, sha=sha, smoke=smoke, resume=resume)
    run_id = run_dir.name
    handler = _log_to(run_dir)
    stage = "config"
    try:
        log.info("run %s (%s), config sha256 %s", run_id, "resume" if resume else "new", sha[:12])
        model_ref = _resume_inputs_unchanged(cfg, run_dir) if resume else None
        stage = "read-data"
        rows, data_sha = load_rows(cfg.data, cfg.classify.categories)
        train_rows, val_rows = split_rows(rows, cfg.data, cfg.training.seed)
        stage = "load-model"
        model_ref = model_ref or resolve_model(cfg.model)
        tokenizer = _tokenizer(model_ref.path)
        stage = "tokenize"
        examples = tokenize(tokenizer, cfg.classify, train_rows, cfg.training.max_seq_tokens)
        tokenize(tokenizer, cfg.classify, val_rows, cfg.training.max_seq_tokens)  # refuses a row over the limit
        stage = "disk-check"
        disk = _check_disk(cfg, run_dir, model_ref.path)
        log.info("data %s: %d rows -> %d train (%d examples, classify.long_documents %s), %d validation; %d steps; "
                 "disk needs %.1f MiB of %.0f MiB free", cfg.data.resolved_path(), len(rows), len(train_rows),
                 len(examples), cfg.classify.long_documents, len(val_rows), total_steps(cfg, len(examples)),
                 disk["total"] / 2**20, disk["free"] / 2**20)
        check_inputs(run_dir, run_inputs(cfg.data.resolved_path(), data_sha, model_ref))  # records them for a new run
        stage = "train"
        if cfg.training.recipe == "scaled":
            model, state, recipe = _scaled_fit(cfg, tokenizer, model_ref, examples, val_rows, run_dir=run_dir, sha=sha,
                                               n_rows=len(train_rows) + len(val_rows))
        else:
            stage = "load-model"
            model = build_lora_model(cfg, model_ref.path)
            stage = "train"
            state = run_loop(cfg, model, examples, pad_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                             run_dir=run_dir, config_sha256=sha)
            recipe = _fixed_recipe(cfg, len(train_rows), len(examples), state)
        log.info("recipe %s: %s", recipe["name"], recipe["summary"])
        stage = "save"
        adapter_dir = _save_adapter(cfg, model, run_dir, run_id, state["history"])
        stage = "checks"
        n_checks, checks_t0 = (4 if cfg.checks.validation_engine == "vllm" else 3), time.time()
        checks = _checks_on_the_trained_model(cfg, model, tokenizer, run_dir=run_dir, history=state["history"],
                                              val_rows=val_rows, n_checks=n_checks)
        del model  # the trained model's memory is free before the engine check loads its own
        gc.collect()
        failed = _engine_check(cfg, checks, recipe, adapter_dir=adapter_dir, val_rows=val_rows, model_ref=model_ref,
                               classifier=classifier, label=f"{run_id}-candidate", n_checks=n_checks)
        log.info("end checks done in %.0f s: %s", time.time() - checks_t0,
                 f"failed {failed}" if failed else "all passed")
        summary = _train_summary(cfg, run_id=run_id, smoke=smoke, sha=sha, data_sha=data_sha, rows=rows,
                                 train_rows=train_rows, val_rows=val_rows, state=state, dtypes=dtypes, checks=checks,
                                 failed=failed, run_wall_s=time.time() - t_run, disk=disk)
        summary["recipe"] = recipe
        if failed:
            raise VerificationError(f"training run {run_id} failed its end-of-run checks {failed}: "
                                    + "; ".join(f"{n}: {json.dumps({k: v for k, v in checks[n].items() if k != 'examples'})}" for n in failed))
        adapter = None
        if cfg.output.publish if publish is None else publish:
            stage = "publish"
            adapter = _publish(card_cfg, registry or Registry(), adapter_dir, model_ref, summary)
            summary["adapter"] = {"ref": adapter.ref, "sha256": adapter.sha256, "path": str(adapter.path)}
            if cfg.output.merge:
                summary["merged"] = merge_adapter(adapter, run_dir / "merged")
        _write_summary(run_dir, summary)
        log.info("run %s done: final loss %.4f, %s", run_id, summary["final_loss"],
                 f"published {adapter.ref}" if adapter else "not published")
        return TrainOutcome(run_id, run_dir, summary, adapter)
    except BaseException as err:
        recorded = _record_failure(err, cfg, run_dir=run_dir, stage=stage, resume_command=resume_command)
        if recorded is not err:
            raise recorded from err
        raise
    finally:
        log.removeHandler(handler)
        handler.close()


def _fixed_recipe(cfg: TrainConfig, n_rows: int, n_examples: int, state: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``recipe`` block of the ``fixed`` recipe: rows, steps, epochs, why it stopped."""
    eff = cfg.training.batch_size * cfg.training.grad_accum_steps
    epochs = state["steps"] * eff / max(1, n_examples)
    return {"name": "fixed", "rows": n_rows, "examples": n_examples, "steps": state["steps"], "epochs": round(epochs, 3),
            "stopped": state.get("stopped"),
            "summary": f"{n_rows} training rows, {state['steps']} steps = {epochs:.2f} epochs; {state.get('stopped')}"}


def _scaled_fit(cfg: TrainConfig, tokenizer: Any, model_ref: Any, examples: list[dict[str, list[int]]],
                val_rows: list[Any], *, run_dir: Path, sha: str, n_rows: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The ``scaled`` recipe (:mod:`adapters.train.recipe`): a selection fit with early stopping on the check rows, then
    a final fit on every row for the epochs it chose.

    The selection fit lives in ``<run>/select/`` (its checkpoints, and ``choice.json`` once it has chosen: a
    resume after that goes straight to the final fit); the final fit in the run folder itself.

    Returns:
        ``(model, state, recipe)``: the final fit's model and loop state, and ``summary.json``'s ``recipe`` block
        (with ``check_logprobs``, the check rows' log-probs at the chosen step, for the temperature).
    """
    t = cfg.training
    eff = t.batch_size * t.grad_accum_steps
    pad_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    check_examples, check_ids = [], []
    for row in val_rows:
        mine = tokenize(tokenizer, cfg.classify, [row], t.max_seq_tokens)
        check_examples += mine
        check_ids += [row.id] * len(mine)
    select_dir = run_dir / "select"
    choice_file = select_dir / "choice.json"
    budget = step_budget(len(examples), eff, epochs=t.epochs, max_steps=t.max_steps, min_steps=t.min_steps)
    if choice_file.is_file():
        choice = json.loads(choice_file.read_text())
        log.info("selection fit already chose step %d (%s): going on with the final fit", choice["best_step"],
                 choice_file)
    else:
        first_tokens = category_first_tokens(tokenizer, cfg.classify.categories)
        model = build_lora_model(cfg, model_ref.path)

        def after_step(step: int, state: dict[str, Any]) -> str | None:
            if step % t.eval_every_steps and step != budget:
                return None
            kept = state.get("early_stop") or {}
            stopper = EarlyStop(t.patience_evals, evals=list(kept.get("evals", [])), best=kept.get("best"))
            loss, logprobs = check_eval(model, check_examples, check_ids, first_tokens, pad_id=pad_id,
                                         batch_size=t.batch_size)
            reason = stopper.update(step, loss, logprobs)
            log.info("check rows at step %d: answer loss %.4f (lowest %.4f at step %d)", step, loss,
                     stopper.best["loss"], stopper.best["step"])
            state["early_stop"] = {"evals": stopper.evals, "best": stopper.best}
            return reason

        log.info("scaled recipe: selection fit on %d example(s), %d check row(s), budget %d steps (%s)",
                 len(examples), len(val_rows), budget, RULE)
        selected = run_loop(cfg, model, examples, pad_id=pad_id, run_dir=select_dir, config_sha256=sha, steps=budget,
                            after_step=after_step)
        best = selected["early_stop"]["best"]
        choice = {"budget_steps": budget, "steps_run": selected["steps"], "stopped": selected["stopped"],
                  "evals": selected["early_stop"]["evals"], "best_step": best["step"],
                  "best_check_loss": round(best["loss"], 6), "check_logprobs": best["logprobs"],
                  "wall_s": round(selected["wall_s"], 1)}
        write_json_atomic(choice_file, choice)
        del model
        gc.collect()
    steps, epochs = final_steps(choice["best_step"], len(examples), len(examples) + len(check_examples), eff)
    log.info("scaled recipe: final fit on all %d example(s) (check rows included): %d steps = %.2f epochs",
             len(examples) + len(check_examples), steps, epochs)
    model = build_lora_model(cfg, model_ref.path)
    state = run_loop(cfg, model, examples + check_examples, pad_id=pad_id, run_dir=run_dir, config_sha256=sha,
                     steps=steps)
    recipe = {
        "name": "scaled", "rule": RULE, "rows": n_rows, "selection": {
            "train_examples": len(examples), "check_rows": len(val_rows), "budget_steps": budget,
            "steps_run": choice["steps_run"], "evals": choice["evals"], "best_step": choice["best_step"],
            "best_check_loss": choice["best_check_loss"], "stopped": choice["stopped"], "wall_s": choice.get("wall_s")},
        "epochs": round(epochs, 3), "steps": state["steps"],
        "final_fit": {"examples": len(examples) + len(check_examples), "steps": state["steps"], "epochs": round(epochs, 3),
                      "wall_s": round(state["wall_s"], 1)},
        "stopped": choice["stopped"],
        "check_logprobs": choice["check_logprobs"],
    }
    recipe["summary"] = (f"{len(examples)} training + {len(val_rows)} check rows; selection fit: budget {budget} steps, "
                         f"{choice['stopped']}, chose step {choice['best_step']} = {epochs:.2f} epochs; final fit on all "
                         f"{len(examples) + len(check_examples)} examples: {state['steps']} steps")
    return model, state, recipe


def _open_run(cfg: TrainConfig, *, sha: str, smoke: bool, resume: str | None) -> tuple[TrainConfig, Path, list[str]]:
    """A new run folder with its ``config.json``, or the run ``resume`` names (:func:`find_run`, :func:`resume_dtype`).

    Returns:
        ``(cfg, run_dir, dtypes)``: the config to train with (a resume may pin its dtype), the run folder and
        the run's compute dtypes in order.
    """
    if resume:
        run_dir = find_run(resume, sha)
        cfg, dtypes = resume_dtype(cfg, run_dir)
        return cfg, run_dir, dtypes
    run_dir = new_run_dir("train", runs_dir())[1]
    dtypes = [cfg.training.compute_dtype()]
    write_json_atomic(run_dir / "config.json", {"config": cfg.model_dump(mode="json"), "config_sha256": sha, "smoke": smoke,
                                                "compute_dtypes": dtypes})
    return cfg, run_dir, dtypes


def _resume_inputs_unchanged(cfg: TrainConfig, run_dir: Path) -> Any:
    """The resumed run's base model, once its training data, tokenizer and base model are the ones it recorded.

    Checked before the data is read, so an edited file is named as changed (with both sha256) rather than
    only as bad; :func:`train` checks again with the hash of the rows it read.

    Raises:
        ConfigError: one of them changed since the run started (:func:`adapters.train.checkpoint.check_inputs`).
    """
    model_ref = resolve_model(cfg.model)
    check_inputs(run_dir, run_inputs(cfg.data.resolved_path(), None, model_ref))
    return model_ref


def _record_failure(err: BaseException, cfg: TrainConfig, *, run_dir: Path, stage: str,
                    resume_command: str) -> BaseException:
    """Log a failed run and write its support note; return the error to raise.

    Returns:
        ``err``; an :class:`Interrupted` naming the resume command when ``err`` is one (SIGTERM / Ctrl-C:
        nothing failed, the newest checkpoint is where a resume starts; no support note); an
        :class:`EnvironmentCheckError` naming the folder, the free space and the resume command when
        ``err`` is a full disk outside the checkpoints (the adapter, the log...).
    """
    run_id = run_dir.name
    if isinstance(err, Interrupted):
        log.error("run %s %s at stage %s", run_id, err, stage)
        return Interrupted(f"{err}: training run {run_id} stopped at stage {stage}; continue it with "
                           f"`{resume_command.replace('{run}', str(run_dir))}`")
    if not isinstance(err, DocpilotError) and is_disk_full(err):
        err = EnvironmentCheckError(
            f"disk full: run {run_id} could not write in {run_dir} at stage {stage}: {free_mib(run_dir):.1f} MiB free "
            f"on that file system ({type(err).__name__}: {err}); free space (or set DOCPILOT_RUNS elsewhere) "
            f"and continue with `{resume_command.replace('{run}', str(run_dir))}`")
    log.error("run %s failed at stage %s: %s: %s", run_id, stage, type(err).__name__, err)
    try:
        note = write_support_note(run_dir, err, stage, cfg, run_dir / "train.log")
        log.error("support note: %s", note)
    except OSError as note_err:
        log.error("could not write the support note in %s: %s", run_dir, note_err)
    return err


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json``; remove the support note an earlier, failed invocation of this run left."""
    write_json_atomic(run_dir / "summary.json", summary)
    stale_note = run_dir / "support_note.md"
    if stale_note.exists():  # an earlier invocation of this run failed; this one finished it
        stale_note.unlink()
        log.info("removed %s: it described an earlier invocation of this run (see train.log)", stale_note)


def _tokenizer(model_path: str) -> Any:
    """The base model's Hugging Face tokenizer (transformers imported on first use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _check_disk(cfg: TrainConfig, run_dir: Path, model_path: str) -> dict[str, Any]:
    """The disk check before training (:func:`classify.runs.disk.check_disk` of :func:`disk_plan` for this run).

    Raises:
        EnvironmentCheckError: not enough free disk for the checkpoints, the adapter and the merged copy.
    """
    n_layers = len(cfg.lora.layers) if cfg.lora.layers is not None else None
    lora_params = lora_parameter_count(shape_from_folder(model_path), cfg.lora.target_modules, cfg.lora.rank, n_layers)
    base_bytes = sum(p.stat().st_size for p in Path(model_path).glob("*.safetensors"))
    return check_disk(run_dir, disk_plan(base_bytes, True, lora_params, cfg.training.keep_checkpoints, cfg.output.merge))


def _save_adapter(cfg: TrainConfig, model: Any, run_dir: Path, run_id: str, history: list[dict[str, Any]]) -> Path:
    """Save the trained adapter to ``<run_dir>/adapter`` with its loss curve (PNG) and ``loss.jsonl``."""
    adapter_dir = run_dir / "adapter"
    model.save_pretrained(str(adapter_dir))
    plot_loss(history, adapter_dir / "loss_curve.png", f"{cfg.output.adapter_name} ({run_id})")
    (adapter_dir / "loss.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    return adapter_dir


def _checks_on_the_trained_model(cfg: TrainConfig, model: Any, tokenizer: Any, *, run_dir: Path,
                                 history: list[dict[str, Any]], val_rows: list[Any], n_checks: int) -> dict[str, Any]:
    """End-of-run checks 1-3: the loss fell, the checkpoints exist, the trained model answers a category."""
    checks = {
        "loss_fell": loss_fell(history, cfg.training.loss_window_steps),
        "checkpoints": checkpoints_exist(run_dir),
    }
    log.info("end checks 1-2/%d: loss fell %s, checkpoints %s", n_checks, checks["loss_fell"]["passed"],
             checks["checkpoints"]["checkpoints"])
    log.info("end check 3/%d: free answers of the trained model on %d validation row(s)", n_checks,
             min(len(val_rows), FORMAT_ROWS))
    checks["free_answers"] = free_answers(model, tokenizer, cfg, val_rows)
    return checks


def _train_summary(cfg: TrainConfig, *, run_id: str, smoke: bool, sha: str, data_sha: str, rows: list[Any],
                   train_rows: list[Any], val_rows: list[Any], state: dict[str, Any], dtypes: list[str],
                   checks: dict[str, Any], failed: list[str], run_wall_s: float, disk: dict[str, Any]) -> dict[str, Any]:
    """``summary.json`` of a finished training run (before publishing adds ``adapter`` and ``merged``)."""
    return {
        "run_id": run_id, "finished": utc_now(), "smoke": smoke, "config_sha256": sha,
        "data": {"path": str(cfg.data.resolved_path()), "sha256": data_sha, "rows": len(rows),
                 "train_rows": len(train_rows), "validation_rows": len(val_rows)},
        "steps": state["steps"], "dtype": cfg.training.compute_dtype(), "dtypes": dtypes, "resumed_from": state["resumed_from"],
        "device": state.get("device"), "peak_device_bytes": state.get("peak_device_bytes"),
        "skipped_checkpoints": state.get("skipped_checkpoints", []), "tokens": state["tokens"],
        "cpu_s": round(state["cpu_s"], 1), "wall_s": round(state["wall_s"], 1),
        "tokens_per_s_cpu": round(state["tokens"] / max(state["cpu_s"], 1e-9), 1),
        "tokens_per_s_wall": round(state["tokens"] / max(state["wall_s"], 1e-9), 1),
        "final_loss": state["history"][-1]["loss"], "checks": checks, "failed_checks": failed,
        "run_wall_s": round(run_wall_s, 1),  # this invocation, data reading to the end of the checks
        "disk_plan": disk,
    }


def _publish(cfg: TrainConfig, registry: Registry, adapter_dir: Path, model_ref: Any, summary: dict[str, Any]) -> ResolvedAdapter:
    card = {
        "base_model": {"name": model_ref.name, "fingerprint": model_ref.fingerprint, "source": model_ref.source},
        "training": {"config": cfg.model_dump(mode="json"), "config_sha256": summary["config_sha256"],
                     "run_id": summary["run_id"], "data": summary["data"], "smoke": summary["smoke"]},
        "classify": cfg.classify.model_dump(mode="json"),
        "classification_sha256": classification_sha256(cfg.model, cfg.classify),
        "metrics": {k: summary[k] for k in ("steps", "tokens", "cpu_s", "wall_s", "tokens_per_s_cpu", "tokens_per_s_wall", "final_loss",
                                          "run_wall_s", "dtype", "dtypes")}
        | {"loss_fell": summary["checks"]["loss_fell"], "free_answers": summary["checks"]["free_answers"],
           "engine": summary["checks"].get("engine")},
        "loss_curve": "loss_curve.png",
        "code_revision": code_revision(),
    }
    calibration = (summary["checks"].get("engine") or {}).get("calibration") or summary.get("recipe", {}).get("calibration")
    if calibration:  # the score temperature pilot, batch and serve apply (adapters.registry.card.AdapterCard.temperature)
        card["calibration"] = calibration
    for _ in range(5):  # another publisher may take the next version between listing and renaming
        version = registry.next_version(cfg.output.adapter_name)
        try:
            return registry.publish(adapter_dir, cfg.output.adapter_name, version, card)
        except AdapterError as err:
            if "already exists" not in str(err):
                raise
    raise AdapterError(f"could not publish {cfg.output.adapter_name}: 5 versions were taken concurrently")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``docpilot train``'s options (the detach ones are taken by the front door: :func:`prepare_detach`)."""
    parser = argparse.ArgumentParser(prog="docpilot train", description="LoRA fine-tuning with checkpoints and resume")
    parser.add_argument("--config", default="config/docpilot.json", help="train config JSON (default config/docpilot.json)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on short sequences (minutes on a CPU)")
    parser.add_argument("--resume", metavar="RUN", help="continue 'latest', a run id or a run folder from its newest checkpoint")
    parser.add_argument("--no-publish", action="store_true", help="do not publish to the registry")
    parser.add_argument("--detach", action="store_true", help="run in its own session, detached from this terminal; "
                        "prints the job folder, its log and 'docpilot status JOB --follow'")
    parser.add_argument("--stop-when-done", action="store_true", help="with --detach: when training succeeded, wrap up "
                        "to --wrap-up-to and run the lots config's lease.stop_command if every copy verified")
    parser.add_argument("--wrap-up-to", metavar="DEST", help="wrap-up destination for --stop-when-done (folder or s3://...)")
    return parser.parse_args(argv)


def prepare_detach(argv: list[str]) -> DetachPlan:
    """``docpilot train --detach``'s share: its options checked, and a job folder ``runs/<utc>-trainjob-<hex>/`` for
    the log and exit record (the run's own folder is made by the training, as in the foreground).

    Args:
        argv: ``docpilot train``'s arguments as given.

    Returns:
        The plan the front door starts (:mod:`docpilot.detach`); the lots config is ``config/lots.json``.

    Raises:
        InputError: ``--stop-when-done`` without ``--detach`` or without ``--wrap-up-to``.
    """
    args = parse_args(argv)
    if not args.detach:
        raise InputError(f"{user_flag('--stop-when-done')} needs {user_flag('--detach')} (a foreground run ends with its "
                         f"terminal); after a foreground run use `{user_command('docpilot wrap-up --to DEST')}`")
    if args.stop_when_done and not args.wrap_up_to:
        raise InputError(f"{user_flag('--stop-when-done')} needs {user_flag('--wrap-up-to', 'DEST')} (a folder or "
                         "s3://...): the lease is never stopped before everything is copied off the pod and re-checked")

    def open_run() -> tuple[str, Path, tuple[str, ...]]:
        job_id, job_dir = new_run_dir("trainjob", runs_dir())
        return job_id, job_dir, ()

    return DetachPlan("train", args.stop_when_done, args.wrap_up_to, "config/lots.json", open_run)


def main(argv: list[str] | None = None) -> int:
    """``docpilot train --config config/docpilot.json [--smoke] [--resume latest|RUN] [--no-publish]``.

    Returns:
        0 when the run finished, passed its checks and (if configured) published.

    Raises:
        InputError: ``--detach`` or ``--stop-when-done`` reached the foreground run (only ``docpilot train``
            detaches: :func:`prepare_detach`).
        Interrupted: SIGTERM or Ctrl-C (``docpilot`` exits 130; the message names the run to resume).
    """
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.detach or args.stop_when_done:
        raise InputError(f"--detach and --stop-when-done are taken by the docpilot command: run "
                         f"`{user_command('docpilot train --detach ...')}`")
    cfg = load_config(TrainConfig, args.config)
    command = ["docpilot", "train", "--config", args.config, *(["--smoke"] if args.smoke else []),
               *(["--no-publish"] if args.no_publish else [])]
    with signals_raise_interrupted(doing="stopping the run at its newest checkpoint"):
        outcome = train(cfg, smoke=args.smoke, resume=args.resume, publish=False if args.no_publish else None,
                        resume_command=shlex.join(command) + " --resume {run}")
    s = outcome.summary
    print(f"run {outcome.run_id}: {s['steps']} steps, final loss {s['final_loss']:.4f}, "
          f"{s['tokens_per_s_cpu']:.0f} tokens/s (cpu), engine check {s['checks'].get('engine', {}).get('accuracy', 'skipped')}")
    print(f"adapter: {outcome.adapter.ref} ({outcome.adapter.path})" if outcome.adapter else "adapter: not published")
    return 0
