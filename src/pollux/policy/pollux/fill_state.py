"""The free GPUs and distributed-job owners of the nodes while the greedy fills one matrix
(:mod:`.fill`), with the node orders its placement rule reads.

A fill at 4,096 GPUs places about 4,000 GPUs one jump at a time, and after each jump the greedy
weighs the next job against the new free GPUs. Rebuilding the node orders after every jump (a sort
of 1,024 nodes, and Python copies of the free GPUs and owners) was about a sixth of such a fill; a
jump changes a few nodes, so :meth:`FillState.update` moves just those in orders kept sorted
(``bisect``), and in the Python lists the greedy reads entry by entry. The orders are built on first
use: a fill of a few GPUs on a small cluster seldom needs them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def row_lists(row: np.ndarray) -> tuple[list[int], list[int]]:
    """The nodes of one row with GPUs, and its GPUs on each, as Python lists."""
    nodes = np.flatnonzero(row)
    return nodes.tolist(), row[nodes].tolist()


class FillState:
    """Free GPUs and distributed-job owners of the nodes while the greedy fills one matrix, with
    the node orders its placement rule needs (built when first asked for, then kept up to date by
    :meth:`update`)."""

    def __init__(self, free: np.ndarray, owner: np.ndarray, interference: bool, loose: bool = False) -> None:
        self.free = free.astype(np.int64)
        self.loose = loose
        self.owner = owner
        self.interference = interference
        self.total_free = int(self.free.sum())
        self.version = 0
        self._cache: dict[str, Any] = {}
        # Per job, its nodes and its GPUs on each as Python lists, kept until update() changes its row.
        self._rows: dict[int, tuple[list[int], list[int]]] = {}
        # Python copies of the free GPUs and the owners per node, read entry by entry by the greedy.
        self._free_list: list[int] = self.free.tolist()
        self._owner_list: list[int] = owner.tolist()
        # (-free, node) of the nodes a job may spread onto, and (free, node) of every node: sorted.
        self._spread: list[tuple[int, int]] | None = None
        self._ascending: list[tuple[int, int]] | None = None

    def update(self, j: int, old: np.ndarray, new: np.ndarray,
               new_lists: tuple[list[int], list[int]] | None = None) -> None:
        """Job j's row goes from ``old`` to ``new`` (``new_lists``: :func:`row_lists` of ``new``)."""
        old_nodes, old_counts = self.row_lists(j, old)
        nodes, counts = new_lists if new_lists is not None else row_lists(new)
        # Only the nodes the job held or now holds change their free GPUs or their owner.
        touched = set(old_nodes)
        touched.update(nodes)
        self._unsort(touched)
        self.free += old - new
        self.total_free += sum(old_counts) - sum(counts)
        if self.interference:
            # Only nodes the job held can name it their owner.
            owner = self.owner
            for n in old_nodes:
                if owner[n] == j:
                    owner[n] = -1
            if len(nodes) > 1:
                owner[nodes] = j
        free_list, owner_list = self._free_list, self._owner_list
        for n in touched:
            free_list[n] = int(self.free[n])
            owner_list[n] = int(self.owner[n])
        self._resort(touched)
        self._rows[j] = (nodes, counts)
        self.version += 1
        self._cache.clear()

    def _spreadable(self, n: int) -> bool:
        """Whether node n offers GPUs to a spreading job: free GPUs, and no distributed job when
        distributed jobs may not share a node."""
        return self._free_list[n] > 0 and (not self.interference or self._owner_list[n] < 0)

    def _unsort(self, nodes: Iterable[int]) -> None:
        """Take ``nodes`` out of the kept orders (before their free GPUs or owners change)."""
        free = self._free_list
        if self._spread is not None:
            for n in nodes:
                if self._spreadable(n):
                    del self._spread[bisect.bisect_left(self._spread, (-free[n], n))]
        if self._ascending is not None:
            for n in nodes:
                del self._ascending[bisect.bisect_left(self._ascending, (free[n], n))]

    def _resort(self, nodes: Iterable[int]) -> None:
        """Put ``nodes`` back into the kept orders (after their change)."""
        free = self._free_list
        if self._spread is not None:
            for n in nodes:
                if self._spreadable(n):
                    bisect.insort(self._spread, (-free[n], n))
        if self._ascending is not None:
            for n in nodes:
                bisect.insort(self._ascending, (free[n], n))

    def row_lists(self, j: int, row: np.ndarray) -> tuple[list[int], list[int]]:
        """Job j's nodes and its GPUs on each as Python lists, given its current ``row``: the greedy
        reads them for every option it weighs, on rows of a few nodes, where numpy's per-call cost
        dominates. Built once per job and fill (and by :meth:`update` when the row changes)."""
        got = self._rows.get(j)
        if got is None:
            got = self._rows[j] = row_lists(row)
        return got

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, kept under ``key`` until the next :meth:`update` (for answers that depend
        only on the free GPUs and owners, shared by every job that asks)."""
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = make()
        return got

    @property
    def max_free(self) -> int:
        got = self._cache.get("max")
        if got is None:
            got = self._cache["max"] = int(self.free.max()) if self.free.size else 0
        return got

    def _by_free_desc(self) -> np.ndarray:
        got = self._cache.get("desc")
        if got is None:
            got = self._cache["desc"] = np.argsort(-self.free, kind="stable")
        return got

    def free_list(self) -> list[int]:
        """The free GPUs per node as a Python list (read only): :func:`.fill.best_option` reads a few
        entries each call, where indexing a list is much cheaper than numpy."""
        return self._free_list

    def owner_list(self) -> list[int]:
        """The distributed-job owner per node (-1: none) as a Python list (read only; see
        :meth:`free_list`)."""
        return self._owner_list

    def spread_prefix(self, count: int) -> list[int]:
        """The first ``count`` nodes with free GPUs and no distributed job (where distributed jobs
        may not share a node), most free first, ties by node index."""
        if self._spread is None:
            self._spread = sorted((-f, n) for n, f in enumerate(self._free_list) if self._spreadable(n))
        return [n for _, n in self._spread[:count]]

    def single_node(self, total: int, mine: np.ndarray, row: np.ndarray, loose: bool = False) -> int:
        """The node to hold all ``total`` GPUs of this job (-1 if none): the one that fits most
        tightly, or with ``loose`` the one with the most room. Its own nodes offer their free GPUs
        plus the job's, the others their free GPUs; ties prefer its own nodes, then the lower index."""
        sign = -1 if loose else 1
        best, key = -1, None
        if mine.size:
            host = self.free[mine] + row[mine]
            ok = np.flatnonzero(host >= total)
            if ok.size:
                i = ok[np.argmin(sign * host[ok])]
                best, key = int(mine[i]), (sign * int(host[i]), 0, int(mine[i]))
        if loose:
            for n in self._by_free_desc():          # most free first, ties by node index
                if self.free[n] < total:
                    break
                if row[n] == 0:
                    cand = (-int(self.free[n]), 1, int(n))
                    if key is None or cand < key:
                        best, key = int(n), cand
                    break
            return best
        if self._ascending is None:
            self._ascending = sorted((f, n) for n, f in enumerate(self._free_list))
        ascending = self._ascending
        # The nodes by free GPUs, fewest first (ties by node index), from the first that holds total.
        for i in range(bisect.bisect_left(ascending, (total, -1)), len(ascending)):
            free, n = ascending[i]
            if row[n] == 0:
                cand = (free, 1, n)
                if key is None or cand < key:
                    best, key = n, cand
                break
        return best
