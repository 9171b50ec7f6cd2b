"""The Pollux search problem (SPEC §5): one round's jobs, speedup tables, re-allocation penalty,
evaluation, fitness, feasibility, repair, and the carried population's codec.

The searches are functions over a :class:`PolluxProblem` (:mod:`.fill`, :mod:`.local`, and the generic
:func:`pollux.policy.genetic.genetic_search`, whose :class:`~pollux.policy.genetic.GeneticProblem`
protocol this class satisfies). Matrices are ``(jobs, nodes)`` integer arrays in the problem's job
order :attr:`PolluxProblem.job_ids` and the cluster's node order; populations are float32
``(jobs, individuals, nodes)`` arrays of whole numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits, exploration_cap, fair_share, speedup_table
from pollux.policy import genetic
from pollux.policy.base import (
    Allocation,
    Cluster,
    JobView,
    PolicyState,
    decode_state,
    from_matrix,
    restart_factors,
)
from pollux.policy.genetic import col_sums, row_sums

#: Added to every speedup before the power mean (SPEC §5, ref), so a job without GPUs weighs heavily.
SPEEDUP_EPS = 1e-3
#: Version tag of the state this policy carries between rounds.
STATE_VERSION = 1


def _utility(s: np.ndarray, p: float) -> np.ndarray:
    """Per-job term whose sum is monotone in FITNESS_p: maximising Σ u(s_j) maximises the fitness."""
    x = np.asarray(s, dtype=np.float64) + SPEEDUP_EPS
    if p == 0.0:
        return np.log(x)
    if p < 0.0:
        return -(x**p)
    return x**p


def _power_mean(s: np.ndarray, p: float) -> np.ndarray:
    """FITNESS_p along the last axis (the job axis); p = 0 is the geometric mean."""
    x = s + SPEEDUP_EPS
    if p == 0.0:
        return np.exp(np.log(x).mean(axis=-1))
    if p == -1.0:
        return 1.0 / (1.0 / x).mean(axis=-1)
    return (x**p).mean(axis=-1) ** (1.0 / p)


class PolluxProblem:
    """One round's search problem: jobs in priority order, speedup tables, constraints, objective.

    Built by :meth:`pollux.policy.pollux.PolluxPolicy.problem`. :meth:`evaluate` is the objective of a
    population, :meth:`fitness` of one matrix; :meth:`repair` makes any population feasible.
    """

    def __init__(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        *,
        p: float,
        restart_penalty_s: float,
        max_nodes_per_job: int,
        interference_avoidance: bool,
        table_cache: OrderedDict | None = None,
        cache_size: int = 0,
    ) -> None:
        self.p = float(p)
        self.cluster = cluster
        self.interference = bool(interference_avoidance)
        self.max_nodes = max(int(max_nodes_per_job), 1)
        num_nodes = cluster.num_nodes
        node_idx = cluster.index()
        cap = cluster.capacity()
        self.cap = cap
        self.total_gpus = int(cap.sum())
        self.gpn = int(cap.max()) if num_nodes else 0

        # Current rows: JobView.allocation. Unknown nodes are dropped.
        raw_cur = np.zeros((len(jobs), num_nodes), dtype=np.int64)
        for i, job in enumerate(jobs):
            for node, gpus in job.allocation.items():
                if node in node_idx and gpus > 0:
                    raw_cur[i, node_idx[node]] += int(gpus)
        running = raw_cur.sum(axis=1) > 0
        pinned = np.array([not job.preemptible for job in jobs], dtype=bool) & running

        # Priority order: pinned, then least attained service, then submission time (then id).
        order = sorted(range(len(jobs)), key=lambda i: (not pinned[i], float(jobs[i].attained_service),
                                                        float(jobs[i].submit_time), jobs[i].id))
        self.order = np.asarray(order, dtype=np.int64)
        self.jobs = [jobs[i] for i in order]
        self.job_ids = [job.id for job in self.jobs]
        self.num_jobs = num_jobs = len(self.jobs)
        self.num_nodes = num_nodes
        self.cur = raw_cur[self.order] if num_jobs else raw_cur
        self.pinned = pinned[self.order] if num_jobs else pinned
        self.min_replicas = np.array([max(int(job.min_replicas), 0) for job in self.jobs], dtype=np.int64)

        # Fair share and the d·num_nodes factor (SPEC §4). A non-uniform cluster is treated as one pool
        # of its total GPUs: d = 1/total, fair = ceil(total/J) replicas on 1 node (the reference quirk).
        total = self.total_gpus
        if num_nodes and total > 0:
            if len(set(cluster.gpus)) == 1:
                self.fair = fair_share(num_nodes, int(cluster.gpus[0]), num_jobs)
            else:
                self.fair = fair_share(1, total, num_jobs)
            self.scale = num_nodes / total
        else:
            self.fair = (1, 1)
            self.scale = 0.0

        # Penalty factor of a job whose row changes.
        self.pen = restart_factors(self.jobs, restart_penalty_s)

        # Replica caps and tables.
        node_limit = min(self.max_nodes, num_nodes) * self.gpn
        self.max_replicas = np.zeros(num_jobs, dtype=np.int64)
        cur_r = self.cur.sum(axis=1)
        cur_n = (self.cur > 0).sum(axis=1)
        dims = []
        for j, job in enumerate(self.jobs):
            cap_j = self._cap(job)
            cap_j = max(min(cap_j, total, node_limit), 0)
            self.max_replicas[j] = cap_j
            rt = max(cap_j, int(cur_r[j])) if self.pinned[j] else cap_j
            nt = min(self.max_nodes, num_nodes, rt)
            if self.pinned[j]:
                nt = max(nt, int(cur_n[j]))
            dims.append((nt, rt))
        self.nt_max = max((d[0] for d in dims), default=0)
        self.rt_max = max((d[1] for d in dims), default=0)
        width = (self.nt_max + 1) * (self.rt_max + 1)
        flat = np.zeros((num_jobs, self.nt_max + 1, self.rt_max + 1))
        for j, (job, (nt, rt)) in enumerate(zip(self.jobs, dims, strict=True)):
            if rt <= 0 or nt <= 0 or self.scale == 0.0:
                continue
            flat[j, : nt + 1, : rt + 1] = self._table(job, nt, rt, table_cache, cache_size)
        self.table = flat
        # Best speedup at each replica count over any node count: bounds what a spread can reach.
        self.best_any_nodes = flat.max(axis=1)
        self.flat = flat.reshape(-1)
        self.base = np.arange(num_jobs, dtype=np.int64) * width
        # Pinned rows may exceed caps; they are never capped.
        self.rep_limit = np.where(self.pinned, np.iinfo(np.int32).max, self.max_replicas)
        self.movable = ~self.pinned & (self.max_replicas >= np.maximum(self.min_replicas, 1))
        # float32 copies for the vectorised population operators.
        self._cur32 = self.cur.astype(np.float32)
        self._cap32 = cap.astype(np.float32)
        self._min32 = self.min_replicas.astype(np.float32)
        self._rep_limit32 = self.rep_limit.astype(np.float32)
        self._rep_limit_grow = np.where(self.pinned, 0, self.max_replicas).astype(np.float32)
        self._pin_idx = np.flatnonzero(self.pinned)
        #: Per job, its table and best-over-nodes row as Python lists (the greedy's fast path).
        self.list_cache: dict[int, tuple[list[list[float]], list[float]]] = {}

    # ----------------------------------------------------------------------------------------
    # Construction helpers
    # ----------------------------------------------------------------------------------------

    def _cap(self, job: JobView) -> int:
        """Exploration cap; raised to min_replicas (when allowed) so a gang job is never starved."""
        if job.limits is not None:
            cap = exploration_cap(job.max_replicas_seen, job.limits, job.max_replicas)
        else:
            cap = min(max(2 * int(job.max_replicas_seen), 1), int(job.max_replicas))
        if 0 < job.min_replicas <= job.max_replicas:
            cap = max(cap, int(job.min_replicas))
        return int(cap)

    def _table(self, job: JobView, nt: int, rt: int, cache: OrderedDict | None,
               cache_size: int) -> np.ndarray:
        if job.model is None:
            r = np.arange(rt + 1, dtype=np.float64)
            n = np.arange(nt + 1)[:, None]
            tab = np.where((n >= 1) & (n <= r[None, :]), r[None, :] / self.fair[1], 0.0)
            return tab * self.scale
        limits = job.limits
        if limits is None:
            limits = BatchLimits(job.model.init_batch_size)
        key = (job.model, limits, self.fair, nt, rt)
        if cache is not None and cache_size > 0:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit * self.scale
        # The throughput model (SPEC §3) sees the node count only as "one node or more": entries for
        # 3+ nodes equal those for 2 wherever n ≤ r. Build the table up to 2 nodes and copy (several
        # times cheaper; tests check it against the full table).
        built = min(nt, 2)
        tab = speedup_table(job.model, limits, built, rt, self.fair, replica_cap=rt)
        if nt > built:
            r = np.arange(rt + 1)  # type: ignore[assignment]  # int grid; the float one above is another branch
            n = np.arange(built + 1, nt + 1)[:, None]
            tab = np.concatenate([tab, np.where(r[None, :] >= n, tab[built][None, :], 0.0)])
        if cache is not None and cache_size > 0:
            cache[key] = tab
            while len(cache) > cache_size:
                cache.popitem(last=False)
        return tab * self.scale

    # ----------------------------------------------------------------------------------------
    # Objective. Populations are float32 arrays (jobs, population, nodes) of whole numbers: this
    # layout makes every per-node and per-job reduction a small matrix product and every prefix sum
    # over jobs a loop of contiguous vector additions.
    # ----------------------------------------------------------------------------------------

    def _row_counts(self, mask: np.ndarray) -> np.ndarray:
        return row_sums(mask.astype(np.float32))

    def lookup(self, jobs: np.ndarray | int, nodes: np.ndarray | int,
               replicas: np.ndarray | int) -> np.ndarray:
        """SPEEDUP of ``jobs`` (indices, broadcast with the counts) on ``nodes`` nodes and ``replicas``
        GPUs: the one lookup into the speedup tables (counts beyond a table read its last entry)."""
        return self.flat[self.base[jobs] + np.minimum(nodes, self.nt_max) * (self.rt_max + 1)
                         + np.minimum(replicas, self.rt_max)]

    def _pop_speedups(self, pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unpenalised speedups ``(jobs, population)`` and whether each row differs from the current."""
        r = np.rint(row_sums(pop)).astype(np.int64)
        n = np.rint(self._row_counts(pop > 0)).astype(np.int64)
        s = self.lookup(np.arange(self.num_jobs)[:, None], n, r)
        return s, self._row_counts(pop != self._cur32[:, None, :]) > 0

    def job_speedups(self, pop: np.ndarray, penalised: bool = True) -> np.ndarray:
        """Per-job speedups ``(jobs, population)`` of a population ``(jobs, population, nodes)``."""
        s, changed = self._pop_speedups(pop)
        return np.where(changed, s * self.pen[:, None], s) if penalised else s

    def evaluate(self, pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(FITNESS_p, unpenalised FITNESS_p) per individual of ``(jobs, population, nodes)``.

        The unpenalised value only breaks ties (e.g. when every job is brand new and every
        allocation scores the same, the one that runs more work wins).
        """
        q = pop.shape[1]
        if self.num_jobs == 0:
            return np.ones(q), np.ones(q)
        s, changed = self._pop_speedups(pop)
        pen = np.where(changed, s * self.pen[:, None], s)
        return _power_mean(pen.T, self.p), _power_mean(s.T, self.p)

    def matrix_speedups(self, matrix: np.ndarray, penalised: bool = True) -> np.ndarray:
        """Per-job speedups of one ``(jobs, nodes)`` integer matrix."""
        a = np.asarray(matrix)
        s = self.lookup(np.arange(self.num_jobs), np.count_nonzero(a, axis=1), a.sum(axis=1))
        if penalised:
            changed = (a != self.cur).any(axis=1)
            s = np.where(changed, s * self.pen, s)
        return s

    def row_speedup(self, j: int, row: np.ndarray) -> float:
        """Penalised speedup of job ``j`` on one row."""
        s = float(self.lookup(j, int(np.count_nonzero(row)), int(row.sum())))
        return s * float(self.pen[j]) if not np.array_equal(row, self.cur[j]) else s

    def fitness(self, matrix: np.ndarray) -> float:
        """FITNESS_p of one ``(jobs, nodes)`` matrix."""
        if self.num_jobs == 0:
            return 1.0
        return float(_power_mean(self.matrix_speedups(matrix), self.p))

    def fitness_pair(self, matrix: np.ndarray) -> tuple[float, float]:
        """(FITNESS_p, unpenalised FITNESS_p) of one matrix: the order of the genetic selection."""
        if self.num_jobs == 0:
            return 1.0, 1.0
        return (float(_power_mean(self.matrix_speedups(matrix), self.p)),
                float(_power_mean(self.matrix_speedups(matrix, penalised=False), self.p)))

    def stack(self, matrices: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        """Population ``(jobs, len, nodes)`` float32 of ``(jobs, nodes)`` matrices."""
        arr = np.asarray(matrices, dtype=np.float32).reshape(-1, self.num_jobs, self.num_nodes)
        return np.ascontiguousarray(arr.transpose(1, 0, 2))

    def unstack(self, pop: np.ndarray, i: int) -> np.ndarray:
        """Individual ``i`` of a population as an int64 ``(jobs, nodes)`` matrix."""
        return np.rint(pop[:, i, :]).astype(np.int64)

    def to_allocation(self, matrix: np.ndarray) -> Allocation:
        """The allocation of one ``(jobs, nodes)`` matrix, keyed by job and node ids."""
        return from_matrix(np.asarray(matrix), self.job_ids, self.cluster)

    def owners(self, a: np.ndarray) -> np.ndarray:
        """Per node, the distributed job on it (-1 when none); the first one wins on a conflict."""
        owner = np.full(self.num_nodes, -1, dtype=np.int64)
        dist = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
        for j in dist[::-1]:
            owner[a[j] > 0] = j
        return owner

    # ----------------------------------------------------------------------------------------
    # The genetic search's protocol (pollux.policy.genetic.GeneticProblem)
    # ----------------------------------------------------------------------------------------

    def keys(self, pop: np.ndarray) -> np.ndarray:
        """One bytes key per individual, for exact duplicate detection."""
        return genetic.keys(pop, np.uint8 if self.gpn <= 255 else np.uint16)

    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SPEC §5 mutation (:func:`pollux.policy.genetic.mutate_allocation`); in place."""
        return genetic.mutate_allocation(pop, rng, self._cur32, self._cap32, self._rep_limit_grow)

    # ----------------------------------------------------------------------------------------
    # Repair (SPEC §5), vectorised over a population
    # ----------------------------------------------------------------------------------------

    def repair(self, pop: np.ndarray) -> np.ndarray:
        """Feasible copy of a population ``(jobs, population, nodes)``, by the SPEC §5 repair order.

        Written with in-place operations: large temporaries cost more than the arithmetic here.
        """
        pop = np.array(pop, dtype=np.float32)
        if self.num_jobs == 0 or self.num_nodes == 0:
            return pop
        np.maximum(pop, 0.0, out=pop)
        nj, q, nn = pop.shape
        pin = self._pin_idx
        if pin.size:
            pop[pin] = self._cur32[pin][:, None, :]
        # At most one distributed job per node: later (lower-priority) jobs lose their replicas there.
        # Only the (individual, node) columns holding two or more distributed jobs are touched.
        if self.interference and nn > 1:
            nz = pop > 0
            dist = self._row_counts(nz) > 1.5
            if np.count_nonzero(dist.any(axis=1)) > 1:
                np.logical_and(nz, dist[..., None], out=nz)
                m = nz.reshape(nj, -1)
                cols = np.flatnonzero(col_sums(nz.astype(np.float32)).reshape(-1) > 1.5)
                if cols.size:
                    sub = m[:, cols]
                    earlier = np.cumsum(sub, axis=0, dtype=np.int32) > sub   # an earlier one sits there
                    kill = sub & earlier
                    kill[self._pin_idx] = False
                    flat = pop.reshape(nj, -1)
                    flat[:, cols] = flat[:, cols] * ~kill
        # Each job at most its max replicas (exploration cap included): keep the first GPUs in node order.
        r = row_sums(pop)
        rows_i = np.flatnonzero(r > self._rep_limit32[:, None])
        if rows_i.size:
            flat = pop.reshape(-1, nn)
            rows = flat[rows_i]
            lim = self._rep_limit32[rows_i // q][:, None]
            flat[rows_i] = np.minimum(rows, np.maximum(lim - (np.cumsum(rows, axis=1) - rows), 0.0))
        # Each job on at most max_nodes nodes.
        if nn > self.max_nodes:
            cnt = self._row_counts(pop > 0)
            rows_i = np.flatnonzero((cnt > self.max_nodes) & ~self.pinned[:, None])
            if rows_i.size:
                flat = pop.reshape(-1, nn)
                rows = flat[rows_i]
                rows[np.cumsum(rows > 0, axis=1) > self.max_nodes] = 0.0
                flat[rows_i] = rows
        # Node capacity by cumulative sum over jobs in priority order.
        # Only the (individual, node) columns over capacity are touched.
        cols = np.flatnonzero((col_sums(pop) > self._cap32).reshape(-1))
        if cols.size:
            flat = pop.reshape(nj, -1)
            sub = flat[:, cols]
            before: np.ndarray = np.cumsum(sub, axis=0) - sub
            cap = self._cap32[cols % nn]
            flat[:, cols] = np.minimum(sub, np.maximum(cap - before, 0.0))
        # Jobs below their min replicas get nothing.
        low = (row_sums(pop) < self._min32[:, None]) & ~self.pinned[:, None]
        if low.any():
            np.multiply(pop, ~low[..., None], out=pop)
        return pop

    def repair_one(self, matrix: np.ndarray) -> np.ndarray:
        """Feasible int64 copy of one ``(jobs, nodes)`` matrix."""
        return self.unstack(self.repair(self.stack([matrix])), 0)

    # ----------------------------------------------------------------------------------------
    # State: sparse population keyed by job and node ids
    # ----------------------------------------------------------------------------------------

    def remap(self, state: PolicyState | None, limit: int) -> np.ndarray:
        """Up to ``limit`` individuals ``(jobs, k, nodes)`` of a carried population, on this round's
        jobs and nodes (rows of departed jobs and columns of departed nodes dropped; new jobs get 0)."""
        empty = np.zeros((self.num_jobs, 0, self.num_nodes), dtype=np.float32)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or limit <= 0:
            return empty
        try:
            state = decode_state(state)          # as stored (JSON, arrays encoded) or already decoded
            size = int(state["size"])
            old_jobs = [str(x) for x in state["job_ids"]]
            old_nodes = [str(x) for x in state["node_ids"]]
            pi = np.asarray(state["pop_index"], dtype=np.int64).ravel()
            ji = np.asarray(state["job_index"], dtype=np.int64).ravel()
            ni = np.asarray(state["node_index"], dtype=np.int64).ravel()
            g = np.asarray(state["gpus"], dtype=np.int64).ravel()
        except (KeyError, TypeError, ValueError):
            return empty
        size = min(size, limit)
        if size <= 0 or not (pi.size == ji.size == ni.size == g.size):
            return empty
        jpos = {jid: i for i, jid in enumerate(self.job_ids)}
        npos = self.cluster.index()
        jmap = np.array([jpos.get(x, -1) for x in old_jobs], dtype=np.int64)
        nmap = np.array([npos.get(x, -1) for x in old_nodes], dtype=np.int64)
        ok = (pi >= 0) & (pi < size) & (ji >= 0) & (ji < jmap.size) & (ni >= 0) & (ni < nmap.size)
        pi, ji, ni, g = pi[ok], ji[ok], ni[ok], g[ok]
        nj, nn = jmap[ji], nmap[ni]
        ok = (nj >= 0) & (nn >= 0) & (g > 0)
        out = np.zeros((self.num_jobs, size, self.num_nodes), dtype=np.float32)
        np.add.at(out, (nj[ok], pi[ok], nn[ok]), g[ok].astype(np.float32))
        return out

    def encode(self, pop: np.ndarray) -> dict[str, Any]:
        """Sparse, id-keyed form of a population ``(jobs, k, nodes)`` for the policy state."""
        ji, pi, ni = np.nonzero(pop)
        order = np.lexsort((ni, ji, pi))
        ji, pi, ni = ji[order], pi[order], ni[order]
        return {
            "version": STATE_VERSION,
            "job_ids": list(self.job_ids),
            "node_ids": list(self.cluster.nodes),
            "size": int(pop.shape[1]),
            "pop_index": pi.astype(np.int32),
            "job_index": ji.astype(np.int32),
            "node_index": ni.astype(np.int32),
            "gpus": np.rint(pop[ji, pi, ni]).astype(np.int32),
        }

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
