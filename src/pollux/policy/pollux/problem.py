"""The Pollux search problem (SPEC §5): one round's jobs in priority order, and the objective over them.

A :class:`PolluxProblem` joins the round's parts, each in its own module: the speedup tables and the one
lookup into them (:mod:`.tables`), the hard constraints with feasibility and repair
(:mod:`.constraints`), and the population layout with the carried population's codec
(:mod:`.population`). It holds what they share (the jobs in priority order, their current rows and
limits) and the objective itself: the re-allocation penalty, evaluation and fitness.

The searches are functions over a :class:`PolluxProblem` (:mod:`.fill`, :mod:`.local`, and the generic
:func:`pollux.policy.genetic.genetic_search`, whose :class:`~pollux.policy.genetic.GeneticProblem`
protocol this class satisfies). Matrices are ``(jobs, nodes)`` integer arrays in the problem's job
order :attr:`PolluxProblem.job_ids` and the cluster's node order; populations are float32
``(jobs, individuals, nodes)`` arrays of whole numbers.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from pollux.policy import genetic
from pollux.policy.base import (
    Allocation,
    Cluster,
    JobView,
    PolicyState,
    from_matrix,
    restart_factors,
)
from pollux.policy.genetic import row_sums
from pollux.policy.pollux.constraints import Constraints, replica_cap
from pollux.policy.pollux.population import PopulationCodec, row_counts
from pollux.policy.pollux.tables import SpeedupTables, table_sizes

#: Added to every speedup before the power mean (SPEC §5, ref), so a job without GPUs weighs heavily.
SPEEDUP_EPS = 1e-3


def _utility(s: np.ndarray, p: float) -> np.ndarray:
    """Per-job term whose sum is monotone in FITNESS_p: maximising Σ u(s_j) maximises the fitness."""
    x = np.asarray(s, dtype=np.float64) + SPEEDUP_EPS
    if p == 0.0:
        return np.log(x)
    if p < 0.0:
        return -(x**p)
    return x**p


def scalar_utility(s: float, p: float) -> float:
    """:func:`_utility` of one speedup in plain floats (the greedy's fast path): the same value for
    the default p = −1 (a division either way), within rounding of the last bit otherwise."""
    x = s + SPEEDUP_EPS
    if p == 0.0:
        return math.log(x)
    if p == -1.0:
        return -1.0 / x
    if p < 0.0:
        return -(x**p)
    return x**p


def _power_mean(s: np.ndarray, p: float, absent: int = 0) -> np.ndarray:
    """FITNESS_p along the last axis (the job axis); p = 0 is the geometric mean.

    ``absent`` more jobs of the round, left out of ``s`` (:mod:`.prune`), count with speedup 0.
    With none, each mean is the sum over the axis divided by its length, exactly as ``mean``."""
    x = s + SPEEDUP_EPS
    count = s.shape[-1] + absent
    if p == 0.0:
        return np.exp((np.log(x).sum(axis=-1) + absent * np.log(SPEEDUP_EPS)) / count)
    if p == -1.0:
        return 1.0 / (((1.0 / x).sum(axis=-1) + absent / SPEEDUP_EPS) / count)
    return (((x**p).sum(axis=-1) + absent * SPEEDUP_EPS**p) / count) ** (1.0 / p)


class PolluxProblem:
    """One round's search problem: jobs in priority order, speedup tables, constraints, objective.

    Built by :meth:`pollux.policy.pollux.PolluxPolicy.problem`. :meth:`evaluate` is the objective of a
    population, :meth:`fitness` of one matrix; :meth:`repair` makes any population feasible. The
    tables are :attr:`tables` (:class:`~.tables.SpeedupTables`), the hard constraints
    :attr:`constraints` (:class:`~.constraints.Constraints`), the population layout and its carried
    form :attr:`codec` (:class:`~.population.PopulationCodec`); the methods below delegate to them,
    so that a search needs only the problem.
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
        round_jobs: int | None = None,
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
        #: Jobs of the round left out of this problem (:mod:`.prune`): they hold nothing, count in the
        #: fair share, and weigh in the fitness with speedup 0.
        self.absent = 0 if round_jobs is None else int(round_jobs) - num_jobs
        if self.absent < 0:
            raise ValueError(f"round_jobs: {round_jobs} is fewer than the {num_jobs} jobs given")
        self.num_nodes = num_nodes
        self.cur = raw_cur[self.order] if num_jobs else raw_cur
        self.pinned = pinned[self.order] if num_jobs else pinned
        self.min_replicas = np.array([max(int(job.min_replicas), 0) for job in self.jobs], dtype=np.int64)

        # Penalty factor of a job whose row changes.
        self.pen = restart_factors(self.jobs, restart_penalty_s)

        # Replica caps: the exploration cap, within the cluster and what max_nodes full nodes hold.
        node_limit = min(self.max_nodes, num_nodes) * self.gpn
        self.max_replicas = np.zeros(num_jobs, dtype=np.int64)
        for j, job in enumerate(self.jobs):
            self.max_replicas[j] = max(min(replica_cap(job), self.total_gpus, node_limit), 0)
        self.movable = ~self.pinned & (self.max_replicas >= np.maximum(self.min_replicas, 1))

        sizes = table_sizes(self.max_replicas, self.pinned, self.cur, self.max_nodes, num_nodes)
        self.tables = SpeedupTables(self.jobs, cluster, sizes, table_cache, cache_size,
                                    round_jobs=num_jobs + self.absent)
        self.constraints = Constraints(
            cur=self.cur, pinned=self.pinned, cap=cap, min_replicas=self.min_replicas,
            max_replicas=self.max_replicas, max_nodes=self.max_nodes, interference=self.interference,
        )
        self.codec = PopulationCodec(self.job_ids, cluster, self.gpn)
        #: The greedy fills already made on this problem, by (matrix bytes, loose): see
        #: :func:`pollux.policy.pollux.fill.greedy`.
        self.fills: dict[tuple[bytes, bool], np.ndarray] = {}
        self._top_utility: list[float] | None = None

    # ----------------------------------------------------------------------------------------
    # Objective. Populations are float32 arrays (jobs, population, nodes) of whole numbers: this
    # layout makes every per-node and per-job reduction a small matrix product and every prefix sum
    # over jobs a loop of contiguous vector additions.
    # ----------------------------------------------------------------------------------------

    def lookup(self, jobs: np.ndarray | int, nodes: np.ndarray | int,
               replicas: np.ndarray | int) -> np.ndarray:
        """SPEEDUP of ``jobs`` (indices, broadcast with the counts) on ``nodes`` nodes and ``replicas``
        GPUs: the one lookup into the speedup tables (counts beyond a table read its last entry)."""
        return self.tables.lookup(jobs, nodes, replicas)

    def _pop_speedups(self, pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unpenalised speedups ``(jobs, population)`` and whether each row differs from the current."""
        r = np.rint(row_sums(pop)).astype(np.int64)
        n = np.rint(row_counts(pop > 0)).astype(np.int64)
        s = self.lookup(np.arange(self.num_jobs)[:, None], n, r)
        return s, row_counts(pop != self.constraints.cur32[:, None, :]) > 0

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
        return _power_mean(pen.T, self.p, self.absent), _power_mean(s.T, self.p, self.absent)

    def matrix_speedups(self, matrix: np.ndarray, penalised: bool = True) -> np.ndarray:
        """Per-job speedups of one ``(jobs, nodes)`` integer matrix."""
        a = np.asarray(matrix)
        s = self.lookup(np.arange(self.num_jobs), np.count_nonzero(a, axis=1), a.sum(axis=1))
        return self._penalised(a, s) if penalised else s

    def _penalised(self, a: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Unpenalised per-job speedups ``s`` of matrix ``a``, times the re-allocation penalty factor
        where a job's row differs from its current one."""
        changed = (a != self.cur).any(axis=1)
        return np.where(changed, s * self.pen, s)

    def speedup_at(self, j: int, nodes: int, replicas: int, changed: bool) -> float:
        """Speedup of job ``j`` on ``replicas`` GPUs over ``nodes`` nodes, penalised when its row
        ``changed`` from the current one."""
        # The table entry read from the job's Python lists (the greedy's fast path; the same value
        # as ``lookup``).
        rows, _ = self.tables.as_lists(j)
        s = rows[min(nodes, self.tables.nt_max)][min(replicas, self.tables.rt_max)]
        return s * float(self.pen[j]) if changed else s

    def top_utility(self) -> list[float]:
        """Per job, the objective term of the best speedup its table holds, penalised: no growth of
        the job can gain more (the greedy's bound). Computed once per problem."""
        if self._top_utility is None:
            best = self.tables.best_any_nodes.max(axis=1, initial=0.0) * self.pen
            self._top_utility = _utility(best, self.p).tolist()
        return self._top_utility

    def fitness(self, matrix: np.ndarray) -> float:
        """FITNESS_p of one ``(jobs, nodes)`` matrix."""
        if self.num_jobs == 0:
            return 1.0
        return float(_power_mean(self.matrix_speedups(matrix), self.p, self.absent))

    def fitness_pair(self, matrix: np.ndarray) -> tuple[float, float]:
        """(FITNESS_p, unpenalised FITNESS_p) of one matrix: the order of the genetic selection."""
        if self.num_jobs == 0:
            return 1.0, 1.0
        raw = self.matrix_speedups(matrix, penalised=False)
        penalised = self._penalised(np.asarray(matrix), raw)        # one table lookup for both
        return (float(_power_mean(penalised, self.p, self.absent)),
                float(_power_mean(raw, self.p, self.absent)))

    def to_allocation(self, matrix: np.ndarray) -> Allocation:
        """The allocation of one ``(jobs, nodes)`` matrix, keyed by job and node ids."""
        return from_matrix(np.asarray(matrix), self.job_ids, self.cluster)

    # ----------------------------------------------------------------------------------------
    # The genetic search's protocol (pollux.policy.genetic.GeneticProblem)
    # ----------------------------------------------------------------------------------------

    def keys(self, pop: np.ndarray) -> np.ndarray:
        """One bytes key per individual, for exact duplicate detection."""
        return self.codec.keys(pop)

    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SPEC §5 mutation (:func:`pollux.policy.genetic.mutate_allocation`); in place."""
        return genetic.mutate_allocation(pop, rng, self.constraints.cur32, self.constraints.cap32,
                                         self.constraints.growth_limit32)

    def repair(self, pop: np.ndarray) -> np.ndarray:
        """Feasible copy of a population ``(jobs, population, nodes)``, by the SPEC §5 repair order
        (:meth:`.constraints.Constraints.repair`)."""
        return self.constraints.repair(pop)

    # ----------------------------------------------------------------------------------------
    # Constraints of one matrix (pollux.policy.pollux.constraints)
    # ----------------------------------------------------------------------------------------

    def repair_one(self, matrix: np.ndarray) -> np.ndarray:
        """Feasible int64 copy of one ``(jobs, nodes)`` matrix."""
        return self.unstack(self.repair(self.stack([matrix])), 0)

    def feasible(self, matrix: np.ndarray) -> bool:
        """Whether one matrix meets every hard constraint (capacity, interference, caps, minimum
        replicas, node count, pinned rows)."""
        return self.constraints.feasible(matrix)

    def owners(self, a: np.ndarray) -> np.ndarray:
        """Per node, the distributed job on it (-1 when none); the first one wins on a conflict."""
        return self.constraints.owners(a)

    # ----------------------------------------------------------------------------------------
    # Population layout and the carried state (pollux.policy.pollux.population)
    # ----------------------------------------------------------------------------------------

    def stack(self, matrices: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        """Population ``(jobs, len, nodes)`` float32 of ``(jobs, nodes)`` matrices."""
        return self.codec.stack(matrices)

    def unstack(self, pop: np.ndarray, i: int) -> np.ndarray:
        """Individual ``i`` of a population as an int64 ``(jobs, nodes)`` matrix."""
        return self.codec.unstack(pop, i)

    def remap(self, state: PolicyState | None, limit: int) -> np.ndarray:
        """Up to ``limit`` individuals ``(jobs, k, nodes)`` of a carried population, on this round's
        jobs and nodes (rows of departed jobs and columns of departed nodes dropped; new jobs get 0)."""
        return self.codec.remap(state, limit)

    def encode(self, pop: np.ndarray) -> dict[str, Any]:
        """Sparse, id-keyed form of a population ``(jobs, k, nodes)`` for the policy state."""
        return self.codec.encode(pop)
