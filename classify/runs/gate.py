"""The pilot gate: a recorded pilot outcome per (base model, adapter, adapter mode, config), checked by batch and serve.

A record lives in ``<state>/pilots/<key>.json`` where ``key`` is :func:`combo_key`.
``make batch``, the server's base model and every adapter the server applies (:func:`adapter_keys`)
refuse a combination whose latest pilot did not pass, unless the user passes an explicit
override, which is logged loudly and recorded. This is the one source of truth: an adapter
card's ``pilot`` block only says what was piloted last, not under which config.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from classify.config.sections import classification_sha256
from classify.errors import PilotGateError
from classify.paths import pilots_dir
from classify.runs.records import utc_now, write_json_atomic
from classify.usercommand import user_flag

log = logging.getLogger(__name__)

ADAPTER_MODES = ("lora", "merged")
"""How one adapter runs: vLLM LoRA slots, or merged into the base weights (``model.adapter_mode``)."""


def combo_key(model_fingerprint: str, adapter_sha256: str | None, classification_sha256: str,
              adapter_mode: str = "lora") -> str:
    """Key of one (base model, adapter, adapter mode, config) combination.

    The mode counts only with an adapter: ``lora`` (vLLM's LoRA slots; the server's only mode)
    keeps the key it had before modes existed, ``merged`` (the adapter merged into the base
    weights, :mod:`adapters.registry.merged_cache`) gets its own, so a pilot in one mode never opens a
    batch in the other.

    Args:
        model_fingerprint: :func:`classify.model.model.weights_fingerprint` of the base model (not of a merged copy).
        adapter_sha256: the adapter's content hash from its registry card, or ``None`` for the base model alone.
        classification_sha256: :func:`classify.config.sections.classification_sha256` of the model + classify config.
        adapter_mode: ``lora`` or ``merged`` (``model.adapter_mode``); ignored without an adapter.

    Returns:
        A 64-hex sha256 digest.

    Raises:
        ValueError: ``adapter_mode`` is neither ``lora`` nor ``merged``.
    """
    if adapter_mode not in ADAPTER_MODES:
        raise ValueError(f"`adapter_mode` must be one of {ADAPTER_MODES}, got {adapter_mode!r}")
    raw = f"{model_fingerprint}|{adapter_sha256 or 'no-adapter'}|{classification_sha256}"
    if adapter_sha256 and adapter_mode != "lora":
        raw += f"|{adapter_mode}"
    return hashlib.sha256(raw.encode()).hexdigest()


def gate_key(model_fingerprint: str, model_cfg: Any, classify_cfg: Any, adapter_sha256: str | None = None,
             adapter_mode: str | None = "lora") -> str:
    """The one gate key of a run: what the pilot records, the batch checks and the server asks for.

    Args:
        model_fingerprint: the base model's fingerprint (not of a merged copy).
        model_cfg: the ``model`` section (:class:`classify.config.sections.ModelConfig`).
        classify_cfg: the ``classify`` section (:class:`classify.config.sections.ClassifyConfig`).
        adapter_sha256: the adapter's content hash (card ``sha256``), ``None`` for the base model alone.
        adapter_mode: ``lora`` or ``merged`` (``None``: ``lora``); counts only with an adapter.

    Returns:
        :func:`combo_key` of the combination, with :func:`classify.config.sections.classification_sha256` of the sections.
    """
    return combo_key(model_fingerprint, adapter_sha256, classification_sha256(model_cfg, classify_cfg),
                     adapter_mode or "lora")


PIPELINE_FIELDS = ("engine", "cpu_actors", "actor_num_cpus", "cpu_bind", "adapter_mode")
"""The pipeline settings a pilot records (:func:`pipeline_settings`): they change how the batch runs, not its answers."""


def pipeline_settings(engine_cfg: Any, run_cfg: Any, adapter_mode: str | None) -> dict[str, Any]:
    """The pipeline settings a run goes with: engine section, actor count, actor CPUs, core binding, adapter mode.

    Args:
        engine_cfg: the ``engine`` section (:class:`classify.config.sections.EngineConfig`).
        run_cfg: the ``batch`` section (:class:`classify.config.batch.RunConfig`).
        adapter_mode: ``lora``, ``merged`` or ``None`` (no adapter).

    Returns:
        A JSON-able dict with the keys of :data:`PIPELINE_FIELDS`.
    """
    return {"engine": engine_cfg.model_dump(mode="json"), "cpu_actors": run_cfg.cpu_actors,
            "actor_num_cpus": run_cfg.actor_num_cpus, "cpu_bind": run_cfg.cpu_bind, "adapter_mode": adapter_mode}


def pipeline_differences(piloted: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """Where a run's pipeline settings differ from the ones its pilot ran with.

    Args:
        piloted: the ``pipeline`` block of the pilot record (``None``: a pilot that recorded none).
        now: :func:`pipeline_settings` of the run about to start.

    Returns:
        One ``"<setting>: piloted <value>, now <value>"`` line per difference (engine fields by
        name, ``engine.max_num_seqs``); a single line saying so when the pilot recorded none.
    """
    if not piloted:
        return ["the pilot recorded no pipeline settings (a pilot of an earlier docpilot): the batch's actor "
                "count, binding and engine section are unproven"]
    out = []
    for key in PIPELINE_FIELDS:
        old, new = piloted.get(key), now.get(key)
        if key == "engine" and isinstance(old, dict) and isinstance(new, dict):
            out += [f"engine.{k}: piloted {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k)]
        elif old != new:
            out.append(f"{key}: piloted {old!r}, now {new!r}")
    return out


def adapter_keys(model_fingerprint: str, adapter_sha256: str, classification_sha256: str) -> tuple[str, str]:
    """The gate keys under which an adapter may be served by LoRA: ``(lora key, merged key)``.

    The server runs every adapter in vLLM's LoRA slots, so its own key is the ``lora`` one; a passed
    pilot of the same adapter bytes, base model and classification config run ``merged`` (the
    default ``model.adapter_mode``: the same weights folded into the base, the same answers) opens
    it too. A pilot under another ``classify`` or ``model`` config opens neither.

    Args:
        model_fingerprint: the base model's fingerprint.
        adapter_sha256: the adapter's content hash (card ``sha256``).
        classification_sha256: :func:`classify.config.sections.classification_sha256` of the served config.

    Returns:
        ``(combo_key(..., "lora"), combo_key(..., "merged"))``.
    """
    return tuple(combo_key(model_fingerprint, adapter_sha256, classification_sha256, m)  # type: ignore[return-value]
                 for m in ("lora", "merged"))


def record_pilot(key: str, run_id: str, verdict: str, detail: dict[str, Any], folder: Path | None = None) -> Path:
    """Record a pilot outcome (the latest one wins; the history is kept in the record).

    Args:
        key: :func:`combo_key` of the combination.
        run_id: the pilot's run folder name.
        verdict: ``pass`` or ``fail``.
        detail: what was piloted (model, adapter, config hashes, decision).
        folder: records folder (default :func:`classify.paths.pilots_dir`).

    Returns:
        The record file's path.
    """
    folder = folder or pilots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    with FileLock(str(path) + ".lock", timeout=30):
        record = json.loads(path.read_text()) if path.is_file() else {"key": key, "history": []}
        entry = {"run_id": run_id, "verdict": verdict, "at": utc_now(), **detail}
        record["latest"] = entry
        record["history"].append({"run_id": run_id, "verdict": verdict, "at": entry["at"]})
        write_json_atomic(path, record)
    return path


def pilot_status(key: str, folder: Path | None = None) -> dict[str, Any] | None:
    """Return the latest recorded pilot for ``key``, or ``None`` when never piloted."""
    path = (folder or pilots_dir()) / f"{key}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("latest")


def require_pilot(key: str, what: str, override: bool = False, folder: Path | None = None,
                  also: Sequence[str] = ()) -> dict[str, Any]:
    """Refuse an unpiloted combination unless ``override`` is set.

    Args:
        key: :func:`combo_key` of the combination.
        what: human description, e.g. ``"base smollm2-135m-instruct + adapter topics@1"``.
        override: the user's explicit ``--skip-pilot-gate``; logged as a warning and returned.
        folder: records folder (default :func:`classify.paths.pilots_dir`).
        also: fallback keys, asked in order when ``key`` has no record (the server: the same adapter
            and config piloted merged, see :func:`adapter_keys`); the first key with a record decides.

    Returns:
        ``{"passed": bool, "override": bool, "pilot": record|None}`` for the caller's manifest.

    Raises:
        PilotGateError: the latest pilot did not pass (or none exists) and no override was given.
    """
    status = pilot_status(key, folder)
    for other in also:  # the first key with a record decides: a failed lora pilot is not opened by a merged one
        status = status or pilot_status(other, folder)
    if status and status.get("verdict") == "pass":
        return {"passed": True, "override": False, "pilot": status}
    if override:
        log.warning("!!! PILOT GATE SKIPPED for %s: no passed pilot (latest: %s); proceeding on the user's override",
                    what, status and status.get("run_id"))
        return {"passed": False, "override": True, "pilot": status}
    latest = f"latest pilot {status['run_id']} verdict {status['verdict']}" if status else "never piloted"
    raise PilotGateError(
        f"{what} has not passed a pilot ({latest}); run `make pilot` for this base model, adapter and config "
        f"first, or pass {user_flag('--skip-pilot-gate')} to override (logged and recorded)"
    )
