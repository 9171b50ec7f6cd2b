"""The hard constraints of one Pollux round (SPEC §5): checking one matrix and repairing a population.

An allocation is feasible when no node holds more GPUs than it has; at most one distributed job sits
on a node (interference avoidance, when on); a job that is not pinned has at most its replica cap
(the exploration cap, :func:`replica_cap`) on at most ``max_nodes`` nodes, and either no GPUs or at
least its minimum replicas; a pinned job keeps its current row. :meth:`Constraints.repair` enforces
them on a whole population in the SPEC §5 order, over jobs in priority order, so that "later jobs
lose" is a cumulative sum along the job axis; :meth:`Constraints.feasible` checks one matrix.
"""

from __future__ import annotations

import numpy as np

from pollux.goodput import exploration_cap
from pollux.policy.base import JobView
from pollux.policy.genetic import col_sums, row_sums
from pollux.policy.pollux.population import row_counts


def replica_cap(job: JobView) -> int:
    """Exploration cap; raised to min_replicas (when allowed) so a gang job is never starved."""
    if job.limits is not None:
        cap = exploration_cap(job.max_replicas_seen, job.limits, job.max_replicas)
    else:
        cap = min(max(2 * int(job.max_replicas_seen), 1), int(job.max_replicas))
    if 0 < job.min_replicas <= job.max_replicas:
        cap = max(cap, int(job.min_replicas))
    return int(cap)


class Constraints:
    """The limits of one round's jobs (in priority order) and nodes, and the checks over them.

    It reads the problem's arrays as given (``cur``: current ``(jobs, nodes)`` rows; ``pinned``,
    ``min_replicas``, ``max_replicas`` per job; ``cap`` per node) and keeps float32 copies for the
    vectorised population operators.
    """

    def __init__(
        self,
        *,
        cur: np.ndarray,
        pinned: np.ndarray,
        cap: np.ndarray,
        min_replicas: np.ndarray,
        max_replicas: np.ndarray,
        max_nodes: int,
        interference: bool,
    ) -> None:
        self.num_jobs, self.num_nodes = cur.shape
        self.cur = cur
        self.pinned = pinned
        self.cap = cap
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.max_nodes = max_nodes
        self.interference = interference
        # Pinned rows may exceed caps; they are never capped.
        rep_limit = np.where(pinned, np.iinfo(np.int32).max, max_replicas)
        # float32 copies for the vectorised population operators.
        self.cur32 = cur.astype(np.float32)
        self.cap32 = cap.astype(np.float32)
        self.min32 = min_replicas.astype(np.float32)
        self.rep_limit32 = rep_limit.astype(np.float32)
        #: How far the mutation may grow each row: pinned rows not at all.
        self.growth_limit32 = np.where(pinned, 0, max_replicas).astype(np.float32)
        self.pin_idx = np.flatnonzero(pinned)

    def owners(self, a: np.ndarray) -> np.ndarray:
        """Per node, the distributed job on it (-1 when none); the first one wins on a conflict."""
        owner = np.full(self.num_nodes, -1, dtype=np.int64)
        dist = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
        for j in dist[::-1]:
            owner[a[j] > 0] = j
        return owner

    def feasible(self, matrix: np.ndarray) -> bool:
        """Whether one matrix meets every hard constraint (capacity, interference, caps, minimum
        replicas, node count, pinned rows)."""
        a = np.asarray(matrix)
        if a.shape != (self.num_jobs, self.num_nodes) or (a < 0).any():
            return False
        if (a.sum(axis=0) > self.cap).any():
            return False
        r, n = a.sum(axis=1), np.count_nonzero(a, axis=1)
        if not np.array_equal(a[self.pinned], self.cur[self.pinned]):
            return False
        free = ~self.pinned
        if (r[free] > self.max_replicas[free]).any() or (n[free] > self.max_nodes).any():
            return False
        if ((r[free] > 0) & (r[free] < self.min_replicas[free])).any():
            return False
        if self.interference:
            dist = n > 1
            clash = (a[dist] > 0).sum(axis=0) > 1                 # nodes with 2+ distributed jobs
            movable_dist = dist & ~self.pinned
            if clash.any() and (a[movable_dist][:, clash] > 0).any():
                return False
        return True

    def repair(self, pop: np.ndarray) -> np.ndarray:
        """Feasible copy of a population ``(jobs, population, nodes)``, by the SPEC §5 repair order.

        Written with in-place operations: large temporaries cost more than the arithmetic here.
        """
        pop = np.array(pop, dtype=np.float32)
        if self.num_jobs == 0 or self.num_nodes == 0:
            return pop
        np.maximum(pop, 0.0, out=pop)
        nj, q, nn = pop.shape
        pin = self.pin_idx
        if pin.size:
            pop[pin] = self.cur32[pin][:, None, :]
        # At most one distributed job per node: later (lower-priority) jobs lose their replicas there.
        # Only the (individual, node) columns holding two or more distributed jobs are touched.
        if self.interference and nn > 1:
            nz = pop > 0
            dist = row_counts(nz) > 1.5
            if np.count_nonzero(dist.any(axis=1)) > 1:
                np.logical_and(nz, dist[..., None], out=nz)
                m = nz.reshape(nj, -1)
                cols = np.flatnonzero(col_sums(nz.astype(np.float32)).reshape(-1) > 1.5)
                if cols.size:
                    sub = m[:, cols]
                    earlier = np.cumsum(sub, axis=0, dtype=np.int32) > sub   # an earlier one sits there
                    kill = sub & earlier
                    kill[self.pin_idx] = False
                    flat = pop.reshape(nj, -1)
                    flat[:, cols] = flat[:, cols] * ~kill
        # Each job at most its max replicas (exploration cap included): keep the first GPUs in node order.
        r = row_sums(pop)
        rows_i = np.flatnonzero(r > self.rep_limit32[:, None])
        if rows_i.size:
            flat = pop.reshape(-1, nn)
            rows = flat[rows_i]
            lim = self.rep_limit32[rows_i // q][:, None]
            flat[rows_i] = np.minimum(rows, np.maximum(lim - (np.cumsum(rows, axis=1) - rows), 0.0))
        # Each job on at most max_nodes nodes.
        if nn > self.max_nodes:
            cnt = row_counts(pop > 0)
            rows_i = np.flatnonzero((cnt > self.max_nodes) & ~self.pinned[:, None])
            if rows_i.size:
                flat = pop.reshape(-1, nn)
                rows = flat[rows_i]
                rows[np.cumsum(rows > 0, axis=1) > self.max_nodes] = 0.0
                flat[rows_i] = rows
        # Node capacity by cumulative sum over jobs in priority order.
        # Only the (individual, node) columns over capacity are touched.
        cols = np.flatnonzero((col_sums(pop) > self.cap32).reshape(-1))
        if cols.size:
            flat = pop.reshape(nj, -1)
            sub = flat[:, cols]
            before: np.ndarray = np.cumsum(sub, axis=0) - sub
            cap = self.cap32[cols % nn]
            flat[:, cols] = np.minimum(sub, np.maximum(cap - before, 0.0))
        # Jobs below their min replicas get nothing.
        low = (row_sums(pop) < self.min32[:, None]) & ~self.pinned[:, None]
        if low.any():
            np.multiply(pop, ~low[..., None], out=pop)
        return pop
