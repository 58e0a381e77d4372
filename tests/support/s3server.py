"""A real S3 API (moto's standalone server on 127.0.0.1) for the lease tests, reached through s3fs.

moto keeps its buckets in process-wide memory, shared by every server started in one pytest process, so
this fixture uses a bucket of its own (:data:`BUCKET`) and creates it only when missing: it can run
before or after ``tests/unit/adapters/test_transfer.py``'s server, in any order.
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
