"""Load test of the HTTP server on loopback, compared with the offline batch path on the same documents.

1. Start ``docpilot serve`` (real uvicorn + vLLM async engine) on a free 127.0.0.1 port, warm it up.
2. ``clients`` concurrent httpx clients (asyncio) take BBC test articles from one shared queue,
   ``docs_per_request`` per request, until the queue is empty or ``duration_s`` has passed; every
   article is sent at most once, so vLLM's prefix cache cannot flatter the server.
3. Stop the server (SIGTERM), then time the offline ``Classifier.classify`` (one ``vllm.LLM``
   batch) on exactly the articles the server classified. Never two engines at once.

Run alone: ``python -m bench.serve_load [--quick]``.
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


def _start_server(config: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "docpilot", "serve", "--config", str(config), "--host", "127.0.0.1",
           "--port", str(port), "--skip-pilot-gate"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "DOCPILOT_API_TOKEN": TOKEN},
                                stdout=log, stderr=subprocess.STDOUT)
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
    from classify.config import PilotConfig, load_config
    from classify.engine import build_engine
    from classify.paths import bbc_dir
    from classify.tabular import iter_csv

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


if __name__ == "__main__":
    import json
    import logging

    logging.basicConfig(level=logging.WARNING)
    out = run(quick="--quick" in sys.argv[1:])
    print(json.dumps(out["figures"], indent=2))
    print(out["markdown"])
