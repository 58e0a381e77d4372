"""Bounded admission: at most ``max_in_flight_documents`` documents in the engine, all requests together.

Without a bound, every request is queued in the engine however many wait already: 80 docs/s offered
to a server that does 12 docs/s left clients timing out while all their documents were still
classified, and a new request waited 70 s behind them. :class:`Admission` admits a request only if
its documents fit under the limit and answers the rest at once with 429 and ``Retry-After`` (an
estimate from the documents finished in the last :data:`RATE_WINDOW_S` seconds). A request's
documents stay counted until the engine has finished or aborted them (:meth:`release`), not merely
until its handler returns.
"""

from __future__ import annotations

import math
import time
from collections import deque

from serve.errors import Overloaded

RATE_WINDOW_S = 30.0
"""Seconds of finished documents the throughput estimate behind ``Retry-After`` looks at."""

MAX_RETRY_AFTER_S = 60
"""Largest ``Retry-After`` given (seconds)."""


class Admission:
    """Count documents in flight; refuse what does not fit.

    Args:
        limit: most documents admitted at once (``max_in_flight_documents``).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, limit: int, clock=time.monotonic):
        self.limit = limit
        self.in_flight = 0
        self._clock = clock
        self._finished: deque[tuple[float, int]] = deque()

    @property
    def full(self) -> bool:
        """Whether not even one more document fits."""
        return self.in_flight >= self.limit

    def docs_per_s(self) -> float:
        """Documents finished per second over the last :data:`RATE_WINDOW_S` seconds (0.0 with no data)."""
        now = self._clock()
        while self._finished and self._finished[0][0] < now - RATE_WINDOW_S:
            self._finished.popleft()
        if not self._finished:
            return 0.0
        span = max(now - self._finished[0][0], 1.0)
        return sum(n for _, n in self._finished) / span

    def retry_after_s(self, n: int) -> int:
        """Whole seconds until ``n`` more documents should fit, at the recent rate (1 to :data:`MAX_RETRY_AFTER_S`)."""
        excess = self.in_flight + n - self.limit
        rate = self.docs_per_s()
        if excess <= 0 or rate <= 0:
            return 1
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(excess / rate)))

    def refusal(self, n: int) -> Overloaded:
        """The 429 for a request of ``n`` documents that does not fit now."""
        wait = self.retry_after_s(n)
        return Overloaded(
            f"server busy: {self.in_flight} documents in flight, a request of {n} would go over the limit of "
            f"{self.limit} (`max_in_flight_documents`); retry after {wait} s (Retry-After) or send fewer documents",
            wait,
        )

    def check(self, n: int = 1) -> None:
        """Refuse early, before the body is read, when not even ``n`` documents fit.

        Raises:
            Overloaded: (429) the engine is full.
        """
        if self.in_flight + n > self.limit:
            raise self.refusal(n)

    def admit(self, n: int) -> None:
        """Count ``n`` documents in flight, or refuse them.

        Raises:
            Overloaded: (429, with ``retry_after_s``) they do not fit under the limit now.
        """
        self.check(n)
        self.in_flight += n

    def release(self, n: int, finished: bool = True) -> None:
        """The engine finished (or aborted) ``n`` admitted documents.

        Args:
            n: documents to stop counting.
            finished: count them in the throughput estimate (``False`` for aborted ones).
        """
        self.in_flight = max(0, self.in_flight - n)
        if finished and n:
            self._finished.append((self._clock(), n))
