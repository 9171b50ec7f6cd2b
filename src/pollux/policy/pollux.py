"""The Pollux scheduling policy, PolluxSched (SPEC §5).

Every round the policy maximises ``FITNESS_p(A) = ((1/J)·Σ_j (SPEEDUP_j(A_j) + 1e-3)^p)^(1/p)`` over
integer allocation matrices ``A[job, node]`` (GPUs of a job on a node). ``SPEEDUP_j`` is looked up in a
per-job table built once per round by :func:`pollux.goodput.speedup_table` (capped by the exploration
cap, scaled by ``d·num_nodes``) and multiplied by the re-allocation penalty ``(T_j − R_j·δ)/(T_j + δ)``
when the job's row changes. Because FITNESS_p is a monotone function of ``Σ_j u(SPEEDUP_j)`` (u a power
or a log), the objective is separable per job, which the greedy search exploits.

The search, every part of it on that exact objective:

1. **Lazy greedy fill** (:meth:`PolluxProblem.greedy`) from the current allocation, from nothing but
   the pinned jobs, and from the best carried individual: jobs sit in a priority queue keyed by their
   best gain per GPU over jumps of k = 1, 2, … GPUs, each placed the best of three ways (grow on its
   own nodes, move onto one node — tightest fit, or roomiest in a "loose" variant — or spread over
   nodes without another distributed job); the top job is re-evaluated against the current free
   capacity and applied if it still beats the next one.
2. **Destroy-and-refill local search** (:meth:`PolluxProblem.local_search`): a few jobs give a GPU
   back, return to their current row (evicting what is in the way) or drop to nothing; the greedy
   refills; the result is kept if fitter. A last pass tries moved jobs back on their current rows.
3. **Genetic search of SPEC §5** (:meth:`PolluxProblem.genetic`): mutation, single-point crossover
   after binary tournaments, repair, keep the best distinct individuals. Vectorised over the whole
   population, held as one float32 ``(jobs, population, nodes)`` array of whole numbers (per-node and
   per-job sums are then small matrix products; the repair touches only the conflicting columns).
   Seeded by the above, the current allocation and the population carried over from the previous
   round (rows remapped by job and node id), and stopped when the best individual stalls.

On clusters where the dense population would exceed ``dense_limit`` elements (e.g. 1024 × 4 GPUs
with 1000 jobs) steps 1–2 alone run and a few best individuals are carried. Internally jobs are
sorted by priority (pinned, then least attained service, then submission time), so the repair's
"later jobs lose" rules are cumulative sums along the job axis.
See ``docs/policy-pollux.md``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits, exploration_cap, fair_share, speedup_table
from pollux.goodput.threads import one_blas_thread
from pollux.policy.base import Allocation, Cluster, JobView, PolicyState, from_matrix

#: Added to every speedup before the power mean (SPEC §5, ref), so a job without GPUs weighs heavily.
SPEEDUP_EPS = 1e-3
#: Version tag of the state this policy carries between rounds.
STATE_VERSION = 1
#: Reference mutation probabilities (SPEC §5): reset a row, pick a row for zeroing, zero an element.
RESET_PROB = 0.1
ZERO_ROW_PROB = 0.1
ZERO_ELEM_PROB = 0.1
#: Placement modes of the greedy fill: grow on its own nodes, move onto one node, spread over nodes.
IN_PLACE, SINGLE, SPREAD = 0, 1, 2
#: Arrays up to this many elements are reduced by matrix products, larger ones by einsum.
_SMALL = 1 << 18


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


class _FillState:
    """Free GPUs and distributed-job owners of the nodes while the greedy fills one matrix, with
    the node orders its placement rule needs (each rebuilt lazily, only when asked for, after a
    change)."""

    def __init__(self, free: np.ndarray, owner: np.ndarray, interference: bool, loose: bool = False) -> None:
        self.free = free.astype(np.int64)
        self.loose = loose
        self.owner = owner
        self.interference = interference
        self.total_free = int(self.free.sum())
        self.version = 0
        self._cache: dict[str, Any] = {}

    def update(self, j: int, old: np.ndarray, new: np.ndarray) -> None:
        self.free += old - new
        self.total_free = int(self.free.sum())
        if self.interference:
            self.owner[self.owner == j] = -1
            if np.count_nonzero(new) > 1:
                self.owner[new > 0] = j
        self.version += 1
        self._cache.clear()

    @property
    def max_free(self) -> int:
        got = self._cache.get("max")
        if got is None:
            got = self._cache["max"] = int(self.free.max()) if self.free.size else 0
        return got

    def _by_free(self) -> tuple[np.ndarray, np.ndarray]:
        """Nodes by free GPUs ascending (ties by node index), and their free GPUs."""
        got = self._cache.get("asc")
        if got is None:
            order = np.argsort(self.free, kind="stable")
            got = self._cache["asc"] = (order, self.free[order])
        return got

    def _by_free_desc(self) -> np.ndarray:
        got = self._cache.get("desc")
        if got is None:
            got = self._cache["desc"] = np.argsort(-self.free, kind="stable")
        return got

    def spread_order(self) -> np.ndarray:
        """Nodes with free GPUs and no distributed job, most free first (ties: node order)."""
        got = self._cache.get("spread")
        if got is None:
            free = self.free
            ok = (free > 0) & (self.owner < 0) if self.interference else free > 0
            nodes = np.flatnonzero(ok)
            got = self._cache["spread"] = nodes[np.argsort(-free[nodes], kind="stable")]
        return got

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
        order, values = self._by_free()
        i = int(np.searchsorted(values, total, side="left"))
        while i < values.size:
            n = int(order[i])
            if row[n] == 0:
                cand = (int(values[i]), 1, n)
                if key is None or cand < key:
                    best, key = n, cand
                break
            i += 1
        return best


class PolluxProblem:
    """One round's search problem: jobs in priority order, speedup tables, constraints, objective.

    Built by :meth:`PolluxPolicy.problem`. Matrices handed to its methods are ``(jobs, nodes)`` (or a
    stack ``(population, jobs, nodes)``) in the problem's job order :attr:`job_ids` and the cluster's
    node order. :meth:`evaluate` is the objective; :meth:`repair` makes any matrix feasible.
    """

    def __init__(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        allocation: Mapping[str, Mapping[str, int]],
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

        # Current rows: the allocation argument is the truth; JobView.allocation fills in for jobs
        # it does not mention. Unknown nodes are dropped.
        raw_cur = np.zeros((len(jobs), num_nodes), dtype=np.int64)
        for i, job in enumerate(jobs):
            row = allocation[job.id] if job.id in allocation else job.allocation
            for node, gpus in row.items():
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
        delta = float(restart_penalty_s)
        pen = np.ones(num_jobs)
        for j, job in enumerate(self.jobs):
            t, r = max(float(job.age_s), 0.0), max(float(job.restarts), 0.0)
            if t + delta > 0.0:
                pen[j] = max((t - r * delta) / (t + delta), 0.0)
        self.pen = np.clip(pen, 0.0, 1.0)

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
        self._ones_n = np.ones(num_nodes, dtype=np.float32)
        self._ones_j = np.ones(num_jobs, dtype=np.float32)
        self._cur32 = self.cur.astype(np.float32)
        self._cap32 = cap.astype(np.float32)
        self._min32 = self.min_replicas.astype(np.float32)
        self._rep_limit32 = self.rep_limit.astype(np.float32)
        self._rep_limit_grow = np.where(self.pinned, 0, self.max_replicas).astype(np.float32)
        self._pin_idx = np.flatnonzero(self.pinned)
        self._list_cache: dict[int, tuple[list[list[float]], list[float]]] = {}

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

    # Small arrays: a matrix-vector product is the fastest reduction over a short axis; large ones
    # use einsum, which stays on one thread (a multi-threaded BLAS call competes for busy cores).

    def _row_sums(self, pop: np.ndarray) -> np.ndarray:
        """GPUs per (job, individual)."""
        nj, q, nn = pop.shape
        if pop.size <= _SMALL:
            return (pop.reshape(-1, nn) @ self._ones_n).reshape(nj, q)
        return np.einsum("jqn->jq", pop)

    def _row_counts(self, mask: np.ndarray) -> np.ndarray:
        return self._row_sums(mask.astype(np.float32))

    def _col_sums(self, pop: np.ndarray) -> np.ndarray:
        """GPUs per (individual, node)."""
        nj, q, nn = pop.shape
        if pop.size <= _SMALL:
            return (self._ones_j @ pop.reshape(nj, -1)).reshape(q, nn)
        return np.einsum("jqn->qn", pop)

    def job_speedups(self, pop: np.ndarray, penalised: bool = True) -> np.ndarray:
        """Per-job speedups ``(jobs, population)`` of a population ``(jobs, population, nodes)``."""
        r = np.rint(self._row_sums(pop)).astype(np.int64)
        n = np.rint(self._row_counts(pop > 0)).astype(np.int64)
        idx = self.base[:, None] + np.minimum(n, self.nt_max) * (self.rt_max + 1) + np.minimum(r, self.rt_max)
        s = self.flat[idx]
        if penalised:
            changed = self._row_counts(pop != self._cur32[:, None, :]) > 0
            s = np.where(changed, s * self.pen[:, None], s)
        return s

    def evaluate(self, pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(FITNESS_p, unpenalised FITNESS_p) per individual of ``(jobs, population, nodes)``.

        The unpenalised value only breaks ties (e.g. when every job is brand new and every
        allocation scores the same, the one that runs more work wins).
        """
        q = pop.shape[1]
        if self.num_jobs == 0:
            return np.ones(q), np.ones(q)
        r = np.rint(self._row_sums(pop)).astype(np.int64)
        n = np.rint(self._row_counts(pop > 0)).astype(np.int64)
        idx = self.base[:, None] + np.minimum(n, self.nt_max) * (self.rt_max + 1) + np.minimum(r, self.rt_max)
        s = self.flat[idx]
        changed = self._row_counts(pop != self._cur32[:, None, :]) > 0
        pen = np.where(changed, s * self.pen[:, None], s)
        return _power_mean(pen.T, self.p), _power_mean(s.T, self.p)

    def matrix_speedups(self, matrix: np.ndarray, penalised: bool = True) -> np.ndarray:
        """Per-job speedups of one ``(jobs, nodes)`` integer matrix."""
        a = np.asarray(matrix)
        r = a.sum(axis=1)
        n = np.count_nonzero(a, axis=1)
        s = self.flat[self.base + np.minimum(n, self.nt_max) * (self.rt_max + 1) + np.minimum(r, self.rt_max)]
        if penalised:
            changed = (a != self.cur).any(axis=1)
            s = np.where(changed, s * self.pen, s)
        return s

    def fitness(self, matrix: np.ndarray) -> float:
        """FITNESS_p of one ``(jobs, nodes)`` matrix."""
        if self.num_jobs == 0:
            return 1.0
        return float(_power_mean(self.matrix_speedups(matrix), self.p))

    def fitness_pair(self, matrix: np.ndarray) -> tuple[float, float]:
        """(FITNESS_p, unpenalised FITNESS_p) of one matrix: the order of :meth:`select`."""
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
                cols = np.flatnonzero(self._col_sums(nz.astype(np.float32)).reshape(-1) > 1.5)
                if cols.size:
                    sub = m[:, cols]
                    earlier = np.cumsum(sub, axis=0, dtype=np.int32) > sub   # an earlier one sits there
                    kill = sub & earlier
                    kill[self._pin_idx] = False
                    flat = pop.reshape(nj, -1)
                    flat[:, cols] = flat[:, cols] * ~kill
        # Each job at most its max replicas (exploration cap included): keep the first GPUs in node order.
        r = self._row_sums(pop)
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
        cols = np.flatnonzero((self._col_sums(pop) > self._cap32).reshape(-1))
        if cols.size:
            flat = pop.reshape(nj, -1)
            sub = flat[:, cols]
            before: np.ndarray = np.cumsum(sub, axis=0) - sub
            cap = self._cap32[cols % nn]
            flat[:, cols] = np.minimum(sub, np.maximum(cap - before, 0.0))
        # Jobs below their min replicas get nothing.
        low = (self._row_sums(pop) < self._min32[:, None]) & ~self.pinned[:, None]
        if low.any():
            np.multiply(pop, ~low[..., None], out=pop)
        return pop

    # ----------------------------------------------------------------------------------------
    # Greedy marginal-gain fill of one matrix
    # ----------------------------------------------------------------------------------------

    def _owners(self, a: np.ndarray) -> np.ndarray:
        """Per node, the distributed job on it (-1 when none); the first one wins on a conflict."""
        owner = np.full(self.num_nodes, -1, dtype=np.int64)
        dist = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
        for j in dist[::-1]:
            owner[a[j] > 0] = j
        return owner

    def _place(self, a: np.ndarray, j: int, k: int, mode: int, st: _FillState) -> np.ndarray | None:
        """New row of job j with k more GPUs, or None, by placement ``mode``: IN_PLACE grows on its
        own nodes (most free first); SINGLE moves it onto one node (the tightest fit, or with
        ``st.loose`` the roomiest; its own nodes preferred on ties); SPREAD see :meth:`_spread_order`.
        """
        row = a[j]
        mine = np.flatnonzero(row)
        r = int(row[mine].sum())
        total = r + k
        free = st.free
        if mode == IN_PLACE:
            if r == 0 or int(free[mine].sum()) < k:
                return None
            new = row.copy()
            need = k
            for n in mine[np.argsort(-free[mine], kind="stable")]:
                t = min(need, int(free[n]))
                new[n] += t
                need -= t
                if need == 0:
                    break
            return new
        if mode == SINGLE:
            node = st.single_node(total, mine, row, st.loose)
            if node < 0:
                return None
            new = np.zeros_like(row)
            new[node] = total
            return new
        order, avail, keep = self._spread_order(row, mine, st, j)
        base = row.copy() if keep else np.zeros_like(row)
        need = total - (r if keep else 0)
        cum = np.cumsum(avail)
        if cum.size == 0 or cum[-1] < need:
            return None
        m = int(np.searchsorted(cum, need)) + 1
        add = avail[:m].copy()
        add[-1] -= int(cum[m - 1]) - need
        base[order[:m]] += add
        if np.count_nonzero(base) > self.max_nodes:
            return None
        return base

    def _spread_order(self, row: np.ndarray, mine: np.ndarray, st: _FillState,
                      j: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Nodes a job spreads over, in fill order, what each offers it, and whether it keeps its GPUs.

        The job keeps its GPUs when none of its nodes hosts another distributed job; then its own
        nodes come first (their free GPUs), then the others by most free GPUs among nodes without a
        distributed job. Otherwise it moves: the same order, its own nodes offering ``free + its
        GPUs`` where no other distributed job sits. Only the first ``max_nodes`` other nodes matter.
        """
        free, owner = st.free, st.owner
        if self.interference:
            elig_mine = (owner[mine] < 0) | (owner[mine] == j)
        else:
            elig_mine = np.ones(mine.size, dtype=bool)
        keep = mine.size > 0 and bool(elig_mine.all())
        offer = free[mine] if keep else free[mine] + row[mine]
        offer *= elig_mine
        sort = np.argsort(-offer, kind="stable")
        mine, offer = mine[sort], offer[sort]
        glob = st.spread_order()
        cand = glob[: self.max_nodes + mine.size]
        if mine.size:
            cand = cand[row[cand] == 0]
        cand = cand[: self.max_nodes]
        return np.concatenate([mine, cand]), np.concatenate([offer, free[cand]]), keep

    def _option_table(self, a: np.ndarray, j: int, st: _FillState):
        """Per k = 1 … kmax more GPUs for job j: (nodes after, mode, speedup after, feasible), keeping
        the placement (on its own nodes, on one node, spread) with the best speedup (ties in that
        order), exactly as :meth:`_place` will build it. The spread is only worked out where the
        job's table says more nodes could beat the other two. None if the job cannot grow."""
        row = a[j]
        mine = np.flatnonzero(row)
        r = int(row[mine].sum())
        kmax = min(int(self.max_replicas[j]) - r, st.total_free)
        if kmax <= 0:
            return None
        lo, hi = r + 1, r + kmax + 1            # replica counts after growth (≤ max_replicas ≤ rt_max)
        tab = self.table[j]
        nn = mine.size
        # Own nodes: a prefix of k (as many as their free GPUs); one node: a prefix too.
        val = np.full(kmax, -1.0)
        n_new = np.full(kmax, nn, dtype=np.int64)
        mode = np.zeros(kmax, dtype=np.int64)   # IN_PLACE
        if nn:
            own_free = int(st.free[mine].sum())
            host_max = max(st.max_free, int((st.free[mine] + row[mine]).max()))
            kin = min(own_free, kmax)
            if kin > 0:
                val[:kin] = tab[min(nn, self.nt_max), lo:lo + kin]
        else:
            host_max = st.max_free
        ks = min(max(host_max - r, 0), kmax)
        if ks > 0:
            v_si = tab[1, lo:lo + ks]
            use = v_si > val[:ks]
            val[:ks][use] = v_si[use]
            mode[:ks][use] = SINGLE
            n_new[:ks][use] = 1
        better = self.best_any_nodes[j, lo:hi] > val
        if better.any():
            _, avail, keep = self._spread_order(row, mine, st, j)
            cum = np.cumsum(avail)
            need = np.arange(lo, hi) - (r if keep else 0)
            ok = need <= (cum[-1] if cum.size else 0)
            m = np.minimum(np.searchsorted(cum, need) + 1, max(cum.size, 1))
            if keep:
                n_sp = np.maximum(m, nn)
            else:
                n_sp = np.cumsum(avail > 0)[m - 1] if cum.size else m
            ok &= (n_sp <= self.max_nodes) & better
            v_sp = tab[np.minimum(n_sp, self.nt_max), np.arange(lo, hi)]
            use = ok & (v_sp > val)
            val[use] = v_sp[use]
            mode[use] = SPREAD
            n_new[use] = n_sp[use]
        feasible = (val >= 0) & (n_new >= 1) & (n_new <= self.max_nodes)
        if self.min_replicas[j] > lo:
            feasible[: self.min_replicas[j] - lo] = False
        return n_new, mode, val, feasible

    def _options(self, a: np.ndarray, j: int,
                 st: _FillState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every feasible growth of job j: (k more GPUs, nodes after, placement mode, speedup after)."""
        opt = self._option_table(a, j, st)
        if opt is None:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e, np.zeros(0)
        n_new, mode, val, ok = opt
        k = np.arange(1, ok.size + 1)
        return k[ok], n_new[ok], mode[ok], val[ok]

    def _best_option(self, a: np.ndarray, j: int, st: _FillState,
                     u_now: float) -> tuple[float, int, int]:
        """Best objective gain per GPU of growing job j: (gain, k more GPUs, mode); k = 0 if none.

        The same choice as :meth:`_option_table` (tested to agree), as a plain loop over k: the
        greedy calls this thousands of times on short rows, where numpy's per-call cost dominates.
        """
        row = a[j]
        mine = np.flatnonzero(row)
        nn = int(mine.size)
        if nn:
            rm, fm = row[mine], st.free[mine]
            r, own_free, host_own = int(rm.sum()), int(fm.sum()), int((fm + rm).max())
        else:
            r = own_free = host_own = 0
        kmax = min(int(self.max_replicas[j]) - r, st.total_free)
        if kmax <= 0:
            return 0.0, 0, 0
        rows, best_any = self._lists(j)
        host_max = max(st.max_free, host_own)
        t_in = rows[min(nn, self.nt_max)]
        t_one = rows[1] if self.nt_max >= 1 else None
        pen, p, eps = float(self.pen[j]), self.p, SPEEDUP_EPS
        min_r, max_nodes, nt_max = int(self.min_replicas[j]), self.max_nodes, self.nt_max
        spread = None
        best_g, best_k, best_mode = -math.inf, 0, 0
        # No k can gain more than reaching the job's best speedup anywhere: stop once k is so large
        # that even that, spread over k GPUs, cannot beat the best found.
        top = float(_utility(np.asarray(max(best_any) * pen), p)) - u_now
        for k in range(max(1, min_r - r), kmax + 1):
            if top <= best_g * k:
                break
            tot = r + k
            v, mode = -1.0, IN_PLACE
            if nn and k <= own_free:
                v = t_in[tot]
            if t_one is not None and tot <= host_max and t_one[tot] > v:
                v, mode = t_one[tot], SINGLE
            if best_any[tot] > v:
                if spread is None:
                    _, avail, keep = self._spread_order(row, mine, st, j)
                    cum = np.cumsum(avail)
                    spread = (cum.tolist(), np.cumsum(avail > 0).tolist(), keep)
                cum_l, pos_l, keep = spread
                need = tot - (r if keep else 0)
                if cum_l and need <= cum_l[-1]:
                    m = bisect.bisect_left(cum_l, need) + 1
                    n_sp = max(m, nn) if keep else pos_l[m - 1]
                    if n_sp <= max_nodes:
                        vs = rows[min(n_sp, nt_max)][tot]
                        if vs > v:
                            v, mode = vs, SPREAD
            if v < 0.0:
                continue
            x = v * pen + eps
            if p == -1.0:
                u = -1.0 / x
            elif p == 0.0:
                u = math.log(x)
            elif p < 0.0:
                u = -(x**p)
            else:
                u = x**p
            g = (u - u_now) / k
            if g > best_g:
                best_g, best_k, best_mode = g, k, mode
        if best_k == 0:
            return 0.0, 0, 0
        return best_g, best_k, best_mode

    def _lists(self, j: int) -> tuple[list[list[float]], list[float]]:
        """Job j's speedup table and its best-over-nodes row as Python lists (cached)."""
        got = self._list_cache.get(j)
        if got is None:
            got = (self.table[j].tolist(), self.best_any_nodes[j].tolist())
            self._list_cache[j] = got
        return got

    def _estimates(self, a: np.ndarray, free: np.ndarray, owner: np.ndarray, u_now: np.ndarray) -> np.ndarray:
        """Approximate best gain per GPU of every job's growth, vectorised (the greedy's first queue).

        Like :meth:`_options` but with the spread estimated from the cluster-wide free GPUs on nodes
        without a distributed job; the greedy re-evaluates each job exactly before using it.
        """
        r = a.sum(axis=1)
        room = np.where(self.movable, self.max_replicas - r, 0)
        kmax = int(min(room.max(initial=0), free.sum()))
        if kmax <= 0:
            return np.zeros(self.num_jobs)
        nn = np.count_nonzero(a, axis=1)
        own = a > 0
        own_free = np.einsum("jn,n->j", own.astype(np.float32), free.astype(np.float32))
        host_max = np.maximum(free.max(), np.where(own, free + a, 0).max(axis=1))
        elig_free = np.sort(free[owner < 0])[::-1] if self.interference else np.sort(free)[::-1]
        cum = np.cumsum(elig_free)
        cum_total = int(cum[-1]) if cum.size else 0
        k = np.arange(1, kmax + 1)[None, :]
        rk = r[:, None] + k
        rc = np.minimum(rk, self.rt_max)
        rows = np.arange(self.num_jobs)[:, None]
        inplace = (r[:, None] > 0) & (k <= own_free[:, None])
        single = rk <= host_max[:, None]
        extra = np.maximum(np.where(r[:, None] > 0, k - own_free[:, None], rk), 1)
        n_sp = np.where(r[:, None] > 0, nn[:, None], 0) + np.searchsorted(cum, extra) + 1
        spread = (extra <= cum_total) & (n_sp <= self.max_nodes)
        val = np.maximum.reduce([
            np.where(inplace, self.table[rows, np.minimum(nn, self.nt_max)[:, None], rc], -1.0),
            np.where(single, self.table[rows, min(1, self.nt_max), rc], -1.0),
            np.where(spread, self.table[rows, np.minimum(n_sp, self.nt_max), rc], -1.0),
        ])
        ok = (k <= room[:, None]) & (val >= 0) & (rk >= self.min_replicas[:, None])
        gain = (_utility(np.maximum(val, 0.0) * self.pen[:, None], self.p) - u_now[:, None]) / k
        return np.where(ok, gain, -np.inf).max(axis=1)

    def greedy(self, a: np.ndarray, loose: bool = False) -> np.ndarray:
        """Grow a feasible matrix by best objective gain per GPU until nothing gains (lazy greedy).

        Each movable job's best jump (k = 1… more GPUs, placed by :meth:`_place`, gain per GPU of its
        objective term u(SPEEDUP) — FITNESS_p is monotone in Σ u) sits in a priority queue; the top
        one is re-evaluated against the current free capacity and applied if it still beats the
        next one, else re-queued with its fresh value. Jumps let a job pay its re-allocation
        penalty once for several GPUs.
        """
        a = np.array(a, dtype=np.int64, copy=True)
        if self.num_jobs == 0 or self.total_gpus == 0:
            return a
        p = self.p
        owner = self._owners(a) if self.interference else np.full(self.num_nodes, -1)
        st = _FillState(self.cap - a.sum(axis=0), owner, self.interference, loose)
        if st.total_free <= 0:
            return a
        u_now = _utility(self.matrix_speedups(a), p)
        est = self._estimates(a, st.free, owner, u_now)
        # Entries: (-gain per GPU, job, k, state version it was computed at; -1 = an estimate).
        heap = [(-float(est[j]), int(j), 0, 0, -1) for j in np.flatnonzero(est > 0.0)]
        heapq.heapify(heap)
        while heap and st.total_free > 0:
            _, j, k, mode, version = heapq.heappop(heap)
            if version != st.version:
                g, k, mode = self._best_option(a, j, st, float(u_now[j]))
                if k == 0 or g <= 0.0:
                    continue
                if heap and g < -heap[0][0] * (1.0 - 1e-12):
                    heapq.heappush(heap, (-g, j, k, mode, st.version))
                    continue
            new = self._place(a, j, k, mode, st)
            if new is None:
                continue
            nr, nnew = int(new.sum()), int(np.count_nonzero(new))
            s = self.table[j, min(nnew, self.nt_max), min(nr, self.rt_max)]
            if not np.array_equal(new, self.cur[j]):
                s *= self.pen[j]
            u_new = float(_utility(s, p))
            if u_new <= u_now[j]:
                continue
            st.update(j, a[j], new)
            a[j] = new
            u_now[j] = u_new
            g, k, mode = self._best_option(a, j, st, u_new)
            if k and g > 0.0:
                heapq.heappush(heap, (-g, j, k, mode, st.version))
        return a

    def repair_one(self, matrix: np.ndarray) -> np.ndarray:
        """Feasible int64 copy of one ``(jobs, nodes)`` matrix."""
        return self.unstack(self.repair(self.stack([matrix])), 0)

    def _shrink_losses(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every job: the node it would give one GPU back from (its largest share), the row
        after that, and the objective loss u(now) − u(after) (inf for jobs that cannot give)."""
        node = np.argmax(a, axis=1)
        after = a.copy()
        rows = np.arange(self.num_jobs)
        after[rows, node] -= 1
        r = after.sum(axis=1)
        after[(r < self.min_replicas) | (r <= 0)] = 0
        loss = _utility(self.matrix_speedups(a), self.p) - _utility(self.matrix_speedups(after), self.p)
        loss = np.where(self.movable & (a.sum(axis=1) > 0), loss, np.inf)
        return node, after, loss

    def _insert(self, a: np.ndarray, j: int, row: np.ndarray) -> np.ndarray:
        """Give job j exactly ``row`` (when within its caps), evicting what stands in the way: other
        distributed jobs on its nodes if it is distributed, then GPUs of the lowest-priority
        movable jobs on nodes over capacity. The result is feasible if ``a`` was."""
        r, nodes = int(row.sum()), np.flatnonzero(row)
        if r == 0 or r > self.max_replicas[j] or r < self.min_replicas[j] or nodes.size > self.max_nodes:
            return a
        a = a.copy()
        a[j] = row
        if self.interference:
            others = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
            others = others[others != j]
            if nodes.size > 1:
                clash = others[(a[np.ix_(others, nodes)] > 0).any(axis=1)]
            else:
                clash = others[:0]
            if (self.pinned[clash]).any():
                return self._undo(a, j)
            a[np.ix_(clash, nodes)] = 0
        over = np.flatnonzero(a.sum(axis=0) > self.cap)
        for n in over:
            excess = int(a[:, n].sum() - self.cap[n])
            for i in np.flatnonzero(a[:, n])[::-1]:
                if i == j or self.pinned[i]:
                    continue
                t = min(excess, int(a[i, n]))
                a[i, n] -= t
                excess -= t
                if excess == 0:
                    break
            if excess > 0:
                return self._undo(a, j)
        low = (a.sum(axis=1) < self.min_replicas) & self.movable
        a[low] = 0
        return a

    def _undo(self, a: np.ndarray, j: int) -> np.ndarray:
        a[j] = 0
        return self.repair_one(a)

    def local_search(self, a: np.ndarray, rng: np.random.Generator, iterations: int, fraction: float,
                     max_jobs: int = 32, restore: int = 32) -> tuple[np.ndarray, float, float]:
        """Destroy-and-refill on one matrix; keeps each result that is fitter.

        Each round picks 1 … ``2·fraction`` of the movable jobs (at most ``max_jobs``; half of them,
        rounded up, among the running jobs whose objective term loses least by giving one GPU back)
        and applies to each, at random, one of: give one GPU back, return to its current row
        (evicting what stands in the way, see :meth:`_insert`), or drop to nothing. Then
        :meth:`greedy` refills. Shrinking lets capacity move to where it gains more — the greedy
        only ever grows. Finally :meth:`restore` tries up to ``restore`` moved jobs back on their
        current rows. Returns (matrix, fitness, unpenalised fitness).
        """
        best = np.array(a, dtype=np.int64)
        bf, br = self.fitness_pair(best)
        mov = np.flatnonzero(self.movable)
        if mov.size == 0:
            return best, bf, br
        top = min(max(2, round(2 * fraction * mov.size)), max(int(max_jobs), 1), mov.size)
        losses = None
        for _ in range(iterations):
            if losses is None:
                losses = self._shrink_losses(best)
            _, after, loss = losses
            size = int(rng.integers(1, top + 1))
            donors = np.flatnonzero(np.isfinite(loss))
            donors = donors[np.argsort(loss[donors], kind="stable")][: 2 * size]
            n_don = min((size + 1) // 2, donors.size)
            pick = rng.choice(donors, size=n_don, replace=False) if n_don else donors
            rest = np.setdiff1d(mov, pick)
            pick = np.concatenate([pick, rng.choice(rest, size=min(size - n_don, rest.size), replace=False)])
            op = rng.integers(0, 3, size=pick.size)
            cand = best.copy()
            cand[pick[op == 0]] = after[pick[op == 0]]
            cand[pick[op == 1]] = 0
            for j in pick[op == 2]:
                cand = self._insert(cand, int(j), self.cur[j])
            cand = self.greedy(cand, loose=bool(rng.random() < 0.5))
            f, fr = self.fitness_pair(cand)
            if (f, fr) > (bf, br):
                best, bf, br = cand, f, fr
                losses = None
        if restore > 0:
            return self.restore(best, bf, br, restore)
        return best, bf, br

    def restore(self, a: np.ndarray, bf: float, br: float, max_jobs: int) -> tuple[np.ndarray, float, float]:
        """Try to put moved jobs back on their current rows (most promising first), refilling after
        each; keeps each fitter result. Catches a job moved only because another took its place."""
        best = a
        cur_u = _utility(self.matrix_speedups(self.cur, penalised=False), self.p)
        now_u = _utility(self.matrix_speedups(best), self.p)
        moved = np.flatnonzero(self.movable & (self.cur.sum(axis=1) > 0) & (best != self.cur).any(axis=1))
        moved = moved[np.argsort(now_u[moved] - cur_u[moved], kind="stable")][: max(int(max_jobs), 1)]
        for j in moved:
            if np.array_equal(best[j], self.cur[j]):
                continue
            cand = self.greedy(self._insert(best, int(j), self.cur[j]))
            f, fr = self.fitness_pair(cand)
            if (f, fr) > (bf, br):
                best, bf, br = cand, f, fr
        return best, bf, br

    # ----------------------------------------------------------------------------------------
    # Genetic search, vectorised over the population
    # ----------------------------------------------------------------------------------------

    def _keys(self, pop: np.ndarray) -> np.ndarray:
        """One bytes key per individual, for exact duplicate detection."""
        dtype = np.uint8 if self.gpn <= 255 else np.uint16
        flat = np.ascontiguousarray(pop.transpose(1, 0, 2), dtype=dtype).reshape(pop.shape[1], -1)
        return flat.view(np.dtype((np.void, flat.shape[1] * flat.itemsize))).ravel()

    def select(self, pop: np.ndarray, fit: np.ndarray, raw: np.ndarray,
               size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The best ``size`` distinct individuals, fittest first (ties: unpenalised fitness, then index)."""
        order = np.lexsort((np.arange(pop.shape[1]), -raw, -fit))
        if pop.shape[0] * pop.shape[2]:
            _, first = np.unique(self._keys(pop)[order], return_index=True)
            keep = order[np.sort(first)][:size]
        else:
            keep = order[:1]
        return pop[:, keep, :], fit[keep], raw[keep]

    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SPEC §5 mutation of a population; modifies ``pop`` in place and returns it."""
        nj, q, nn = pop.shape
        rows = pop.reshape(-1, nn)
        # Reset a row to the job's current allocation.
        ri = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < RESET_PROB)
        if ri.size:
            rows[ri] = self._cur32[ri // q]
        # For ~10 % of rows, zero each element with probability 0.1.
        zi = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < ZERO_ROW_PROB)
        if zi.size:
            rows[zi] *= rng.random((zi.size, nn), dtype=np.float32) >= ZERO_ELEM_PROB
        # Growth: element (j, n) grows to a uniform value in [value, max feasible] with probability
        # p1 + p2 − p1·p2 on nodes the job uses (p2 = 1/#such nodes), p1 elsewhere (p1 = 1/#nodes
        # where the job fits one more replica).
        free = np.maximum(self._cap32 - self._col_sums(pop), 0.0)                      # (q, N)
        room = np.maximum(self._rep_limit_grow[:, None] - self._row_sums(pop), 0.0)   # (J, q)
        has_free = free > 0
        n_free = has_free.sum(axis=1)
        # Rows (job, individual) that may grow: the job has room and its individual a free GPU.
        ri = np.flatnonzero((room > 0) & (n_free > 0)[None, :])
        if ri.size == 0:
            return pop
        rq = ri % q
        cand = has_free[rq]                                         # (R, N): nodes with a free GPU
        used = rows[ri] > 0
        np.logical_and(used, cand, out=used)
        p1 = (1.0 / n_free[rq]).astype(np.float32)[:, None]           # 1/#nodes that fit one more
        p2 = 1.0 / np.maximum(used.astype(np.float32) @ self._ones_n, 1.0)[:, None]
        prob = used * (p2 - p1 * p2)                                  # p1 + p2 − p1·p2 where used
        prob += p1
        prob *= cand
        u = rng.random(prob.shape, dtype=np.float32)
        gi = np.flatnonzero(u < prob)
        if gi.size:
            # Given growth, u/prob is uniform on [0, 1): reuse it for the new value.
            r_i, n_i = np.divmod(gi, nn)
            v = np.minimum(u.reshape(-1)[gi] / prob.reshape(-1)[gi], np.float32(0.999999))
            hi = np.minimum(free[rq[r_i], n_i], room.reshape(-1)[ri[r_i]])
            pop.reshape(-1)[ri[r_i] * nn + n_i] += np.floor(v * (hi + 1.0))
        return pop

    def crossover(self, pop: np.ndarray, fit: np.ndarray, raw: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
        """Binary tournaments pick parent pairs; single-point crossover over the job axis."""
        size = pop.shape[1]
        nj = pop.shape[0]
        pairs = max((size + 1) // 2, 1)
        a = rng.integers(size, size=(2, 2 * pairs))
        better = (fit[a[0]] > fit[a[1]]) | ((fit[a[0]] == fit[a[1]]) & (raw[a[0]] >= raw[a[1]]))
        win = np.where(better, a[0], a[1])
        pa, pb = win[:pairs], win[pairs:]
        cut = rng.integers(1, nj, size=pairs) if nj > 1 else np.ones(pairs, dtype=np.int64)
        head = np.arange(nj)[:, None] < cut[None, :]                  # (J, pairs)
        sel = np.concatenate([np.where(head, pa, pb), np.where(head, pb, pa)], axis=1)
        return pop[np.arange(nj)[:, None], sel]

    def genetic(self, seeds: np.ndarray, rng: np.random.Generator, population: int, generations: int,
                patience: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Run the GA from ``seeds`` ``(jobs, k, nodes)``; returns (population, fitness, raw, generations)."""
        seeds = self.repair(seeds)
        fit, raw = self.evaluate(seeds)
        pop, fit, raw = self.select(seeds, fit, raw, population)
        if pop.shape[1] < population:
            # Fill the initial population with mutants of the seeds.
            have = pop.shape[1]
            idx = np.arange(population - have) % have
            extra = self.repair(self.mutate(pop[:, idx, :], rng))
            ef, er = self.evaluate(extra)
            pop, fit, raw = self.select(np.concatenate([pop, extra], axis=1), np.concatenate([fit, ef]),
                                        np.concatenate([raw, er]), population)
        best = (float(fit[0]), float(raw[0]))
        stall = 0
        done = 0
        for _ in range(generations):
            children = self.repair(self.mutate(self.crossover(pop, fit, raw, rng), rng))
            cf, cr = self.evaluate(children)
            pop, fit, raw = self.select(np.concatenate([pop, children], axis=1), np.concatenate([fit, cf]),
                                        np.concatenate([raw, cr]), population)
            done += 1
            now = (float(fit[0]), float(raw[0]))
            if now > best:
                best, stall = now, 0
            else:
                stall += 1
            if patience is not None and stall >= patience:
                break
        return pop, fit, raw, done

    # ----------------------------------------------------------------------------------------
    # State: sparse population keyed by job and node ids
    # ----------------------------------------------------------------------------------------

    def remap(self, state: PolicyState | None, limit: int) -> np.ndarray:
        """Up to ``limit`` individuals ``(jobs, k, nodes)`` of a carried population, on this round's
        jobs and nodes (rows of departed jobs and columns of departed nodes dropped; new jobs get 0)."""
        empty = np.zeros((self.num_jobs, 0, self.num_nodes), dtype=np.float32)
        if not state or state.get("version") != STATE_VERSION or limit <= 0:
            return empty
        try:
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

    def to_allocation(self, matrix: np.ndarray) -> Allocation:
        return from_matrix(np.asarray(matrix), self.job_ids, self.cluster)


class PolluxPolicy:
    """PolluxSched: maximise FITNESS_p of the jobs' goodput speedups (SPEC §5).

    Parameters
    ----------
    p: power of the fitness mean (−1 default: harmonic; 0: geometric; 1: arithmetic).
    restart_penalty_s: δ of the re-allocation penalty ``(T − R·δ)/(T + δ)``.
    population, generations: size and (maximum) length of the genetic search (reference 100 × 100).
    max_nodes_per_job: most nodes one job may span (16).
    interference_avoidance: at most one distributed job per node (a hard constraint).
    patience: stop the genetic search after this many generations without a better best individual;
        None runs all ``generations``. With ``greedy_seed``, small problems get more:
        ``patience_work / (jobs × nodes)`` generations, at most ``10 × jobs``.
    greedy_seed: run the greedy fill (from the current allocation, from nothing but the pinned jobs,
        from the best carried individual) and the destroy-and-refill search before the genetic
        search, and seed it with their results. ``greedy_seed=False, patience=None`` is the plain
        100 × 100 genetic search of the reference (seeded by the current allocation and the carried
        population only).
    local_search_iters, local_search_iters_large: destroy-and-refill rounds (at most 4 per movable
        job) on clusters where the genetic search runs, and where it does not; each touches up to
        ``2 × local_search_fraction`` of the movable jobs (at most ``local_search_max_jobs``), from
        the best ``local_search_starts`` distinct greedy results.
    dense_limit: the genetic search runs when ``population × jobs × nodes`` is at most this; larger
        problems (a dense population would not fit) run only the greedy fill (tight packing) and
        the local search, and carry their ``keep_large`` best individuals in the state.
    table_cache: how many speedup tables to memoise across rounds, keyed by (model, limits, fair
        share, table size); a table is a pure function of that key, so results do not depend on it.

    ``decide`` returns the fittest allocation and a state holding the final population (sparse, keyed
    by job and node ids) plus ``fitness``, ``generations`` and ``search`` for diagnostics.
    """

    name = "pollux"

    def __init__(
        self,
        p: float = -1.0,
        restart_penalty_s: float = 30.0,
        population: int = 100,
        generations: int = 100,
        max_nodes_per_job: int = 16,
        interference_avoidance: bool = True,
        *,
        patience: int | None = 5,
        patience_work: int = 2000,
        greedy_seed: bool = True,
        dense_limit: int = 4_000_000,
        local_search_iters: int = 12,
        local_search_iters_large: int = 4,
        local_search_fraction: float = 0.1,
        local_search_max_jobs: int = 32,
        local_search_starts: int = 1,
        keep_large: int = 4,
        table_cache: int = 2048,
    ) -> None:
        if not math.isfinite(p):
            raise ValueError(f"p: must be finite, got {p!r}")
        if restart_penalty_s < 0 or not math.isfinite(restart_penalty_s):
            raise ValueError(f"restart_penalty_s: must be finite and >= 0, got {restart_penalty_s!r}")
        if population < 2:
            raise ValueError(f"population: must be >= 2, got {population!r}")
        if generations < 0:
            raise ValueError(f"generations: must be >= 0, got {generations!r}")
        if max_nodes_per_job < 1:
            raise ValueError(f"max_nodes_per_job: must be >= 1, got {max_nodes_per_job!r}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience: must be >= 1 or None, got {patience!r}")
        self.p = float(p)
        self.restart_penalty_s = float(restart_penalty_s)
        self.population = int(population)
        self.generations = int(generations)
        self.max_nodes_per_job = int(max_nodes_per_job)
        self.interference_avoidance = bool(interference_avoidance)
        self.patience = patience
        self.patience_work = int(patience_work)
        self.greedy_seed = bool(greedy_seed)
        self.dense_limit = int(dense_limit)
        self.local_search_iters = int(local_search_iters)
        self.local_search_iters_large = int(local_search_iters_large)
        self.local_search_fraction = float(local_search_fraction)
        self.local_search_max_jobs = int(local_search_max_jobs)
        self.local_search_starts = max(int(local_search_starts), 1)
        self.keep_large = max(int(keep_large), 1)
        self.table_cache_size = max(int(table_cache), 0)
        self._tables: OrderedDict = OrderedDict()

    def problem(self, jobs: Sequence[JobView], cluster: Cluster,
                allocation: Mapping[str, Mapping[str, int]]) -> PolluxProblem:
        """This round's search problem (tables, constraints, objective) for the given inputs."""
        return PolluxProblem(
            jobs, cluster, allocation, p=self.p, restart_penalty_s=self.restart_penalty_s,
            max_nodes_per_job=self.max_nodes_per_job, interference_avoidance=self.interference_avoidance,
            table_cache=self._tables, cache_size=self.table_cache_size,
        )

    @one_blas_thread
    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        allocation: Allocation,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        prob = self.problem(jobs, cluster, allocation)
        if prob.num_jobs == 0 or prob.num_nodes == 0:
            out_state = prob.encode(np.zeros((prob.num_jobs, 0, prob.num_nodes), dtype=np.float32))
            out_state.update(fitness=1.0, generations=0, search="none")
            return {}, out_state
        cells = prob.num_jobs * prob.num_nodes
        dense = self.population * cells <= self.dense_limit
        carried = prob.repair(prob.remap(state, self.population if dense else self.keep_large))
        current = prob.repair_one(prob.cur)
        found: list[np.ndarray] = []
        if self.greedy_seed or not dense:
            found = self._greedy_search(prob, current, carried, dense, rng)
        if dense:
            seeds = np.concatenate([prob.stack([*found, current]), carried], axis=1)
            patience = self.patience
            if patience is not None and self.greedy_seed:
                # Small problems get more patience: their generations are cheap (but a handful of
                # jobs has little to recombine).
                extra = min(self.generations, self.patience_work // max(cells, 1), 10 * prob.num_jobs)
                patience = max(patience, extra)
            pop, fit, raw, gens = prob.genetic(seeds, rng, self.population, self.generations, patience)
            search = "genetic"
        else:
            pop = np.concatenate([prob.stack([*found, current]), carried], axis=1)
            fit, raw = prob.evaluate(pop)
            pop, fit, raw = prob.select(pop, fit, raw, self.keep_large)
            gens = 0
            search = "greedy"
        best = prob.unstack(pop, 0)
        if not prob.feasible(best):          # never expected; a guarantee all the same
            best = prob.repair_one(best)
            search += "+repair"
        out_state = prob.encode(pop)
        out_state.update(fitness=prob.fitness(best), generations=int(gens), search=search)
        return prob.to_allocation(best), out_state

    def _greedy_search(self, prob: PolluxProblem, current: np.ndarray, carried: np.ndarray, dense: bool,
                       rng: np.random.Generator) -> list[np.ndarray]:
        """Greedy fills and the local search; their results, best-found first."""
        starts = [current, prob.repair_one(np.where(prob.pinned[:, None], prob.cur, 0))]
        if carried.shape[1]:
            cf, cr = prob.evaluate(carried)
            starts.append(prob.unstack(carried, int(np.lexsort((-cr, -cf))[0])))
        found = [prob.greedy(x) for x in starts]
        if dense:
            # The same two starts packing single-node jobs loosely (most room first), for variety.
            found += [prob.greedy(x, loose=True) for x in starts[:2]]
        ranked = sorted(range(len(found)), key=lambda i: prob.fitness_pair(found[i]), reverse=True)
        tops: list[np.ndarray] = []
        for i in ranked:
            if len(tops) < self.local_search_starts and not any(np.array_equal(found[i], t) for t in tops):
                tops.append(found[i])
        iters = self.local_search_iters if dense else self.local_search_iters_large
        iters = min(iters, 4 * int(prob.movable.sum()))        # a few jobs: few distinct moves
        for t in tops:
            improved, _, _ = prob.local_search(t, rng, iters, self.local_search_fraction,
                                               self.local_search_max_jobs,
                                               self.local_search_max_jobs if dense else 0)
            found.insert(0, improved)
        return found
