"""Which executor to evict, and which to load ahead: the out-of-core policies (thesis §4.8).

A worker under a memory budget (`RuntimeConfig.memory_budget_bytes`) keeps only some of its
executors in memory; the others wait on local disk (`pollux.litz.spill`) and are loaded back before
their next task (`pollux.litz.executor_memory` does the I/O). This module only decides: it sees a
`MemoryView` (the budget, every executor's footprint, which are resident and in what order they were
used, and the executors of the tasks the worker has been sent but not started) and answers with
executor ids. Kept free of I/O and of the worker so that the choices can be tested on their own.

`LitzPolicy` is the thesis's: evict an executor with no dispatched-but-unstarted task first, and
among those the one used most recently — an iterative job visits its executors in the same order
every iteration, so the one that ran last is the one needed last; then, among executors with queued
tasks, the one whose next task is furthest away. It also loads ahead (*prefetch*): the first
executor in the queue that is not resident, when room can be made for it without evicting anything
needed sooner. And it re-orders a batch (thesis: "re-order the execution of tasks to avoid memory
thrashing"): the tasks of executors already resident run first, each executor's own tasks staying
in order. Tasks of different executors in one batch are independent (§4.3), so any such order is
legal; on an iterative job it cuts the loads per iteration from E − B + 2 to E − B (E executors,
room for B).

`LruPolicy` is the baseline a system without the job's structure would use (as an OS pages memory):
evict the least recently used executor, load on demand only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["POLICIES", "EvictionPolicy", "LitzPolicy", "LruPolicy", "MemoryView", "make_policy"]


@dataclass(frozen=True)
class MemoryView:
    """What a policy sees of one worker's memory.

    `budget`: bytes the worker's executors may take (math.inf: no limit); `used`: bytes accounted
    now (resident executors and any being loaded); `footprint`: every hosted executor's bytes (its
    serialised state and input); `resident`: the executors in memory, least recently used first;
    `queue`: the executor of every task sent to the worker and not started, in the order they will
    run (repeats allowed); `pinned`: executors that must stay (running a task, or being loaded).
    """

    budget: float
    used: int
    footprint: Mapping[int, int]
    resident: Sequence[int]
    queue: Sequence[int]
    pinned: frozenset[int] = field(default_factory=frozenset)

    def next_use(self) -> dict[int, int]:
        """Executor → position of its next task in `queue` (absent: no task queued)."""
        out: dict[int, int] = {}
        for pos, e in enumerate(self.queue):
            out.setdefault(e, pos)
        return out


class EvictionPolicy(Protocol):
    """The interface both policies share (`LitzRuntime` picks one by name, `make_policy`)."""

    name: str

    def victims(self, view: MemoryView, need: int) -> list[int]:
        """Executors to evict, in order, so that `need` more bytes fit in the budget; all the
        evictable ones when even that is not enough."""
        ...

    def prefetch(self, view: MemoryView) -> tuple[int, list[int]] | None:
        """(executor to load ahead, executors to evict first), or None: nothing to load ahead."""
        ...

    def run_order(self, executors: Sequence[int], resident: Collection[int]) -> list[int]:
        """The order to run a batch's tasks in (indices into `executors`, the executor of each
        task in dispatch order); must keep each executor's own tasks in dispatch order."""
        ...


def _take_until_fits(view: MemoryView, ranked: Sequence[int], need: int) -> list[int] | None:
    """The shortest prefix of `ranked` whose eviction makes `need` bytes fit; None if none does."""
    free = view.budget - view.used
    chosen: list[int] = []
    for e in ranked:
        if free >= need:
            break
        chosen.append(e)
        free += view.footprint.get(e, 0)
    return chosen if free >= need else None


class LitzPolicy:
    """The thesis's choice of victim, plus prefetch along the worker's queue (module docstring)."""

    name = "litz"

    def _ranked(self, view: MemoryView, later_than: float = -1.0) -> list[int]:
        """Evictable executors in the order to evict them, only those whose next task comes after
        position `later_than` in the queue."""
        nxt = view.next_use()
        recency = {e: i for i, e in enumerate(view.resident)}
        idle = [e for e in view.resident if e not in view.pinned and e not in nxt]
        idle.sort(key=lambda e: -recency[e])  # most recently used first
        queued = [e for e in view.resident if e not in view.pinned and nxt.get(e, math.inf) > later_than]
        queued = [e for e in queued if e in nxt]
        queued.sort(key=lambda e: -nxt[e])  # furthest next task first
        return idle + queued

    def victims(self, view: MemoryView, need: int) -> list[int]:
        ranked = self._ranked(view)
        chosen = _take_until_fits(view, ranked, need)
        return ranked if chosen is None else chosen

    def prefetch(self, view: MemoryView) -> tuple[int, list[int]] | None:
        resident = set(view.resident) | view.pinned
        for pos, e in enumerate(view.queue):
            if e in resident:
                continue
            # evict only what is needed after `e` (or not at all): loading `e` early must not
            # cost a reload sooner than `e` itself is needed
            chosen = _take_until_fits(view, self._ranked(view, later_than=pos), view.footprint.get(e, 0))
            return None if chosen is None else (e, chosen)
        return None

    def run_order(self, executors: Sequence[int], resident: Collection[int]) -> list[int]:
        # a stable sort on "resident?": an executor's tasks share the key, so they keep their order
        return sorted(range(len(executors)), key=lambda i: executors[i] not in resident)


class LruPolicy:
    """The baseline: least recently used executor first, no prefetch."""

    name = "lru"

    def victims(self, view: MemoryView, need: int) -> list[int]:
        ranked = [e for e in view.resident if e not in view.pinned]
        chosen = _take_until_fits(view, ranked, need)
        return ranked if chosen is None else chosen

    def prefetch(self, view: MemoryView) -> tuple[int, list[int]] | None:
        return None

    def run_order(self, executors: Sequence[int], resident: Collection[int]) -> list[int]:
        return list(range(len(executors)))  # as dispatched


POLICIES: dict[str, type[LitzPolicy] | type[LruPolicy]] = {"litz": LitzPolicy, "lru": LruPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """The policy called `name` ("litz" or "lru")."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"RuntimeConfig.out_of_core_policy: unknown policy {name!r} (known: {sorted(POLICIES)})"
        ) from None
