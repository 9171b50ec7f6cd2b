"""Rounds first: the web view and ``/metrics`` wait while a scheduling round runs.

The view, the scrape and the round share the service's process and so one Python interpreter lock:
a page rendered during a round takes its time out of the round's. Measured with
``benchmarks/views_load.py`` (1,000 jobs, 64 × 4 GPUs), a round took 1.7 times as long while one
client read the jobs page and ``/metrics`` without pause. A round decides where every job runs; a
page only shows what was decided. So the read-only views wait for the round under way to end, then
show what it wrote; the round never waits for them. A reader waits only for the rounds under way
when it came, not for the ones that start later, so rounds that follow each other closely cannot
starve it; and the wait is bounded (``max_wait_s``): a round that hangs must not also blank the
view. Nothing else waits: hints, submissions, cancellations and the CLI's calls go through as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["RoundGate"]


class RoundGate:
    """Marks the rounds under way (:meth:`round`) and lets readers wait for none (:meth:`wait_quiet`)."""

    def __init__(self, max_wait_s: float = 30.0) -> None:
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s: must be >= 0, got {max_wait_s!r}")
        self.max_wait_s = float(max_wait_s)
        self._under_way: set[int] = set()   # the numbers of the rounds not yet ended
        self._started = 0
        self._changed = threading.Condition()

    @property
    def busy(self) -> bool:
        """Whether a round is under way."""
        with self._changed:
            return bool(self._under_way)

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """The body runs as a round: readers that come meanwhile wait until it ends."""
        with self._changed:
            self._started += 1
            number = self._started
            self._under_way.add(number)
        try:
            yield
        finally:
            with self._changed:
                self._under_way.discard(number)
                self._changed.notify_all()

    def wait_quiet(self) -> bool:
        """Block until every round under way now has ended (rounds that start meanwhile are not
        waited for); False where ``max_wait_s`` passed first (the caller goes on anyway)."""
        with self._changed:
            waited_for = set(self._under_way)
            return self._changed.wait_for(lambda: not waited_for & self._under_way, timeout=self.max_wait_s)
