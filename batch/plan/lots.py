"""The lots config (``config/lots.json``): what is the lot's: the rented GPU model, period, lots, prices,
the per-card overhead and the lease end. Read by ``docpilot plan`` (:mod:`batch.plan.plan`) and the lease clock
(:func:`batch.lease.clock.lease_end`).

The job the plan sizes (model, engine, training) is not here: it is ``config/docpilot.json``'s, the
file every other command reads (:func:`job_shape`). A lots file of an earlier docpilot with its own
``model``/``engine``/``training`` sections is refused with what moved where (:data:`MOVED_SECTIONS`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, Field, field_validator, model_validator

from classify.config.sections import ClassifyConfig, EngineConfig, Frozen, ModelConfig, load_config
from classify.config.training import LINEAR_MODULES, TrainConfig
from classify.errors import ConfigError

Period = Literal["3", "7", "30"]
LoraTarget = Literal[LINEAR_MODULES]  # type: ignore[valid-type] # the names of classify.config.training.LINEAR_MODULES


class GpuSpec(Frozen):
    """One rentable GPU model: what a lot holds and what the user pays for it.

    Attributes:
        card_memory_gib: memory of ONE card in GiB, as the driver reports it (``nvidia-smi`` /
            ``rocm-smi`` total), never summed over the cards of a lot.
        cards_per_lot: cards in one lot (2 for B200, 1 otherwise).
        backend: ``cuda`` (NVIDIA) or ``rocm`` (AMD) — which vLLM build the card needs.
        usd_per_lot: the user's price in USD for ONE lot (all its cards) per period, keyed by
            period in days (``"3"``, ``"7"``, ``"30"``).
    """

    card_memory_gib: float = Field(gt=0, le=1024)
    cards_per_lot: int = Field(1, ge=1, le=8)
    backend: Literal["cuda", "rocm"] = "cuda"
    usd_per_lot: dict[Period, float] = Field(min_length=1)

    @field_validator("usd_per_lot")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"must hold prices > 0 USD, got {bad}")
        return value


class TrainingShape(Frozen):
    """The LoRA training job whose memory the plan estimates, as :func:`job_shape` reads it from ``config/docpilot.json``.

    Attributes:
        batch_size: sequences per optimizer micro-step (per card).
        seq_len_tokens: tokens per training sequence.
        lora_rank: adapter rank r.
        lora_targets: linear layers that get adapters (``q_proj`` ... ``down_proj``).
        gradient_checkpointing: recompute activations in the backward pass (``docpilot train`` does not).
    """

    batch_size: int = Field(8, ge=1, le=4096)
    seq_len_tokens: int = Field(512, ge=16, le=131072)
    lora_rank: int = Field(16, ge=1, le=512)
    lora_targets: tuple[LoraTarget, ...] = Field(("q_proj", "k_proj", "v_proj", "o_proj"), min_length=1)
    gradient_checkpointing: bool = True


MOVED_SECTIONS = {
    "model": "`model` of config/docpilot.json",
    "engine": "`engine` of config/docpilot.json",
    "training": "`train.training` (batch_size, max_seq_tokens) and `train.lora` (rank, target_modules) of "
                "config/docpilot.json",
}
"""Sections an earlier ``lots.json`` held, and where the plan reads them now."""


class JobShape(Frozen):
    """The configured job the plan sizes: ``config/docpilot.json``'s model, engine and training (:func:`job_shape`).

    Attributes:
        model: the ``model`` section; ``base_model`` may also name a built-in shape (``llama-2-7b``,
            ``mistral-7b``, ``llama-3-8b``, ``qwen2.5-7b``).
        engine: the ``engine`` section (``max_num_seqs``, ``max_loras``, ``max_lora_rank``,
            ``gpu_memory_utilization``; ``"auto"`` resolved for the lot's backend).
        training: the LoRA training job.
        classify: the ``classify`` section (``long_documents``, ``max_windows``, ``max_doc_tokens``: the prompts
            each document costs, :func:`batch.plan.plan.prompts_plan`).
    """

    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    training: TrainingShape = TrainingShape()
    classify: ClassifyConfig = ClassifyConfig()


def job_shape(config_path: Any) -> JobShape:
    """The job of a docpilot config file as the plan sizes it.

    Args:
        config_path: ``config/docpilot.json`` (or another file of the same layout).

    Returns:
        Its ``model`` and ``engine`` sections, and the training shape from ``train.training``
        (``batch_size``, ``max_seq_tokens``) and ``train.lora`` (``rank``, ``target_modules``).

    Raises:
        ConfigError: missing or invalid file (a lots file given as the config is named so).
    """
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and "gpus" in data and "gpu_model" in data:
        raise ConfigError(f"{config_path} is a lots config (gpu_model, gpus): `docpilot plan --config` takes the job's "
                          "config (config/docpilot.json); pass the lots file as --lots-config (make plan LOTS_CONFIG=...)")
    cfg = load_config(TrainConfig, config_path)
    return JobShape(model=cfg.model, engine=cfg.engine, classify=cfg.classify, training=TrainingShape(
        batch_size=cfg.training.batch_size, seq_len_tokens=cfg.training.max_seq_tokens, lora_rank=cfg.lora.rank,
        lora_targets=tuple(cfg.lora.target_modules), gradient_checkpointing=False))

class LeaseSection(Frozen):
    """``lease`` in ``config/lots.json``: how docpilot may stop the rental once everything is copied off it.

    Attributes:
        stop_command: the provider's own command that stops this pod, as an argv list (e.g.
            ``["runpodctl", "stop", "pod", "abc123"]``), or ``null`` (docpilot ships none). It is run
            without a shell, exactly as written (no interpolation), only after a verified wrap-up
            (:mod:`batch.lot.wrapup`); every decision to run it or not is recorded in ``lease-stop.json``.
        stop_timeout_s: seconds the stop command may take before it counts as failed.
    """

    stop_command: tuple[str, ...] | None = Field(None, min_length=1)
    stop_timeout_s: float = Field(300.0, gt=0, le=3600)

    @field_validator("stop_command")
    @classmethod
    def _no_empty_program(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value[0].strip():
            raise ValueError(f"must start with the program to run, got {list(value)!r}")
        return value


class LotsConfig(Frozen):
    """``config/lots.json``: the order, the price table, the per-card overhead and the lease end (what is the lot's).

    Further sections (such as a ``lease`` section) may be added beside these; the job's model, engine and
    training sections are refused (:data:`MOVED_SECTIONS`).

    Attributes:
        gpu_model: key of ``gpus`` to order.
        period_days: rental period: 3, 7 or 30 days.
        lots: number of lots, 1 to 10.
        image_backend: the vLLM build inside the serving image (``cuda`` or ``rocm``).
        overhead_gib_per_card: fixed reserve per card in GiB (driver context, one step's
            activation peak, allocator fragmentation).
        gpus: the catalogue and the user's price table, by GPU model name.
        lease_ends_at: when the rented lot(s) stop (ISO 8601 with a timezone, e.g.
            ``2026-12-03T18:00:00Z``), or ``null``. ``docpilot status`` compares a batch's ETA plus
            its export time with it; the pilot records it in its run folder.
        lease: the stop command run after a verified wrap-up (:class:`LeaseSection`).
    """

    gpu_model: str = Field(min_length=1)
    period_days: Literal[3, 7, 30]
    lots: int = Field(ge=1, le=10)
    image_backend: Literal["cuda", "rocm"] = "cuda"
    overhead_gib_per_card: float = Field(2.0, ge=0, le=64)
    gpus: dict[str, GpuSpec] = Field(min_length=1)
    lease_ends_at: AwareDatetime | None = None
    lease: LeaseSection = LeaseSection()

    @model_validator(mode="before")
    @classmethod
    def _moved_sections(cls, data: Any) -> Any:
        if isinstance(data, dict) and (message := moved_sections_message(data)):
            raise ValueError(message)
        return data


def moved_sections_message(data: dict[str, Any]) -> str | None:
    """What moved where, for a lots config holding the job's sections of an earlier docpilot; ``None`` when none."""
    moved = [k for k in MOVED_SECTIONS if k in data]
    if not moved:
        return None
    return ("the job's sections moved out of the lots config: " + "; ".join(f"`{k}` -> {MOVED_SECTIONS[k]}" for k in moved)
            + ". Delete them from the lots config: make plan now sizes the job of config/docpilot.json, the file "
            "every other command reads")


def load_lots(path: Any, overrides: dict[str, Any] | None = None) -> LotsConfig:
    """Read and validate a lots config (``config/lots.json``).

    Args:
        path: the JSON file.
        overrides: dotted keys to set after reading (``gpu_model``, ``lots``...).

    Returns:
        The frozen :class:`LotsConfig`.

    Raises:
        ConfigError: missing file, invalid JSON or field, or the job sections of an earlier lots config
            (``model``, ``engine``, ``training``), named with where each one moved.
    """
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None  # load_config names the problem
    if isinstance(data, dict) and (message := moved_sections_message(data)):
        raise ConfigError(f"{path}: {message}")
    return load_config(LotsConfig, path, overrides)


def gpu_spec(cfg: LotsConfig) -> GpuSpec:
    """The ordered GPU model's entry, with its price for the period checked.

    Raises:
        ConfigError: unknown ``gpu_model`` or no price for ``period_days``.
    """
    if cfg.gpu_model not in cfg.gpus:
        raise ConfigError(f"`gpu_model` must be one of {sorted(cfg.gpus)}, got {cfg.gpu_model!r}")
    spec = cfg.gpus[cfg.gpu_model]
    if str(cfg.period_days) not in spec.usd_per_lot:
        raise ConfigError(
            f"`gpus.{cfg.gpu_model}.usd_per_lot` has no price for period_days {cfg.period_days} "
            f"(listed: {sorted(spec.usd_per_lot, key=int)})"
        )
    return spec


def load_lease_part(path: Any) -> LotsConfig:
    """A lots config read for its lease fields only (``lease_ends_at``, ``lease``), as batch, pilot, status and wrap-up read it.

    An earlier ``lots.json`` that still holds the job's sections (``model``, ``engine``, ``training``)
    is refused by ``make plan`` (:func:`load_lots`), but here it only gets a warning, with those
    sections left out: a batch resumed in the middle of a lease must not stop over a field it never reads.

    Args:
        path: the JSON file.

    Returns:
        The frozen :class:`LotsConfig` without the moved sections.

    Raises:
        ConfigError: missing file, invalid JSON or an invalid lot/lease field.
    """
    import json
    import logging
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return load_lots(path)  # names the problem
    if isinstance(data, dict) and (message := moved_sections_message(data)):
        logging.getLogger("docpilot.lots").warning("%s: %s", path, message)
        data = {k: v for k, v in data.items() if k not in MOVED_SECTIONS}
        try:
            return LotsConfig.model_validate(data)
        except ValueError as err:
            raise ConfigError(f"{path}: {err}") from None
    return load_lots(path)
