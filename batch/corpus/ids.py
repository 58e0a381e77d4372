"""Duplicate-id machinery for :mod:`batch.corpus.plan`: 64-bit id hashes bucketed on disk (flat memory).

The plan then compares the candidate rows' real ids and folds each duplicated id into one rejected row
(:func:`batch.corpus.plan.fold_duplicates`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

N_BUCKETS = 64


class IdHashBuckets:
    """Find repeated ids among millions in flat memory: 64-bit id hashes bucketed on disk, each bucket sorted alone.

    ``add_many(ids, first_row)`` appends ``(h, row)`` per id, ``h`` the id's 64-bit Python string hash (SipHash, fixed within
    this process, all the buckets need: they live and die with this object), to one of :data:`N_BUCKETS` bucket files (buffered);
    :meth:`candidate_rows` loads one bucket at a time (16 bytes per row / 64), sorts it with numpy and
    returns the rows whose hash occurs more than once. Equal hashes with different ids are possible
    (rarely): callers compare the real ids of the candidates.

    Memory: the buffers (64 x about 4096 x 16 bytes = 4 MiB) and one bucket at a time; disk: 16 bytes per row.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="docpilot-ids-"))
        self.buffers: list[list[Any]] = [[] for _ in range(N_BUCKETS)]  # numpy (h, row) pair blocks not yet written
        self.buffered = [0] * N_BUCKETS
        self.files = [open(self.folder / f"{b:02d}.bin", "wb") for b in range(N_BUCKETS)]  # noqa: SIM115
        self.hashed = 0  # ids hashed into the buckets so far
        self.pending: list[str] = []  # ids given one by one to add(), rows pending_first, pending_first + 1, ...
        self.pending_first = 0

    def add(self, doc_id: str, row: int) -> None:
        """Record that row number ``row`` (any int below 2**64) has id ``doc_id`` (collected, then hashed
        with :meth:`add_many` a few thousand at a time)."""
        if self.pending and row != self.pending_first + len(self.pending):
            self._add_pending()
        if not self.pending:
            self.pending_first = row
        self.pending.append(doc_id)
        if len(self.pending) >= 8192:
            self._add_pending()

    @property
    def count(self) -> int:
        """Ids recorded so far."""
        return self.hashed + len(self.pending)

    def _add_pending(self) -> None:
        ids, self.pending = self.pending, []
        self.add_many(ids, self.pending_first)

    def add_many(self, ids: Collection[str], first_row: int) -> None:
        """Record ``ids`` as rows ``first_row``, ``first_row + 1``, ... (numpy over the whole list: call it per
        shard or per few thousand rows, not per row)."""
        import numpy as np

        if self.pending and ids is not self.pending:
            self._add_pending()
        n = len(ids)
        if not n:
            return
        pairs = np.empty((n, 2), dtype=np.uint64)
        pairs[:, 0] = np.fromiter((hash(i) for i in ids), dtype=np.int64, count=n).view(np.uint64)
        pairs[:, 1] = np.arange(first_row, first_row + n, dtype=np.uint64)
        bucket = (pairs[:, 0] & np.uint64(N_BUCKETS - 1)).astype(np.intp)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(N_BUCKETS + 1))
        for b in np.flatnonzero(bounds[1:] > bounds[:-1]):
            self.buffers[b].append(pairs[order[bounds[b]:bounds[b + 1]]])
            self.buffered[b] += int(bounds[b + 1] - bounds[b])
            if self.buffered[b] >= 4096:
                self._flush(int(b))
        self.hashed += n

    def _flush(self, b: int) -> None:
        import numpy as np

        if self.buffers[b]:
            np.concatenate(self.buffers[b]).tofile(self.files[b])
        self.buffers[b], self.buffered[b] = [], 0

    def candidate_rows(self) -> list[int]:
        """Rows whose id hash occurs more than once, ascending; closes and removes the bucket files."""
        import numpy as np

        out: list[int] = []
        try:
            self._add_pending()
            for b, fh in enumerate(self.files):
                self._flush(b)
                fh.close()
            for b in range(N_BUCKETS):
                pairs = np.fromfile(self.folder / f"{b:02d}.bin", dtype=np.uint64).reshape(-1, 2)
                if len(pairs) < 2:
                    continue
                order = np.argsort(pairs[:, 0], kind="stable")
                hashes = pairs[order, 0]
                same = hashes[1:] == hashes[:-1]
                if same.any():
                    mask = np.zeros(len(hashes), dtype=bool)
                    mask[1:] |= same
                    mask[:-1] |= same
                    out += pairs[order[mask], 1].tolist()
        finally:
            self.close()
        return sorted(int(r) for r in out)

    def close(self) -> None:
        """Remove the bucket files (idempotent)."""
        for fh in self.files:
            if not fh.closed:
                fh.close()
        shutil.rmtree(self.folder, ignore_errors=True)


