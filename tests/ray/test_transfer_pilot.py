"""Export and import of adapters and run folders: local folders, archives and a real S3 API.

The S3 store is moto's standalone server, started by the test on 127.0.0.1 and reached through
the real s3fs client (``AWS_ENDPOINT_URL``, as a user reaches MinIO or R2). No network beyond it.

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/adapters/registry/test_transfer.py``, ``tests/process/test_transfer_interrupted.py``.
"""

from __future__ import annotations

import json

from classify.runs.export import SHA256SUMS, verify_export
from tests.support.corpora import ROOT
from tests.support.transfer import BUCKET, flip_object, s3_fs
from tests.support.transfer import s3 as s3  # noqa: F401  (fixture)


def test_pilot_exports_to_s3_rechecks_it_and_records_its_lease(s3, pilot_config, tmp_path, monkeypatch):
    """The pilot's batch export to an object store (real local Ray, a stand-in engine actor: the export is under test)."""
    from batch.pilot.run import run_pilot
    from tests.support.stand_in_actors import answer_actor

    for var in ("DOCPILOT_HOME", "DOCPILOT_RUNS"):  # a stand-in's verdict must not touch the real model's gate
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    outcome = run_pilot(pilot_config, ROOT / "data" / "pilot", _engine_actor=answer_actor(),
                        export_root=f"s3://{BUCKET}/pilots", lease_ends_at="2026-12-03T18:00:00+00:00")
    assert outcome.stage == "verify" and outcome.summary["first_error"] is None
    assert outcome.export_dir == f"s3://{BUCKET}/pilots/{outcome.run_id}"
    params = json.loads((outcome.run_dir / "params.json").read_text())
    assert params["lease_ends_at"] == "2026-12-03T18:00:00+00:00"
    assert s3_fs().exists(f"{BUCKET}/pilots/{outcome.run_id}/{SHA256SUMS}")
    flip_object(f"{BUCKET}/pilots/{outcome.run_id}/results.jsonl", offset=10)
    problems = verify_export(outcome.export_dir)
    assert len(problems) == 1 and problems[0].startswith("results.jsonl: sha256")
