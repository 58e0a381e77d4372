"""Export and import of adapters and run folders: local folders, archives and a real S3 API.

The S3 store is moto's standalone server, started by the test on 127.0.0.1 and reached through
the real s3fs client (``AWS_ENDPOINT_URL``, as a user reaches MinIO or R2). No network beyond it.

Split by tier: this file holds the process tests; the others of the same subject are in ``tests/unit/adapters/registry/test_transfer.py``, ``tests/ray/test_transfer_pilot.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from adapters.registry.registry import Registry
from adapters.registry.transfer import export_adapter, import_adapter
from classify.errors import AdapterIntegrityError
from classify.runs.export import SHA256SUMS
from tests.support.corpora import ROOT
from tests.support.transfer import BUCKET, FP, publish, s3_fs
from tests.support.transfer import s3 as s3  # noqa: F401  (fixture)


def test_interrupted_adapter_upload_is_not_importable_and_a_rerun_completes_it(s3, tmp_path):
    train = Registry(tmp_path / "t")
    # big.bin sorts after the peft files and is large enough (multipart upload) to be caught mid-upload
    ref = publish(train, tmp_path, extra={"zz-big.bin": os.urandom(120 * 1024 * 1024)})
    url = f"s3://{BUCKET}/adapters/interrupted"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "docpilot", "adapters", "--registry", str(train.root), "export", ref, url],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    fs = s3_fs()
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if fs.exists(f"{BUCKET}/adapters/interrupted/adapter_config.json"):
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"export finished before it could be interrupted: {proc.stdout.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    fs.invalidate_cache()
    left = fs.find(f"{BUCKET}/adapters/interrupted")
    assert left and not any(p.endswith(SHA256SUMS) for p in left)

    with pytest.raises(AdapterIntegrityError, match=r"SHA256SUMS is missing, so the export is incomplete"):
        import_adapter(url, Registry(tmp_path / "fresh"))
    assert Registry(tmp_path / "fresh").names() == []

    out = export_adapter(train, ref, url)  # the rerun clears the partial upload and completes it
    assert out["written"]
    adapter, created = import_adapter(url, Registry(tmp_path / "fresh"), base_fingerprint=FP)
    assert created and adapter.sha256 == train.show(ref).sha256
