"""The vLLM engine wrapper: one builder for every front end, and label scoring.

:func:`build_engine` is the only place an offline ``vllm.LLM`` is made (pilot, Ray
batch actors and benchmarks call it); ``serve/`` builds vLLM's async engine from
the same :func:`engine_kwargs`. :class:`Scorer` turns documents into prompts and
sampling parameters and turns vLLM outputs into :class:`~classify.records.Result`
records, so the offline and the async paths score identically.

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
into the weights (:meth:`Classifier.classify`'s ``temperature``). ``choice`` scores are
left as they are: only the chosen answer's log-prob is known there, not the other categories'.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from classify.config import ClassifyConfig, EngineConfig, ModelConfig
from classify.errors import AdapterError, EngineError, Interrupted
from classify.model import ModelRef, resolve_model
from classify.prompt import Prompt, build_prompt, category_first_tokens
from classify.records import Document, Result

log = logging.getLogger(__name__)


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


def card_temperature(card: Mapping[str, Any] | None) -> float:
    """The score temperature an adapter card holds (``card["calibration"]["temperature"]``).

    Args:
        card: the parsed ``card.json`` (``None``: no adapter).

    Returns:
        T > 0; 1.0 when there is no card, no ``calibration`` or no ``temperature`` in it.

    Raises:
        AdapterError: the card's temperature is not a finite number in (0, 100].
    """
    value = ((card or {}).get("calibration") or {}).get("temperature")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 < value <= 100:
        raise AdapterError(f"adapter card `calibration.temperature` must be a number in (0, 100], got {value!r}")
    return float(value)


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


def on_accelerator() -> bool:
    """Whether a CUDA/ROCm device is visible to torch (else vLLM runs its CPU backend)."""
    import torch

    return bool(torch.cuda.is_available())


def cpu_has_native_bf16() -> bool:
    """Whether this x86 CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16 in ``/proc/cpuinfo``).

    Without them torch falls back to a slow reference kernel: measured here on an AVX2-only
    AMD EPYC, a 2048 x 2048 bf16 matmul ran at ~1 GFLOP/s against ~150 GFLOP/s in float32.
    """
    try:
        flags = open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(model_cfg: ModelConfig) -> str:
    """Resolve ``model.dtype``: ``auto`` is bfloat16 on accelerators and bf16-capable CPUs, else float32.

    Returns:
        ``"bfloat16"``, ``"float16"`` or ``"float32"``.
    """
    if model_cfg.dtype != "auto":
        return model_cfg.dtype
    return "bfloat16" if on_accelerator() or cpu_has_native_bf16() else "float32"


def detect_device() -> str:
    """The device this machine's engine runs on: ``cuda``, ``rocm`` (torch's HIP build) or ``cpu``.

    Returns:
        ``"cuda"`` or ``"rocm"`` when torch sees an accelerator (``torch.version.hip`` tells ROCm
        apart), else ``"cpu"`` (vLLM's CPU backend).
    """
    if not on_accelerator():
        return "cpu"
    import torch

    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def engine_kwargs(
    model: ModelRef,
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    enable_lora: bool,
    device: str | None = None,
) -> dict[str, Any]:
    """vLLM ``EngineArgs`` keyword arguments for docpilot's classifier, chosen for the device.

    ``"auto"`` engine fields are resolved for ``device`` (:meth:`EngineConfig.resolve`): eager mode,
    64 sequences and vLLM's token budget on CPU; CUDA graphs, 256 sequences, 16384 batched tokens and
    ``gpu_memory_utilization`` on CUDA/ROCm. Values the user set are passed as given. On CPU it also
    exports ``VLLM_CPU_KVCACHE_SPACE`` (GiB), where vLLM reads the KV-cache size from the environment
    rather than from ``gpu_memory_utilization``.

    Args:
        model: the resolved base model.
        model_cfg: dtype (``auto`` resolved by :func:`compute_dtype`) and ``max_model_len``.
        engine_cfg: engine sizing.
        enable_lora: reserve LoRA slots (``max_loras`` x ``max_lora_rank``).
        device: ``cpu``, ``cuda`` or ``rocm``; ``None`` detects this machine's (:func:`detect_device`).

    Returns:
        Keyword arguments for ``vllm.LLM(...)`` or ``vllm.AsyncEngineArgs(...)``.

    Raises:
        ConfigError: an unknown ``device``.
    """
    device = device or detect_device()
    eng = engine_cfg.resolve(device)
    if model_cfg.dtype != "auto":
        dtype = model_cfg.dtype
    else:  # compute_dtype's rule, for the device asked for rather than this machine's
        dtype = "bfloat16" if device != "cpu" or cpu_has_native_bf16() else "float32"
    kwargs: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.path,
        "dtype": dtype,
        "max_model_len": model_cfg.max_model_len,
        "max_num_seqs": eng.max_num_seqs,
        "enforce_eager": eng.enforce_eager,
        "seed": eng.seed,
        "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True,
    }
    if eng.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = eng.max_num_batched_tokens
    if device == "cpu":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(eng.kv_cache_space_gib)
    else:
        kwargs["gpu_memory_utilization"] = eng.gpu_memory_utilization
    if enable_lora:
        kwargs.update(enable_lora=True, max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank)
    return kwargs


class Scorer:
    """Prompts in, results out: the engine-independent half of classification.

    Args:
        tokenizer: the base model's tokenizer.
        classify_cfg: categories, instruction, budgets and scoring mode.
        max_model_len: the engine's context length in tokens.

    Raises:
        ConfigError-like ``EngineError``: ``scoring="first-token"`` asked for but first tokens collide.
    """

    def __init__(self, tokenizer: Any, classify_cfg: ClassifyConfig, max_model_len: int):
        self.tokenizer = tokenizer
        self.cfg = classify_cfg
        self.max_model_len = max_model_len
        firsts = category_first_tokens(tokenizer, classify_cfg.categories)
        if classify_cfg.scoring == "first-token" and firsts is None:
            raise EngineError(
                "`classify.scoring` is 'first-token' but two categories share a first token; "
                "use 'auto' or 'choice'"
            )
        self.mode = "choice" if classify_cfg.scoring == "choice" or firsts is None else "first-token"
        self.first_tokens = firsts or []
        self._token_to_category = dict(zip(self.first_tokens, classify_cfg.categories, strict=False))

    def prompt(self, doc: Document) -> Prompt | Result:
        """Render ``doc``'s prompt, or return its rejected result (unreadable or too long)."""
        if doc.reject_reason is not None or doc.text is None:
            return Result.rejected(doc, doc.reject_reason or "no text")
        prompt = build_prompt(self.tokenizer, self.cfg, doc.text)
        if prompt.n_tokens >= self.max_model_len:
            return Result.rejected(
                doc,
                f"prompt is {prompt.n_tokens} tokens, over max_model_len {self.max_model_len} "
                "(lower classify.max_doc_tokens or raise model.max_model_len)",
                prompt.n_tokens,
            )
        return prompt

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
        """Turn one vLLM ``CompletionOutput`` into the result record.

        Args:
            doc: the document.
            prompt: its rendered prompt.
            completion: vLLM's ``CompletionOutput``.
            temperature: score temperature T (first-token mode: ``softmax(logprobs / T)``; 1.0 = raw).

        Returns:
            ``accepted`` with an allowed category and its probability, or ``rejected`` with the
            reason when the engine answered outside the allowed set (never silently dropped).
        """
        category: str | None
        if self.mode == "first-token":
            token = completion.token_ids[0] if completion.token_ids else None
            category = self._token_to_category.get(token)
            logprobs = completion.logprobs[0] if completion.logprobs else {}
            cat_lp = {tid: lp.logprob for tid, lp in logprobs.items() if tid in self._token_to_category}
            if category is not None and token in cat_lp:
                score = softmax_at(cat_lp, token, temperature)
            else:
                score = None
        else:
            category = completion.text.strip()
            score = math.exp(completion.cumulative_logprob) if completion.cumulative_logprob is not None else None
        if category not in self.cfg.categories:
            return Result.rejected(doc, f"engine answer {completion.text!r} is not an allowed category", prompt.n_tokens)
        return Result(
            id=doc.id,
            status="accepted",
            category=category,
            score=None if score is None else min(1.0, max(0.0, round(score, 6))),
            input_sha256=doc.input_sha256,
            n_chars=doc.n_chars,
            n_tokens=prompt.n_tokens,
        )


def resolve_temperature(adapter: AdapterHandle | None, temperature: float | None = None) -> float:
    """The temperature to score with: ``temperature`` if given, else the adapter's, else 1.0."""
    if temperature is not None:
        return temperature
    return adapter.temperature if adapter is not None else 1.0


class Classifier:
    """An offline vLLM engine plus its :class:`Scorer`. Build it with :func:`build_engine`.

    Attributes:
        llm: the ``vllm.LLM``.
        scorer: prompt rendering and scoring.
        model: the resolved base model.
        lora_enabled: whether LoRA slots were reserved (adapters can be applied).
    """

    def __init__(self, llm: Any, scorer: Scorer, model: ModelRef, lora_enabled: bool):
        self.llm = llm
        self.scorer = scorer
        self.model = model
        self.lora_enabled = lora_enabled

    def classify(self, docs: Sequence[Document], adapter: AdapterHandle | None = None, progress: bool = False,
                 temperature: float | None = None) -> list[Result]:
        """Classify documents; one result per input document, in input order.

        Args:
            docs: documents (already-rejected ones pass straight through as rejected).
            adapter: LoRA adapter to apply, or ``None`` for the base model.
            progress: show vLLM's progress bar.
            temperature: score temperature; ``None`` takes ``adapter.temperature`` (1.0 without an
                adapter). Pass the card's value when the adapter is merged into the weights.

        Returns:
            ``len(docs)`` results, ``results[i].id == docs[i].id``.

        Raises:
            EngineError: an adapter was given to an engine built without LoRA, or vLLM failed.
        """
        if adapter is not None and not self.lora_enabled:
            raise EngineError("an adapter was given but the engine was built without LoRA (enable_lora=False)")
        results: list[Result | None] = [None] * len(docs)
        pending: list[tuple[int, Prompt]] = []
        for i, doc in enumerate(docs):
            rendered = self.scorer.prompt(doc)
            if isinstance(rendered, Result):
                results[i] = rendered
            else:
                pending.append((i, rendered))
        if pending:
            try:
                outputs = self.llm.generate(
                    [p.text for _, p in pending],
                    self.scorer.sampling_params(),
                    use_tqdm=progress,
                    lora_request=adapter.lora_request() if adapter else None,
                )
            except Interrupted:
                raise
            except Exception as err:  # vLLM raises many types; keep the first error whole
                raise EngineError(f"vLLM generate failed: {type(err).__name__}: {err}") from err
            t = resolve_temperature(adapter, temperature)
            for (i, prompt), output in zip(pending, outputs, strict=True):
                results[i] = self.scorer.result(docs[i], prompt, output.outputs[0], t)
        return [r for r in results if r is not None]

    def shutdown(self) -> None:
        """Stop the engine's worker processes (safe to call twice)."""
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def build_engine(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    classify_cfg: ClassifyConfig,
    enable_lora: bool = False,
    model: ModelRef | None = None,
) -> Classifier:
    """Build the offline vLLM classifier: the one constructor pilot, batch and benchmarks share.

    Args:
        model_cfg: base model and dtype (resolved and provisioned if ``model`` is not given).
        engine_cfg: engine sizing.
        classify_cfg: categories and prompt settings.
        enable_lora: reserve LoRA slots so adapters can be applied per request.
        model: an already-resolved model (skips :func:`resolve_model`).

    Returns:
        A ready :class:`Classifier` (the engine start takes about 40 s on a 2-core CPU).

    Raises:
        EngineError: the model cannot be resolved or vLLM fails to start.
    """
    model = model or resolve_model(model_cfg)
    kwargs = engine_kwargs(model, model_cfg, engine_cfg, enable_lora)
    try:
        from vllm import LLM

        llm = LLM(**kwargs)
    except Interrupted:
        raise  # SIGTERM / Ctrl-C during the start: not an engine failure
    except Exception as err:
        raise EngineError(f"vLLM could not load {model.path!r}: {type(err).__name__}: {err}") from err
    scorer = Scorer(llm.get_tokenizer(), classify_cfg, model_cfg.max_model_len)
    log.info("engine ready: model=%s scoring=%s lora=%s", model.path, scorer.mode, enable_lora)
    return Classifier(llm, scorer, model, enable_lora)
