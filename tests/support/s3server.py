"""A real S3 API (moto's standalone server on 127.0.0.1) for the lease tests, reached through s3fs.

moto keeps its buckets in process-wide memory, shared by every server started in one pytest process, so
this fixture uses a bucket of its own (:data:`BUCKET`) and creates it only when missing: it can run
before or after ``tests/unit/adapters/registry/test_transfer.py``'s server, in any order.
"""

from __future__ import annotations

import contextlib
import os
import socket

import pytest

BUCKET = "docpilot-lease-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3(bucket: str):
    """Start moto's S3 server on a free port of 127.0.0.1, point ``AWS_ENDPOINT_URL`` (and test keys) at it, make sure
    ``bucket`` exists; yields the endpoint URL, then stops the server and restores the environment."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    try:
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        yield env["AWS_ENDPOINT_URL"]
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def lease_s3():
    """The S3 server with :data:`BUCKET`; yields the endpoint URL."""
    with moto_s3(BUCKET) as url:
        yield url


@contextlib.contextmanager
def stalled_s3(timeout_s: float = 1.0, attempts: int = 2):
    """An "S3 endpoint" on 127.0.0.1 that accepts every connection and never answers a byte (a store that stalled).

    Points ``AWS_ENDPOINT_URL`` (and test keys) at it and sets docpilot's store limits short
    (``DOCPILOT_STORE_TIMEOUT_S``, ``DOCPILOT_STORE_ATTEMPTS``); yields ``(env, connections)``: the variables set
    (for a subprocess) and the list of accepted sockets (grows with each attempt). Everything is restored and
    closed on exit.
    """
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True, name="stalled-s3").start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{srv.getsockname()[1]}",
           "DOCPILOT_STORE_TIMEOUT_S": str(timeout_s), "DOCPILOT_STORE_ATTEMPTS": str(attempts)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env, held
    finally:
        srv.close()
        for conn in list(held):
            conn.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
