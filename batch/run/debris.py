"""Private: what a killed attempt of a batch leaves behind, removed by the next attempt (which holds the driver lock).

A ``SIGKILL`` (or a lost machine) during the merge or the export leaves temporary files: the merge's
``.results.jsonl.<random>.tmp`` and ``.results.parquet.tmp``, an atomic write's ``.<name>.<random>.tmp`` in
the run folder or ``shards/``, and the export's staging folder ``.<batch id>-<random>.export-tmp`` beside the
export (:func:`classify.runs.export.export_run`). None of them is ever complete or read; the next attempt of the
same batch id holds ``.driver.lock``, so nothing else can be writing them, and removes them before it starts.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from classify.runs.export import EXPORT_STAGING_SUFFIX

log = logging.getLogger("docpilot.batch")

_TMP_FILE = re.compile(r"^\..+\.tmp$")


def stale_temporaries(run_dir: Path, export_dest: object) -> list[Path]:
    """The temporary files and folders an earlier, killed attempt of this batch left.

    Args:
        run_dir: the run folder (its top level and ``shards/`` are searched; nothing else is ever temporary there).
        export_dest: the batch's export destination; for a local folder, its staging siblings are searched.
            A partial export's staging (``.<batch id>-partial-...``) is never matched.

    Returns:
        The paths, sorted.
    """
    found = [p for folder in (run_dir, run_dir / "shards") if folder.is_dir()
             for p in folder.iterdir() if _TMP_FILE.match(p.name) and p.is_file()]
    if isinstance(export_dest, Path) and export_dest.parent.is_dir():
        staging = re.compile(rf"^\.{re.escape(export_dest.name)}-[a-z0-9_]{{8}}{re.escape(EXPORT_STAGING_SUFFIX)}$")
        found += [p for p in export_dest.parent.iterdir() if staging.match(p.name) and p.is_dir()]
    return sorted(found)


def remove_stale_temporaries(run_dir: Path, export_dest: object) -> list[Path]:
    """Remove :func:`stale_temporaries` (the caller holds the batch's driver lock); log each one.

    Returns:
        The paths removed.
    """
    removed = []
    for path in stale_temporaries(run_dir, export_dest):
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as err:
            log.warning("could not remove %s, left by an earlier attempt: %s", path, err)
            continue
        removed.append(path)
    if removed:
        log.info("removed %d temporary files an earlier, killed attempt left: %s", len(removed),
                 ", ".join(str(p) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""))
    return removed
