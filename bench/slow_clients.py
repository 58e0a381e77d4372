"""Real clients' requests/s while 1,000 slow connections (slowloris) are open, beside the same with none, in one run.

1. Start ``docpilot serve``'s real uvicorn server (:func:`serve.cli.uvicorn_config`, default limits: 512
   connections, 10 s for the headers, 120 s for a body) in a process of its own on a free 127.0.0.1 port,
   with ``ulimit -n`` 1,024 (the common limit) and a stand-in engine that answers at once (this measures the
   HTTP layer, not the model: its answers are NOT classifications).
2. Real clients (:data:`CLIENTS` at once, asyncio + httpx) post one short document per request for
   :data:`MEASURE_S` seconds, once on keep-alive connections and once on a new connection per request.
3. Then a process of its own opens :data:`SLOW` slow connections and keeps them open (each sends a request
   line and part of a header line, then one more header byte every :data:`DRIP_S` seconds, and reconnects
   at once when the server closes it, as a slowloris tool does), and step 2 is run again while they are held.

Everything stays on 127.0.0.1 and ends after about a minute. Run alone: ``python -m bench.slow_clients``;
in ``make bench`` it is the module ``slow_clients``.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-" + "s" * 32
CLIENTS = 8
MEASURE_S = 15.0
SLOW = 1000
DRIP_S = 5.0
NOFILE = 1024
DOC = "Shares in the chip maker rose after it reported record quarterly profits and raised its forecast. " * 2


def _serve(port: int) -> None:
    """The server process: the app over a stand-in engine, under ``docpilot serve``'s uvicorn config."""
    import uvicorn

    from adapters.registry.registry import Registry
    from classify.config.sections import PilotConfig
    from classify.model.model import ModelRef
    from classify.records import Result
    from serve.app import create_app
    from serve.cli import uvicorn_config
    from serve.conn import check_fd_budget
    from serve.settings import load_settings

    class Instant:
        """Answers every readable document at once (bench only: NOT a classification)."""

        class llm:  # noqa: N801 - the attribute the server reads
            errored = False

            @staticmethod
            async def add_lora(request):
                return True

        async def classify(self, docs, adapter=None):
            return [Result.rejected(d, d.reject_reason) if d.reject_reason
                    else Result(id=d.id, status="accepted", category="tech", score=1.0) for d in docs]

        def shutdown(self):
            pass

    settings = load_settings(api_token=TOKEN, port=port, host="127.0.0.1", skip_pilot_gate=True)
    check_fd_budget(settings.max_connections)
    model = ModelRef("bench-base", "/nonexistent", "sha256:" + "0" * 64, "bench")
    app = create_app(settings, config=PilotConfig(), model=model, registry=Registry(Path(tempfile.mkdtemp()) / "registry"),
                     engine_factory=Instant)
    uvicorn.Server(uvicorn_config(app, settings)).run()


def _start(log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench.slow_clients", "--serve", str(port)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the bench server did not start: {log.read_text()[-2000:]}")


async def _clients(url: str, keep_alive: bool) -> dict[str, Any]:
    """:data:`CLIENTS` clients posting one document per request for :data:`MEASURE_S` seconds."""
    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    end = time.monotonic() + MEASURE_S
    body = {"documents": [{"id": "d", "text": DOC}]}
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def one(client: httpx.AsyncClient) -> None:
        t0 = time.monotonic()
        try:
            r = await client.post(f"{url}/v1/classify", json=body, headers=headers)
            if r.status_code == 200:
                latencies.append(time.monotonic() - t0)
            else:
                errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
        except httpx.HTTPError as err:
            errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1

    async def worker() -> None:
        limits = httpx.Limits(max_keepalive_connections=1 if keep_alive else 0)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            while time.monotonic() < end:
                await one(client)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CLIENTS)))
    wall = time.monotonic() - t0
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else 0.0

    return {"requests_ok": len(latencies), "requests_per_s": round(len(latencies) / wall, 1), "p50_ms": pct(0.5),
            "p99_ms": pct(0.99), "errors": errors, "seconds": round(wall, 1)}


class _Slowloris:
    """:data:`SLOW` connections kept open: partial headers, one more byte every :data:`DRIP_S` s, reopened when closed."""

    def __init__(self, port: int):
        self.port = port
        self.open = 0
        self.opened = 0
        self.closed_by_server = 0
        self.refused = 0
        self.stop = False

    async def _one(self) -> None:
        while not self.stop:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.refused += 1
                await asyncio.sleep(0.5)
                continue
            self.opened += 1
            self.open += 1
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                await writer.drain()
                while not self.stop:
                    try:
                        if await asyncio.wait_for(reader.read(4096), DRIP_S) == b"":
                            break  # closed by the server (its header deadline, or the connection cap)
                        # an answer (408): the server closes next
                    except TimeoutError:
                        writer.write(b"a")
                        await writer.drain()
            except OSError:
                pass
            finally:
                self.open -= 1
                writer.close()
            if not self.stop:
                self.closed_by_server += 1

    async def hold(self) -> list[asyncio.Task]:
        tasks = []
        for i in range(SLOW):
            tasks.append(asyncio.create_task(self._one()))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        return tasks


async def _hold(port: int, seconds: float, stats: Path) -> None:
    """The slow-connection process: :data:`SLOW` connections for ``seconds``, their counts written to ``stats`` each second."""
    slow = _Slowloris(port)
    tasks = await slow.hold()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stats.write_text(json.dumps({"open": slow.open, "opened_in_all": slow.opened,
                                     "closed_by_server": slow.closed_by_server, "refused": slow.refused}))
        await asyncio.sleep(1)
    slow.stop = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _measure(url: str, tmp: Path) -> dict[str, Any]:
    """Both client modes with no slow connection, then again while a process of its own holds :data:`SLOW` of them."""
    rows: dict[str, Any] = {"none": {}, "slow": {}}
    for keep_alive in (True, False):
        rows["none"]["keep-alive" if keep_alive else "new connection"] = asyncio.run(_clients(url, keep_alive))
    stats = tmp / "slowloris.json"
    hold_s = 2 * MEASURE_S + 15
    loris = subprocess.Popen([sys.executable, "-m", "bench.slow_clients", "--slowloris", url.rsplit(":", 1)[1], str(hold_s),
                              str(stats)], cwd=ROOT)
    deadline = time.time() + 10
    while time.time() < deadline and (not stats.exists() or json.loads(stats.read_text() or "{}").get("open", 0) < SLOW):
        time.sleep(0.2)
    time.sleep(3)
    at_start = json.loads(stats.read_text())
    for keep_alive in (True, False):
        rows["slow"]["keep-alive" if keep_alive else "new connection"] = asyncio.run(_clients(url, keep_alive))
    at_end = json.loads(stats.read_text())
    loris.terminate()
    loris.wait(30)
    seconds = 2 * MEASURE_S
    rows["slowloris"] = {"connections": SLOW, "open_at_start": at_start["open"], "open_at_end": at_end["open"],
                         "opened_while_measuring": at_end["opened_in_all"] - at_start["opened_in_all"],
                         "closed_by_server_per_s": round((at_end["closed_by_server"] - at_start["closed_by_server"]) / seconds, 1),
                         "refused": at_end["refused"]}
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    """The two conditions, each with keep-alive clients and a new connection per request.

    Args:
        quick: ignored (the run is already about a minute).

    Returns:
        ``{"title", "figures", "markdown"}`` for :mod:`bench.run`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp) / "server.log")
        try:
            figures = _measure(url, Path(tmp))
            figures["server_alive_after"] = proc.poll() is None
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log_tail = [line for line in (Path(tmp) / "server.log").read_text(errors="replace").splitlines()
                    if "WARNING" in line][:6]
    figures["server_warnings"] = log_tail
    figures["settings"] = {"clients": CLIENTS, "measure_s": MEASURE_S, "slow": SLOW, "drip_s": DRIP_S,
                           "server_nofile": NOFILE}
    s = figures["slowloris"]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"{CLIENTS} real clients post one {len(DOC)}-character document per request for {MEASURE_S:g} s to the real "
             f"uvicorn server of `docpilot serve` (default limits: 512 connections, 10 s for headers) on 127.0.0.1, "
             f"`ulimit -n` {NOFILE}, over a stand-in engine that answers at once (the HTTP layer alone). Then {SLOW} "
             f"slow connections (partial headers, one byte every {DRIP_S:g} s, reopened when closed) are held while "
             "the same clients run again.", "",
             "| slow connections | clients | requests/s | p50 ms | p99 ms | errors |", "|---|---|---:|---:|---:|---|"]
    for cond, label in (("none", "none"), ("slow", f"{SLOW:,} held")):
        for mode, r in figures[cond].items():
            lines.append(f"| {label} | {mode} | {r['requests_per_s']} | {r['p50_ms']} | {r['p99_ms']} | "
                         f"{r['errors'] or 'none'} |")
    lines += ["", f"Slow connections (a process of their own): {s['open_at_start']} open when the clients started, "
              f"{s['open_at_end']} at the end; while the clients ran the server closed {s['closed_by_server_per_s']} of "
              f"them per second (the connection cap closes the oldest still sending headers for each newcomer, and "
              f"each reconnects at once) and {s['refused']} connects were refused. The server was "
              f"{'alive' if figures['server_alive_after'] else 'DEAD'} afterwards. Server, slow connections and "
              f"clients share this machine's cores (load average at the end: {load}): compare rows of one run only."]
    return {"title": "Real clients while 1,000 slow connections are open", "figures": figures, "markdown": "\n".join(lines)}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        os.environ.setdefault("DOCPILOT_HOME", tempfile.mkdtemp())
        _serve(int(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "--slowloris":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < SLOW + 200:  # this process holds the slow connections' client ends
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, SLOW + 1024), hard))
        asyncio.run(_hold(int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])))
    else:
        from bench.common import run_alone

        run_alone(run, __doc__)
