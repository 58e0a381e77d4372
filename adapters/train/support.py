"""Around a training run: the disk plan before it (checked by :func:`classify.runs.disk.check_disk`), write failures
told from bugs, the loss curve and the support note after it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from classify.runs.disk import error_chain, is_disk_full

LOG_BYTES = 20 * 2**20
"""Allowance for logs, loss history and the loss-curve PNG."""

ADAM_COPIES = 3
"""A checkpoint holds the LoRA weights plus AdamW's two moment buffers (Loshchilov & Hutter 2019)."""


def disk_plan(base_bytes: int, base_cached: bool, lora_params: int, keep_checkpoints: int, merge: bool) -> dict[str, int]:
    """Bytes the run will write, by item (fp32 LoRA weights, 4 bytes per parameter).

    Args:
        base_bytes: size of the base model's weights in bytes.
        base_cached: whether the base weights are already in the model cache (nothing to write).
        lora_params: LoRA parameter count.
        keep_checkpoints: checkpoints kept at once (+1 while the next is written).
        merge: whether a merged full model is written too.

    Returns:
        ``{item: bytes}`` with a ``total``.
    """
    adapter = 4 * lora_params
    plan = {
        "base_weights": 0 if base_cached else base_bytes,
        "checkpoints": (keep_checkpoints + 1) * ADAM_COPIES * adapter,
        "logs": LOG_BYTES,
        "adapter": 2 * adapter,  # the run's copy and the registry's copy
        "merged_model": base_bytes if merge else 0,
    }
    plan["total"] = sum(plan.values())
    return plan


_WRITE_FAILURE_WORDS = ("i/o error", "ioerror", "file write failed", "pytorchstreamwriter", "unexpected pos",
                        "iostream error")
"""Text of the write failures that arrive without an errno: safetensors' ``SafetensorError`` wraps the
OS error in its message, and ``torch.save``'s zip writer raises a ``RuntimeError`` ("file write failed",
or "unexpected pos N vs M" when a short write went unnoticed)."""


def is_write_failure(err: BaseException) -> bool:
    """Whether ``err``, raised while writing a file, is the machine's failure rather than a bug.

    Args:
        err: an exception raised by a file write (``open``/``write``/``fsync``, ``safetensors.torch.save_file``,
            ``torch.save``).

    Returns:
        True for any ``OSError``, a full disk (:func:`is_disk_full`), or a safetensors/torch error whose
        message reports an I/O failure; False for programming errors (``TypeError``, pickling...).
    """
    if is_disk_full(err):
        return True
    for e in error_chain(err):
        if isinstance(e, OSError):
            return True
        if type(e).__name__ in ("SafetensorError", "RuntimeError") and any(w in str(e).lower() for w in _WRITE_FAILURE_WORDS):
            return True
    return False


def device_name(cfg: Any = None) -> str:
    """The device training computes on, in words: ``cuda: NVIDIA H200``, else the CPU model.

    Args:
        cfg: the train config (its ``training.device`` resolved); ``None``: the card if torch sees one.
    """
    try:
        import torch

        on_card = torch.cuda.is_available() if cfg is None else cfg.training.run_device() != "cpu"
        if on_card:
            return f"cuda: {torch.cuda.get_device_name(0)}"
    except ImportError:  # pragma: no cover - torch is a training dependency
        pass
    except Exception as err:  # noqa: BLE001 - the note is written on a failure: never fail it again
        return f"unknown ({type(err).__name__}: {err})"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} logical cores)"


def write_support_note(run_dir: Path, error: BaseException, stage: str, cfg: Any, log_file: Path) -> Path:
    """Write ``support_note.md`` for a failed run: what to send to whoever runs the lot.

    Holds the image/template name (``DOCPILOT_IMAGE``, else the local venv), the device, sequence
    length, batch size, the first error and the last 20 lines of the training log.
    """
    tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-20:] if log_file.is_file() else []
    image = os.environ.get("DOCPILOT_IMAGE") or f"local venv ({Path(os.sys.prefix)}), Dockerfile.train equivalent"
    note = "\n".join([
        "# docpilot training: support note",
        "",
        f"- run: {run_dir.name}",
        f"- stage reached: {stage}",
        f"- error: {type(error).__name__}: {error}",
        f"- image/template: {image}",
        f"- device: {device_name(cfg)}",
        f"- base model: {cfg.model.base_model} ({cfg.training.compute_dtype()})",
        f"- sequence length: max_seq_tokens {cfg.training.max_seq_tokens}, classify.max_doc_tokens {cfg.classify.max_doc_tokens}",
        f"- batch size: {cfg.training.batch_size} x grad_accum_steps {cfg.training.grad_accum_steps}",
        "",
        "## last 20 lines of the training log",
        "",
        "```",
        *tail,
        "```",
        "",
    ])
    path = run_dir / "support_note.md"
    path.write_text(note, encoding="utf-8")
    return path


def plot_loss(history: list[dict[str, float]], path: Path, title: str) -> Path:
    """Draw the per-step training loss (and its running mean) to a PNG with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    losses = [h["loss"] for h in history]
    window = max(1, len(losses) // 10)
    smooth = [sum(losses[max(0, i - window + 1): i + 1]) / len(losses[max(0, i - window + 1): i + 1]) for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss per step")
    ax.plot(steps, smooth, lw=1.8, label=f"running mean ({window} steps)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy on the answer (nats)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path
