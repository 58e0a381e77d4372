"""A full disk in a batch (issue 28, item 4): exit 6 naming the folder and its free space, the failure recorded
where space allows (said plainly where not), and a rerun after freeing space finishes exactly once.

Unit cases raise "no space left" the ways Python and pyarrow word it. The real cases run the real batch driver over
real Ray (the instant stand-in engine: the failure lives in the driver's writes) with the run folder, or the export
folder, on a small tmpfs that is filled to the last page at the phase under test: writing shards, merging, exporting.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_full_disk_ray.py``.
"""

from __future__ import annotations

import errno

import pytest

from classify.errors import EnvironmentCheckError, VerificationError
from classify.runs.disk import disk_full, full_disk_error, full_disk_is_environment

FULL_ERRORS = [
    OSError(errno.ENOSPC, "No space left on device", "/x/shards/00001.jsonl"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow's words
]


@pytest.mark.parametrize("err", FULL_ERRORS, ids=["enospc", "edquot", "pyarrow"])
def test_full_disk_errors_anywhere_in_the_chain_become_exit_6_naming_the_folder(tmp_path, err):
    def chained():
        try:
            raise err
        except OSError as inner:
            raise VerificationError("merge failed") from inner

    for raiser in (lambda: (_ for _ in ()).throw(err), chained):
        with pytest.raises(EnvironmentCheckError) as caught:
            with full_disk_is_environment([tmp_path], "batch b1"):
                raiser()
        assert caught.value.exit_code == 6
        message = str(caught.value)
        assert f"batch b1: no space left in {tmp_path}" in message and "MiB free" in message
        assert "the attempt's failure is recorded" in message and "rerun the same command" in message


def test_other_errors_pass_through_and_unrecorded_failures_are_said(tmp_path):
    with pytest.raises(OSError, match="Permission denied"):
        with full_disk_is_environment([tmp_path], "batch b1"):
            raise OSError(errno.EACCES, "Permission denied")
    assert disk_full(ValueError("x")) is None
    err = full_disk_error(FULL_ERRORS[0], [tmp_path], "batch b1", unrecorded="writing /r: No space left on device")
    assert "could NOT be recorded (writing /r: No space left on device)" in str(err)
    assert "`docpilot status` will show it as interrupted" in str(err)

