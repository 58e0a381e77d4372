"""Training's view of the config file: the shared sections plus ``train`` (one frozen section per concern).

Here beside the other sections, so the plan and the doctor (``batch/``) size training without importing it.

Read from the one ``config/docpilot.json`` (:mod:`classify.config.file`): the training prompt is
built from the same shared ``classify`` section the adapter is piloted and served with, by the
same :func:`classify.engine.prompt.build_training_examples` the engine's prompt comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, Strict, field_validator, model_validator

from classify.config.sections import ClassifyConfig, CommandConfig, EngineConfig, Frozen, ModelConfig
from classify.errors import EnvironmentCheckError
from classify.machine.device import auto_dtype, torch_device
from classify.paths import DataPath, configured_path

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama block: vLLM puts LoRA slots on all of them, training may adapt any of them."""


class DataSection(Frozen):
    """Training data: a CSV or JSONL file with a text and a category per row.

    Attributes:
        path: the file; ``${VAR}`` and ``${VAR:-default}`` are expanded from the environment
            (:func:`classify.paths.expand_path`), relative paths are taken from the working
            directory. ``null`` (the default): not set, training refuses to start.
        format: ``csv``, ``jsonl`` or ``auto`` (by file suffix).
        text_column: column / key holding the document text.
        category_column: column / key holding the label (one of ``classify.categories``).
        validation_rows: rows held out (seeded shuffle) for the end-of-run checks; never trained on.
        max_train_rows: use at most this many training rows (``null`` = all), for budgets.
    """

    path: DataPath = None
    format: Literal["auto", "csv", "jsonl"] = "auto"
    text_column: str = Field("text", min_length=1)
    category_column: str = Field("category", min_length=1)
    validation_rows: int = Field(100, ge=1, le=100_000)
    max_train_rows: int | None = Field(None, ge=1)

    def resolved_path(self) -> Path:
        """The data file with its ``${VAR}``/``${VAR:-default}`` and ``~`` expanded.

        Raises:
            InputError: ``path`` is not set (``null``).
            ConfigError: a malformed ``${`` (a config built without validation).
        """
        return configured_path(self.path, "no training data: set `train.data.path` in the config file")


class LoraSection(Frozen):
    """peft ``LoraConfig`` fields.

    Attributes:
        rank: LoRA rank ``r`` (must be <= ``engine.max_lora_rank``, 16 by default).
        alpha: LoRA scaling numerator (scale = alpha / rank, Hu et al. 2021, eq. 3).
        dropout: dropout on the LoRA input during training.
        target_modules: linear layers to adapt (Llama names).
        layers: block indices to adapt (``null`` = all). Adapting only the top blocks stops the
            backward pass early (cheaper steps on CPU).
    """

    rank: int = Field(8, ge=1, le=256)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    layers: tuple[int, ...] | None = None

    @field_validator("target_modules")
    @classmethod
    def _check_modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [m for m in value if m not in LINEAR_MODULES]
        if not value or bad:
            raise ValueError(f"must be a non-empty subset of {list(LINEAR_MODULES)}, got {list(value)}")
        return value


class TrainingSection(Frozen):
    """The optimisation loop.

    Attributes:
        dtype: the base model's weights and compute dtype for training: ``auto`` (bfloat16 on an
            accelerator or a CPU with native bf16 (AVX512-BF16 or AMX), else float32, as the
            engine's ``model.dtype: auto``), ``float32`` or ``bfloat16``. The LoRA weights and
            AdamW state stay float32 either way (peft's ``autocast_adapter_dtype``); the adapter
            is loaded by vLLM in the engine's dtype.
        max_seq_tokens: longest prompt + answer in tokens; a longer example stops the run before
            training (lower ``classify.max_doc_tokens``).
        batch_size: examples per micro-batch.
        grad_accum_steps: micro-batches per optimizer step (effective batch = product).
        learning_rate: peak AdamW learning rate.
        warmup_steps: linear warm-up steps, then linear decay to 0 at the last step.
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping norm (0 = off).
        max_steps: optimizer steps; exactly one of ``max_steps`` and ``epochs`` is set.
        epochs: passes over the training rows, a fraction allowed (``0.5``: half of them); converted
            to optimizer steps, rounded up. A number, not a string or ``true``.
        seed: seeds the data order, LoRA init and dropout.
        checkpoint_every_steps: write a checkpoint every N optimizer steps (and at the end).
        checkpoint_every_s: also write one when this many seconds of wall time passed since the last
            (``null``: by steps only); a card does hundreds of steps a minute, a CPU a few.
        keep_checkpoints: most recent checkpoints kept on disk.
        device: where training computes: ``auto`` (the run's device, :func:`classify.machine.device.detect_device`:
            the card on a GPU lot with the cuda profile, else the CPU), ``cpu`` or ``cuda``.
        threads: torch intra-op CPU threads (the machine may be shared); applies on the CPU only.
        loss_window_steps: steps averaged for the "loss fell" check (first window vs last).
        recipe: ``fixed`` (default: train ``max_steps`` or ``epochs`` on the training rows, the validation rows
            held out to the end) or ``scaled`` (issue 56, for few labels; :mod:`adapters.train.recipe`): a step budget
            that grows as the rows shrink (at least ``min_steps``), early stopping on the validation ("check")
            rows' answer loss, then a final fit on ALL rows, check rows included, for the epochs the check chose.
        min_steps: ``scaled`` only: the least step budget of the selection fit (few rows get more passes).
        eval_every_steps: ``scaled`` only: steps between two evaluations of the check rows' answer loss.
        patience_evals: ``scaled`` only: evaluations without a lower check loss that stop the selection fit.
    """

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_seq_tokens: int = Field(384, ge=16, le=131072)
    batch_size: int = Field(4, ge=1, le=1024)
    grad_accum_steps: int = Field(2, ge=1, le=1024)
    learning_rate: float = Field(3e-4, gt=0, le=1)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0)
    # strict: `true` or `"2"` is a mistake in the file, not 1 epoch or 2 (an int is still a float here)
    max_steps: Annotated[int, Strict()] | None = Field(None, ge=1)
    epochs: Annotated[float, Strict()] | None = Field(None, gt=0, le=100)
    seed: int = 0
    checkpoint_every_steps: int = Field(20, ge=1)
    checkpoint_every_s: float | None = Field(600.0, gt=0)
    keep_checkpoints: int = Field(2, ge=1, le=100)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = Field(1, ge=1, le=512)
    loss_window_steps: int = Field(10, ge=1)
    recipe: Literal["fixed", "scaled"] = "fixed"
    min_steps: int = Field(60, ge=1)
    eval_every_steps: int = Field(5, ge=1)
    patience_evals: int = Field(4, ge=1)

    def run_device(self) -> str:
        """The torch device training computes on: ``"cuda"`` or ``"cpu"`` (:attr:`device` resolved here).

        Raises:
            EnvironmentCheckError: ``device: cuda`` and torch sees no card (the doctor says why).
        """
        if self.device == "auto":
            return torch_device()
        if self.device == "cuda":
            import torch  # lazy: pulls in torch

            if not torch.cuda.is_available():
                raise EnvironmentCheckError(f"`training.device: cuda` but torch {torch.__version__} sees no card; "
                                            "run `make doctor`, or set `training.device: auto`")
        return self.device

    def compute_dtype(self) -> str:
        """Resolve :attr:`dtype` for the device training computes on (:meth:`run_device`).

        Returns:
            ``"bfloat16"`` or ``"float32"``: ``auto`` is bfloat16 on a card with native bf16 (compute
            capability 8.0+) and on a CPU with native bf16 (:func:`classify.machine.device.cpu_has_native_bf16`: on a
            2-core AVX-512-BF16 CPU a training step took 0.8x the float32 time; on AVX2-only CPUs bf16 is
            emulated and slower), else float32 (an older card trains in float32: fp16 weights need loss scaling).
            A visible card never makes a CPU run bf16.
        """
        if self.dtype != "auto":
            return self.dtype
        dtype = auto_dtype("cpu" if self.run_device() == "cpu" else "cuda")
        return "float32" if dtype == "float16" else dtype

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSection:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError(
                f"exactly one of `max_steps` and `epochs` must be set, got max_steps={self.max_steps}, "
                f"epochs={'None' if self.epochs is None else format(self.epochs, 'g')}"
            )
        return self


class SmokeSection(Frozen):
    """Overrides applied by ``--smoke`` (``make train SMOKE=1``): short sequences, a few steps.

    Attributes:
        max_doc_tokens: document budget inside the prompt.
        max_seq_tokens: sequence limit.
        train_rows: training rows used.
        validation_rows: validation rows checked.
        max_steps: optimizer steps.
        batch_size: examples per micro-batch.
        grad_accum_steps: micro-batches per step.
        checkpoint_every_steps: checkpoint interval.
        learning_rate: peak learning rate (higher, so a few steps show the loss falling).
        loss_window_steps: steps per window of the "loss fell" check.
    """

    max_doc_tokens: int = Field(48, ge=8)
    max_seq_tokens: int = Field(160, ge=16)
    train_rows: int = Field(32, ge=1)
    validation_rows: int = Field(8, ge=1)
    max_steps: int = Field(6, ge=2)
    batch_size: int = Field(2, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    checkpoint_every_steps: int = Field(2, ge=1)
    learning_rate: float = Field(2e-3, gt=0, le=1)
    loss_window_steps: int = Field(2, ge=1)


class ChecksSection(Frozen):
    """End-of-run checks before publishing.

    Attributes:
        validation_engine: ``vllm`` classifies the validation rows through the real inference path
            (:func:`classify.engine.build.build_engine` with the adapter); ``none`` skips it (images without vLLM).
        min_format_share: least share of validation rows whose free (unconstrained, greedy) answer is
            exactly an allowed category followed by end-of-turn, i.e. the inference format.
        min_validation_accuracy: least validation accuracy through the engine (0 = report only).
    """

    validation_engine: Literal["vllm", "none"] = "vllm"
    min_format_share: float = Field(0.9, ge=0, le=1)
    min_validation_accuracy: float = Field(0.0, ge=0, le=1)


class OutputSection(Frozen):
    """Where the adapter goes.

    Attributes:
        adapter_name: registry name; smoke runs publish as ``<adapter_name>-smoke``.
        publish: publish to the registry when every check passes.
        merge: also write a merged full model (counted in the disk check).
    """

    adapter_name: str = Field("adapter", pattern=r"^[a-z0-9][a-z0-9._-]{0,57}$")
    publish: bool = True
    merge: bool = False


class TrainConfig(CommandConfig):
    """Training's view of the config file: the shared sections plus ``train`` (``data``, ``lora``, ``training``,
    ``smoke``, ``checks``, ``output``); see :mod:`classify.config.file`."""

    file_section: ClassVar[str | None] = "train"

    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    classify: ClassifyConfig = ClassifyConfig()
    data: DataSection = DataSection()
    lora: LoraSection = LoraSection()
    training: TrainingSection = TrainingSection(max_steps=100)
    smoke: SmokeSection = SmokeSection()
    checks: ChecksSection = ChecksSection()
    output: OutputSection = OutputSection()

    @model_validator(mode="after")
    def _rank_fits_engine(self) -> TrainConfig:
        if self.lora.rank > self.engine.max_lora_rank:
            raise ValueError(
                f"`lora.rank` must be <= engine.max_lora_rank ({self.engine.max_lora_rank}), got {self.lora.rank}"
            )
        return self

    def for_smoke(self) -> TrainConfig:
        """This config with the :class:`SmokeSection` overrides applied (a few-minute run)."""
        s = self.smoke
        return self.model_copy(
            update={
                "classify": self.classify.model_copy(update={"max_doc_tokens": s.max_doc_tokens}),
                "data": self.data.model_copy(update={"validation_rows": s.validation_rows, "max_train_rows": s.train_rows}),
                "training": self.training.model_copy(
                    update={
                        "max_seq_tokens": s.max_seq_tokens,
                        "max_steps": s.max_steps,
                        "min_steps": min(self.training.min_steps, s.max_steps),  # the scaled recipe's budget stays small
                        "epochs": None,
                        "batch_size": s.batch_size,
                        "grad_accum_steps": s.grad_accum_steps,
                        "checkpoint_every_steps": s.checkpoint_every_steps,
                        "learning_rate": s.learning_rate,
                        "warmup_steps": 0,
                        "loss_window_steps": s.loss_window_steps,
                    }
                ),
                "checks": self.checks.model_copy(update={"min_format_share": 0.0, "min_validation_accuracy": 0.0}),
                "output": self.output.model_copy(update={"adapter_name": f"{self.output.adapter_name}-smoke"}),
            }
        )
