"""Load test of the HTTP server on loopback, compared with the offline batch path on the same documents.

1. Start ``docpilot serve`` (real uvicorn + vLLM async engine) on a free 127.0.0.1 port, warm it up.
2. ``clients`` concurrent httpx clients (asyncio) take BBC test articles from one shared queue,
   ``docs_per_request`` per request, until the queue is empty or ``duration_s`` has passed; every
   article is sent at most once, so vLLM's prefix cache cannot flatter the server.
3. Stop the server (SIGTERM), then time the offline ``Classifier.classify`` (one ``vllm.LLM``
   batch) on exactly the articles the server classified. Never two engines at once.

Run alone: ``python -m bench.serve_load [--quick]``.

``python -m bench.serve_load --hostile [--server-root DIR] [--max-in-flight N] [--json-out FILE]`` runs
the two hostile scenarios instead, against one server (see :func:`run_hostile`): over capacity (an
open-loop client offering several times what the engine does, with a client timeout) and hang-ups
(clients that leave after a few seconds). ``--server-root`` runs another checkout's ``docpilot serve``
(e.g. a ``git worktree`` of main) with the same client, for before/after figures on one machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-" + "b" * 32
START_TIMEOUT_S = 900
REQUEST_TIMEOUT_S = 300


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0-100) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _start_server(config: Path, log_path: Path, root: Path = ROOT,
                  extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "docpilot", "serve", "--config", str(config), "--host", "127.0.0.1",
           "--port", str(port), "--skip-pilot-gate", *extra]
    env = {**os.environ, "DOCPILOT_API_TOKEN": TOKEN, "PYTHONPATH": str(root)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s")


async def _load(url: str, docs: list[dict], clients: int, per_request: int, duration_s: float) -> dict:
    queue: asyncio.Queue[list[dict]] = asyncio.Queue()
    for i in range(0, len(docs), per_request):
        queue.put_nowait(docs[i:i + per_request])
    latencies: list[float] = []
    sent: list[str] = []
    errors: list[str] = []
    stop_at = time.perf_counter() + duration_s

    async def client(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < stop_at and not queue.empty():
            batch = queue.get_nowait()
            started = time.perf_counter()
            try:
                resp = await http.post("/v1/classify", json={"documents": batch})
                ok = resp.status_code == 200 and len(resp.json()["results"]) == len(batch)
                if not ok:
                    errors.append(f"{resp.status_code}: {resp.text[:200]}")
            except httpx.HTTPError as err:
                ok = False
                errors.append(f"{type(err).__name__}: {err}")
            latencies.append(time.perf_counter() - started)
            if ok:
                sent.extend(d["id"] for d in batch)

    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - began
    return {"elapsed_s": elapsed, "latencies": latencies, "ids": sent, "errors": errors}


def run(quick: bool = False) -> dict:
    """Run the load test and the offline comparison.

    Args:
        quick: 4 clients for at most 20 s on 24 articles (a check that the path works) instead of
            8 clients for at most 120 s on all 334 test articles.

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    from batch.corpus.tabular import iter_csv
    from bench.common import bbc_dir
    from classify.config.sections import PilotConfig, load_config
    from classify.engine.build import build_engine

    clients, per_request, duration_s, n_docs = (4, 2, 20.0, 24) if quick else (8, 4, 120.0, 334)
    config = ROOT / "config" / "docpilot.json"
    cfg = load_config(PilotConfig, config)
    rows = list(iter_csv(bbc_dir() / "test.csv", cfg.classify.max_doc_bytes, id_column=None, id_prefix="bbc-test"))
    docs = [{"id": d.id, "text": d.text} for d, _ in rows if d.text][:n_docs]
    by_id = {d.id: d for d, _ in rows}

    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        log_path = Path(tmp) / "server.log"
        proc, url = _start_server(config, log_path)
        try:
            warm = httpx.post(f"{url}/v1/classify", json={"documents": [{"id": "warm", "text": "Warm-up text."}]},
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=REQUEST_TIMEOUT_S)
            warm.raise_for_status()
            load = asyncio.run(_load(url, docs, clients, per_request, duration_s))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()

    served = [by_id[i] for i in load["ids"]]
    clf = build_engine(cfg.model, cfg.engine, cfg.classify, enable_lora=True)
    try:
        clf.classify(served[:2])  # warm-up, as the server had
        started = time.perf_counter()
        clf.classify(served)
        offline_s = time.perf_counter() - started
    finally:
        clf.shutdown()

    n_req = len(load["latencies"])
    served_dps = len(served) / load["elapsed_s"]
    offline_dps = len(served) / offline_s if offline_s else 0.0
    figures = {
        "clients": clients,
        "docs_per_request": per_request,
        "duration_limit_s": duration_s,
        "elapsed_s": round(load["elapsed_s"], 2),
        "requests": n_req,
        "documents": len(served),
        "requests_per_s": round(n_req / load["elapsed_s"], 3),
        "docs_per_s": round(served_dps, 3),
        "latency_p50_s": round(_percentile(load["latencies"], 50), 3),
        "latency_p99_s": round(_percentile(load["latencies"], 99), 3),
        "errors": len(load["errors"]),
        "first_errors": load["errors"][:3],
        "offline_docs_per_s": round(offline_dps, 3),
        "served_over_offline": round(served_dps / offline_dps, 3) if offline_dps else None,
    }
    f = figures
    markdown = "\n".join([
        "## Serving under load (loopback)",
        "",
        f"{f['clients']} concurrent clients, {f['docs_per_request']} BBC test articles per request, each article "
        f"sent once, for at most {f['duration_limit_s']:.0f} s; then the offline `Classifier.classify` on the same "
        f"{f['documents']} articles.",
        "",
        "| path | documents | requests/s | docs/s | p50 latency (s) | p99 latency (s) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| HTTP server | {f['documents']} | {f['requests_per_s']} | {f['docs_per_s']} | {f['latency_p50_s']} "
        f"| {f['latency_p99_s']} | {f['errors']} |",
        f"| offline batch | {f['documents']} | - | {f['offline_docs_per_s']} | - | - | - |",
        "",
        f"Served / offline docs/s: **{f['served_over_offline']}**.",
    ])
    return {"title": "Serving load test", "figures": figures, "markdown": markdown}


def _classified(text: str) -> float:
    """Sum of ``docpilot_documents_total`` in a ``/metrics`` page (documents the server classified)."""
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("docpilot_documents_total{"))


async def _drain(http: httpx.AsyncClient, limit_s: float = 180.0) -> tuple[float, float]:
    """Wait until the server stops classifying (the count is still for 3 s); ``(documents classified, seconds)``."""
    began = time.perf_counter()
    last, still = -1.0, 0
    while time.perf_counter() - began < limit_s:
        now = _classified((await http.get("/metrics")).text)
        still = still + 1 if now == last else 0
        if still >= 3:
            break
        last = now
        await asyncio.sleep(1.0)
    return last, max(0.0, time.perf_counter() - began - 3.0)


async def _probe_health(url: str, stop: asyncio.Event, worst: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while not stop.is_set():
            started = time.perf_counter()
            await http.get("/healthz")
            worst[0] = max(worst[0], time.perf_counter() - started)
            await asyncio.sleep(0.1)


async def _one_doc_latency(http: httpx.AsyncClient, text: str) -> float:
    started = time.perf_counter()
    resp = await http.post("/v1/classify", json={"documents": [{"id": f"probe-{started}", "text": text}]},
                           timeout=REQUEST_TIMEOUT_S)
    resp.raise_for_status()
    return time.perf_counter() - started


async def _hostile(url: str, docs: list[dict], rate_docs_s: float, burst_s: float, per_request: int,
                   timeout_s: float, hangup_clients: int, hangup_docs: int, hangup_after_s: float) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    out: dict = {}
    stop, worst = asyncio.Event(), [0.0]
    health = asyncio.create_task(_probe_health(url, stop, worst))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S,
                                 limits=httpx.Limits(max_connections=1000)) as http:
        out["idle_one_doc_s"] = round(await _one_doc_latency(http, docs[0]["text"]), 3)
        # 1. over capacity: open loop, one request every per_request / rate seconds, each with a client timeout
        start_count = _classified((await http.get("/metrics")).text)
        statuses: list[str] = []

        async def one(batch: list[dict]) -> None:
            try:
                resp = await http.post("/v1/classify", json={"documents": batch}, timeout=timeout_s)
                statuses.append(str(resp.status_code))
            except httpx.TimeoutException:
                statuses.append("timeout")
            except httpx.HTTPError as err:
                statuses.append(type(err).__name__)

        tasks, i, began = [], 0, time.perf_counter()
        n_requests = int(burst_s * rate_docs_s / per_request)
        for k in range(n_requests):
            await asyncio.sleep(max(0.0, began + k * per_request / rate_docs_s - time.perf_counter()))
            batch = [{"id": f"o{k}-{j}", "text": docs[(i + j) % len(docs)]["text"]} for j in range(per_request)]
            i += per_request
            tasks.append(asyncio.create_task(one(batch)))
        await asyncio.gather(*tasks)
        out["overload_offered_docs_s"] = rate_docs_s
        out["overload_requests"] = n_requests
        out["overload_statuses"] = {s: statuses.count(s) for s in sorted(set(statuses))}
        out["overload_one_doc_right_after_s"] = round(await _one_doc_latency(http, docs[1]["text"]), 3)
        done, drain_s = await _drain(http)
        out["overload_docs_classified"] = int(done - start_count - 1)  # minus the probe
        out["overload_docs_answered_200"] = statuses.count("200") * per_request
        out["overload_drain_s"] = round(drain_s, 1)
        # 2. hang-ups: clients that give up after hangup_after_s and close their connections
        start_count = _classified((await http.get("/metrics")).text)

        async def leaver(c: int) -> None:
            batch = [{"id": f"h{c}-{j}", "text": docs[(c * hangup_docs + j) % len(docs)]["text"]} for j in range(hangup_docs)]
            async with httpx.AsyncClient(base_url=url, headers=headers) as own:
                try:
                    await own.post("/v1/classify", json={"documents": batch}, timeout=hangup_after_s)
                except httpx.HTTPError:
                    pass

        await asyncio.gather(*(leaver(c) for c in range(hangup_clients)))
        out["hangup_docs_sent"] = hangup_clients * hangup_docs
        out["hangup_one_doc_right_after_s"] = round(await _one_doc_latency(http, docs[2]["text"]), 3)
        done, drain_s = await _drain(http)
        out["hangup_docs_classified_anyway"] = int(done - start_count - 1)
        out["hangup_drain_s"] = round(drain_s, 1)
    stop.set()
    await health
    out["healthz_worst_s"] = round(worst[0], 3)
    return out


def run_hostile(server_root: Path = ROOT, max_in_flight: int | None = 64) -> dict:
    """The over-capacity and hang-up scenarios against one ``docpilot serve`` (BBC test articles).

    Over capacity: 40 docs/s offered for 10 s (4 per request, open loop), each request with a 10 s client
    timeout; the server does about 12 docs/s on a 2-core CPU. Hang-ups: 4 clients send 16 articles each
    and leave after 2 s. After each, a one-document request is timed and the server is watched until it
    stops classifying (documents it classified that nobody waited for; seconds until idle).

    Args:
        server_root: the checkout whose ``docpilot serve`` runs (``ROOT``, or a worktree of main).
        max_in_flight: ``--max-in-flight-documents`` for the server (``None``: do not pass it, as main lacks it).

    Returns:
        The figures (JSON-able).
    """
    from batch.corpus.tabular import iter_csv
    from bench.common import bbc_dir
    from classify.config.sections import PilotConfig, load_config

    config = ROOT / "config" / "docpilot.json"
    cfg = load_config(PilotConfig, config)
    rows = list(iter_csv(bbc_dir() / "test.csv", cfg.classify.max_doc_bytes, id_column=None, id_prefix="bbc-test"))
    docs = [{"id": d.id, "text": d.text} for d, _ in rows if d.text]
    extra = ("--max-in-flight-documents", str(max_in_flight)) if max_in_flight else ()
    with tempfile.TemporaryDirectory(prefix="serve-hostile-") as tmp:
        log_path = Path(tmp) / "server.log"
        proc, url = _start_server(config, log_path, Path(server_root), extra)
        try:
            figures = asyncio.run(_hostile(url, docs, rate_docs_s=40.0, burst_s=10.0, per_request=4, timeout_s=10.0,
                                           hangup_clients=4, hangup_docs=16, hangup_after_s=2.0))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"server_root": str(server_root), "max_in_flight_documents": max_in_flight, **figures}


if __name__ == "__main__":
    import argparse
    import json
    import logging

    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.serve_load")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hostile", action="store_true", help="the over-capacity and hang-up scenarios instead")
    parser.add_argument("--server-root", type=Path, default=ROOT)
    parser.add_argument("--max-in-flight", type=int, default=64, help="0: do not pass --max-in-flight-documents")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.hostile:
        figures = run_hostile(args.server_root, args.max_in_flight or None)
        print(json.dumps(figures, indent=2))
        if args.json_out:
            args.json_out.write_text(json.dumps(figures, indent=2) + "\n")
    else:
        out = run(quick=args.quick)
        print(json.dumps(out["figures"], indent=2))
        print(out["markdown"])
