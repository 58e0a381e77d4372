"""Checkpoints on a full disk and truncated checkpoints on resume (issue 12, item 8).

The full disk is real where the sandbox allows it: a 1 MiB tmpfs mounted for the test (root only),
filled with a filler file so that exactly the intended checkpoint file runs out of space. Where
mounting is not permitted those tests skip, and the injected-error tests below still run: they make
the write functions raise the errors a full disk or an exceeded quota raises.

Split by tier: this file holds the process tests; the others of the same subject are in ``tests/unit/adapters/train/test_train_disk.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from classify.config.file import file_data

ROOT = Path(__file__).resolve().parents[2]


CLI_SCRIPT = """
import os, sys
from pathlib import Path
import adapters.train.loop as loop

real = loop.save_checkpoint
def fill_then_save(root, step, *args, **kwargs):
    if step == 2:  # the first checkpoint is on disk: now the disk fills up
        with open(Path(os.environ["DOCPILOT_RUNS"]) / "filler", "wb") as fh:
            try:
                while True:
                    fh.write(b"\\0" * 65536)
                    fh.flush()
            except OSError:
                pass
    return real(root, step, *args, **kwargs)
loop.save_checkpoint = fill_then_save
from docpilot.cli import main
sys.exit(main(["train", "--config", sys.argv[1], "--smoke", "--no-publish"]))
"""


def test_train_cli_exits_6_naming_the_folder_and_free_space_when_the_disk_fills(train_config_quick, tmp_path):
    disk = tmp_path / "runs"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
    try:
        config = tmp_path / "docpilot.json"
        config.write_text(json.dumps(file_data(train_config_quick)))
        env = {**os.environ, "DOCPILOT_RUNS": str(disk)}
        out = subprocess.run([sys.executable, "-c", CLI_SCRIPT, str(config)], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 6, out.stdout + out.stderr
        assert "Traceback" not in out.stderr and "Logging error" not in out.stderr, out.stderr
        run_dir = next(disk.glob("*-train-*"))
        error = [line for line in out.stderr.splitlines() if line.startswith("error [environment]:")]
        assert len(error) == 1, out.stderr
        assert f"in {run_dir / 'checkpoints'}:" in error[0] and " MiB free on that file system" in error[0]
        assert "newest: step-000001" in error[0] and f"--resume {run_dir}" in error[0]
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def train_config_quick():
    from classify.config.sections import load_config
    from classify.config.training import TrainConfig

    cfg = load_config(TrainConfig, ROOT / "config" / "docpilot.json")
    return cfg.model_copy(update={
        "training": cfg.training.model_copy(update={"threads": 1}),
        "checks": cfg.checks.model_copy(update={"validation_engine": "none"}),
        "smoke": cfg.smoke.model_copy(update={"max_steps": 3, "checkpoint_every_steps": 1, "train_rows": 4,
                                              "validation_rows": 2, "max_doc_tokens": 16}),
    })
