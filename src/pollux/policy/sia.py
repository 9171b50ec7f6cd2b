"""Sia: heterogeneity-aware goodput scheduling by a mixed-integer program (issue 13; SPEC §10).

Every round, for every job at most one configuration (GPU type t, GPU count n) is chosen by a
mixed-integer program solved by HiGHS (:mod:`.binary_program`), then the chosen counts are
placed on nodes of their type.

The program, over binary ``x[j, c]`` (job j takes configuration c of :mod:`.sia_configs`)::

    minimise    Σ_j Σ_c x[j,c] · cost[j,c]  +  Σ_j (1 − Σ_c x[j,c]) · idle_cost[j]
    subject to  Σ_c x[j,c] ≤ 1                               (one configuration per job)
                Σ_{j, c of type t} n_c · x[j,c] ≤ free_t       (GPUs per type)

``cost = (G · f)^p`` (p = −0.5: the power-mean utility of the Pollux problem, normalised goodput G,
re-allocation factor f on changed configurations) plus λ_a on the changed configurations of a
running job, and ``idle_cost = λ_n ×`` the dearest of the job's cheapest configurations
(λ_n = 3 by default, see :data:`LAMBDA_N`), so leaving a job out is always worse than running it
somewhere, and worse than shrinking a job that holds more than its fewest GPUs — see
:mod:`.sia_configs`. λ_a trades a little JCT for fewer restarts; by default it is Sia's 0.01 on a
one-type cluster and 0.07 on a cluster of several types, where moves between types add restarts
(measurements at :data:`LAMBDA_A_MIXED`). Min/max replicas, the exploration cap and rigid jobs are
encoded in which configurations exist; pinned jobs (not preemptible and running) keep their GPUs
exactly and are taken off the capacity first. The program is solved to optimality
(``mip_rel_gap``); an optimum is checked against brute force in ``tests/test_policy_sia.py``.
A program of more than :data:`REDUCE_ABOVE` columns (a large cluster, or many waiting jobs) is first
cut down to the columns a Lagrangian bound leaves possible, which keeps the optimum
(:mod:`.sia_lagrange`).
HiGHS runs without its LP presolve and without its feasibility-jump heuristic: on these
multiple-choice knapsacks it was faster without either (:func:`solve`). When far more jobs wait than
GPUs are free, the columns no optimum needs are dropped first (:mod:`.sia_prune`: per configuration
only the best ``F − n + 1`` jobs, F the free GPUs), which keeps the optimal value exactly.
(HiGHS 1.12 may print a stray ``HighsMipSolverData::transformNewIntegerFeasibleSolution`` line
to stdout, an upstream debug print, ERGO-Code/HiGHS#2783; it does not affect the result.)

Placement (per type, nodes of that type only): jobs whose configuration is unchanged keep their
nodes; the others, largest first, go on one node when they fit one (the fullest node that fits,
to keep whole nodes free). A count of at most one node's GPUs goes on one node whenever one has room — the
program valued it on one node (a 4-GPU job split 2 + 2 over two T4 nodes syncs across nodes and
blocks both nodes for other distributed jobs); larger counts are packed on the fewest nodes that
hold no other distributed job (at most one distributed job per node, SPEC §5). A chosen count
that cannot be placed so because the free GPUs of its type are fragmented (listed in the state's
``fallbacks``) falls back to the cheapest, by the program's own cost, of what can be placed: the
job's current allocation (when it is on that type and still fits as it is: no restart), the chosen
count packed over several nodes free of other distributed jobs (valued with the goodput on that
many nodes, so a job that syncs slowly across nodes stays where it is), and the job's next smaller
candidate count on one node; no GPUs if none fits.

Measured (seed 0, the 8 pollux-osdi21 workloads on 16 x 4; mean average JCT / restarts per job):
λ_n 1.1 2728 s / 2.91 → λ_n 3 2717 s / 2.92 (λ_n 10: the same as 3); + keeping the current
allocation on a fallback 2716 s / 2.85; + one-node placement of one-node counts 2717 s / 2.77;
+ exploration factor 4 (:data:`EXPLORE_FACTOR`) 2665 s / 2.39; + the simulator's bootstrap on the
untyped cluster, a bootstrapped job counting one GPU as seen (:mod:`pollux.sim.job`: its first
allocation may reach 4 GPUs instead of growing 1 → 4 by a restart) 2652 s / 1.96 (8 held-out
workloads: 2669 s / 2.36 measured on 2026-11-24 → 2642 s / 1.88). Tried after that and not
adopted: a second program over the jobs whose chosen count could not be placed, on the GPUs left
(fallbacks 520 → 18 in the 8 runs; 2642 s on the 8 workloads, but 2654 s against 2642 s on the
held-out ones). The cheapest-option fallback above (it used to take the current allocation, else
the next smaller count, never a split): 2652 s / 1.96 → 2644 s / 2.04 on the 8 workloads, 2642 s /
1.88 → 2639 s on the 8 held-out ones; the common case was a 2-GPU job chosen for 4 with no node
holding 4 free, which kept its 2 while 2–10 GPUs stayed idle (workload-2: 154 of 163 fallbacks).
With λ_n = 1.1, workload-2 had 252 job-rounds of jobs waiting behind 2-GPU jobs (ncf p99 JCT
949 s against Pollux's 128 s): admitting a job at 1 GPU gained only (λ_n − 1) × its cost, while
shrinking a 2-GPU job to make room cost about three times that; with λ_n = 3, none waited.
75 of 76 fallbacks in that run ended at the job's current count, placed afresh (a restart).
Tried and rejected (same runs, with λ_n = 3): every count 1..cap instead of 1, 2, 4, then whole
nodes (2843 s / 4.07: more small moves, more restarts), adding 3, 6, 12, 24, … (2798 s / 3.72),
normalising by the fair-share goodput as Pollux does (2727 s / 3.11), λ_a = 0 (2731 s / 3.29),
λ_a = 0.005 (2716 s / 2.87, final placement), δ = 60 s (2776 s / 2.57), no restart factor for a job
without GPUs as Sia's artifact (no change). δ = 20 s gave 2697 s / 2.93 but is not the simulator's
30 s restart delay, so δ stays 30 s. On the sia-sosp23 cluster (benchmarks/heterogeneous.py, all 8
workloads) the changes give 0.575 h mean average JCT and 2.80 restarts per job (before: 0.575 h,
2.94), and the exploration factor 4 0.552 h and 2.64. With factor 4, λ_a 0.005 / 0.02 gave 2663 /
2664 s (2.51 / 2.21 restarts): no constant here is tuned further to these workloads (SPEC §7 asks not to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits
from pollux.goodput.threads import one_blas_thread
from pollux.policy.base import Allocation, Cluster, JobView, PolicyState
from pollux.policy.binary_program import BinarySolution, solve_binary
from pollux.policy.placement import place_packed
from pollux.policy.sia_configs import ConfigTable, build_configs, check_options, config_cost
from pollux.policy.sia_goodput import GoodputCache
from pollux.policy.sia_job_rows import RowMemo
from pollux.policy.sia_lagrange import program_matrix, solve_reduced
from pollux.policy.sia_prune import needed_columns

#: Version tag of the (diagnostic) state this policy returns.
STATE_VERSION = 1
#: Default λ_a on a one-type cluster and on a cluster of several types (measured, seed 0: on the 8
#: pollux-osdi21 workloads, 16 x 4, λ_a 0 / 0.01 / 0.02 / 0.05 gave mean average JCT 2739 / 2728 /
#: 2745 / 2829 s and 3.34 / 2.91 / 2.74 / 2.29 restarts per job; on sia-sosp23 Philly workloads 1-3,
#: aws:6x4,rtx:3x8,dgx-ext:2x8, λ_a 0.01 / 0.05 / 0.07 / 0.1 gave 1844 / 1905 / 2003 (w1-4) / 1980 s
#: and 3.81 / 3.14 / 2.91 (w1-4) / 2.50 restarts per job — type moves add restarts there).
LAMBDA_A_ONE_TYPE = 0.01
LAMBDA_A_MIXED = 0.07
#: Default exploration cap factor: a job may get up to this multiple of the most GPUs it has held
#: (SPEC §3's rule with 2 for Pollux). Measured (seed 0): on the 8 pollux-osdi21 workloads, 16 x 4,
#: factor 2 / 3 / 4 / 8 / none gave mean average JCT 2717 / 2700 / 2665 / 2709 / 2703 s and 2.77 /
#: 2.75 / 2.39 / 2.59 / 2.50 restarts per job; on the 8 sia-sosp23 Philly workloads
#: (aws:6x4,rtx:3x8,dgx-ext:2x8) factor 2 / 4 gave 0.575 / 0.552 h and 2.80 / 2.64 restarts per
#: job. A job that grows 1 → 4 → 16 restarts twice where 1 → 2 → 4 → 8 → 16 restarts four times;
#: 4 only while a job has held at most 1 GPU gave 2689 s, only after it had held 2 or more 2733 s.
#: On 8 held-out workloads (the same trace, seeds 101-108; docs/benchmarks.md) factor 2 / 4 gave
#: 2731 / 2669 s and 2.76 / 2.36 restarts per job, factor 4 better on each workload.
EXPLORE_FACTOR = 4
#: Default λ_n (Sia's is 1.1 on its flat idle cost; measurements in the module docstring). With
#: ``idle_cost = λ_n × cost of the fewest GPUs``, λ_n = 1.1 let jobs wait behind jobs holding two
#: GPUs each; λ_n ≥ 3 makes admitting a waiting job worth more than the restart of a job shrunk
#: for it, as Pollux's power mean does (a job without GPUs has speedup 0 there).
LAMBDA_N = 3.0
#: Programs of more columns than this go through the Lagrangian reduction (:mod:`.sia_lagrange`).
#: Below it HiGHS alone is faster: on the 2,399 programs of the 960-job Philly run (at most 730
#: columns) the reduction took 34 s against 14 s and chose the same in all but one (the same value);
#: first rounds of about 1,050 columns took 0.004–0.36 s either way, and from 1,931 columns on it
#: was faster (1.39 → 0.16 s at 512 GPUs × 100 jobs, 18 → 0.27 s at 4,096 × 1,000).
REDUCE_ABOVE = 1_500


def priority_key(job: JobView, pinned: bool) -> tuple[bool, float, float, str]:
    """Pollux's priority: pinned, then least attained service, then submission time, then id."""
    return (not pinned, float(job.attained_service), float(job.submit_time), job.id)


def solve(table: ConfigTable, free_by_type: np.ndarray, *, mip_rel_gap: float = 1e-7,
          time_limit_s: float = 30.0, reduce_above: int = REDUCE_ABOVE) -> tuple[np.ndarray, float, int]:
    """Solve the program of one round: (chosen configuration per job or −1, objective, status).

    The objective returned includes the idle costs (the constant ``Σ idle_cost`` is added back),
    so it is comparable with a brute-force sum over jobs. A program of more than ``reduce_above``
    columns is first cut down by a Lagrangian bound (:mod:`.sia_lagrange`).
    """
    num_jobs = len(table.job_ids)
    choice = np.full(num_jobs, -1, dtype=np.int64)
    base = float(table.idle_cost.sum())
    k = table.size
    if k == 0:
        return choice, base, 0
    c = table.cost - table.idle_cost[table.job]
    # Only the columns an optimum needs (:mod:`.sia_prune`); a job left with none stays idle.
    keep = needed_columns(table.gtype, table.count, table.job, c, int(free_by_type.sum()))
    if keep.size == 0:
        return choice, base, 0
    job_row = np.unique(table.job[keep], return_inverse=True)[1]
    if keep.size > reduce_above:
        res = solve_reduced(c[keep], table.gtype[keep], table.count[keep], job_row, free_by_type,
                            mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s)
    else:
        res = solve_whole(c[keep], table.gtype[keep], table.count[keep], job_row, free_by_type,
                          mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s)
    if res.x is None:                       # nothing found (time limit before a first solution)
        return choice, base, res.status
    chosen = keep[np.flatnonzero(np.rint(res.x).astype(bool))]
    choice[table.job[chosen]] = chosen
    return choice, float(base + c[chosen].sum()), res.status


def solve_whole(cost: np.ndarray, gtype: np.ndarray, count: np.ndarray, job_row: np.ndarray,
                free_by_type: np.ndarray, *, mip_rel_gap: float, time_limit_s: float) -> BinarySolution:
    """The program as it is, by HiGHS (``job_row``: each column's job, 0, 1, …)."""
    num_rows = int(job_row.max()) + 1
    a = program_matrix(job_row, num_rows, gtype, count, free_by_type.size)
    ub = np.concatenate([np.ones(num_rows), free_by_type.astype(np.float64)])
    # Without HiGHS's feasibility-jump heuristic: it runs on a fixed budget of moves, ~11 ms a
    # program however small, and on these knapsacks the search finds the optimum without it (all
    # 2,375 programs of the 960-job Philly run chose the same; solve 20.3 → 12.8 s). The linear
    # relaxation first: it was integral in 2,216 of the 2,399 programs of that run (the same
    # choice as the branch and bound's in all of them), at a third of the branch and bound's time.
    return solve_binary(cost, a, ub, mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s,
                        feasibility_jump=False, relaxation_first=True)


def objective(table: ConfigTable, choice: np.ndarray) -> float:
    """The program's objective of a choice (configuration index per job, −1 for none)."""
    on = choice >= 0
    return float(table.cost[choice[on]].sum() + table.idle_cost[~on].sum())


class _Nodes:
    """Free GPUs and distributed-job owners of the nodes while one round's choices are placed."""

    def __init__(self, cluster: Cluster, pinned_rows: np.ndarray) -> None:
        self.cap = cluster.capacity()
        self.free = self.cap - pinned_rows.sum(axis=0)
        self.owner = np.full(cluster.num_nodes, -1, dtype=np.int64)
        self.type_of = cluster.type_index()
        for j in np.flatnonzero(np.count_nonzero(pinned_rows, axis=1) > 1):
            self.owner[pinned_rows[j] > 0] = -2 - j        # pinned distributed jobs own their nodes

    def take(self, row: np.ndarray, tag: int) -> None:
        self.free -= row
        if np.count_nonzero(row) > 1:
            self.owner[row > 0] = tag

    def fits_as_is(self, row: np.ndarray, tag: int) -> bool:
        if (row > self.free).any():
            return False
        if np.count_nonzero(row) > 1:
            held = self.owner[row > 0]
            return bool(((held == -1) | (held == tag)).all())
        return True

    def place(self, t: int, n: int) -> np.ndarray | None:
        """GPUs per node for ``n`` GPUs on type ``t``: the fullest single node that fits; else, for
        more GPUs than one node of the type holds, packed on the fewest nodes free of other
        distributed jobs; None if neither works (a one-node count is never split over nodes)."""
        mine = self.type_of == t
        fit = np.flatnonzero(mine & (self.free >= n))
        row = np.zeros_like(self.free)
        if fit.size:
            node = int(fit[np.argmin(self.free[fit])])          # first minimum: lowest index
            row[node] = n
            return row
        if n <= int(self.cap[mine].max(initial=0)):
            return None
        ok = mine & (self.owner == -1)
        packed = place_packed(n, np.where(ok, self.free, 0))
        return packed


class SiaPolicy:
    """Heterogeneity-aware goodput scheduling: a (type, count) per job by a MILP, then placement.

    Parameters
    ----------
    p: fairness power of the per-job utility (−0.5 as Sia; must be non-zero).
    lambda_n: the cost of leaving a job without GPUs, as a multiple of its worst configuration's
        cost (> 1; :data:`LAMBDA_N` = 3 by default, Sia's 1.1 let jobs wait while others held
        more than their fewest GPUs).
    restart_penalty_s: δ of the re-allocation factor ``(T − R·δ)/(T + δ)`` (SPEC §5).
    min_factor: floor of that factor, so a brand-new job still ranks its configurations.
    lambda_a: flat cost of changing a running job's configuration or stopping it (Sia's λ_a);
        None: :data:`LAMBDA_A_ONE_TYPE` on a one-type cluster, :data:`LAMBDA_A_MIXED` otherwise.
    rigid_fixed: give every job exactly its ``fixed`` replicas (TunedJobs-style rigid jobs; the
        simulator and the service fill ``fixed`` for every job, so it cannot mark rigidity by
        itself). Without it a job is rigid when ``min_replicas == max_replicas``.
    explore_factor: the exploration cap's multiple of the most GPUs a job has held (SPEC §3 uses 2
        for Pollux; :data:`EXPLORE_FACTOR` = 4 by default, measured there).
    mip_rel_gap, time_limit_s: HiGHS options (the gap is tight enough to return the optimum).
    reduce_above: programs of more columns than this are cut down by a Lagrangian bound first
        (:data:`REDUCE_ABOVE`; the optimal value is kept, see :mod:`.sia_lagrange`).
    cache: how many goodput arrays to memoise across rounds (a pure function of their key), and
        how many jobs' rows of the configuration table (:mod:`.sia_job_rows`: most jobs are
        unchanged from one round to the next; the table is the same as without the memo).

    ``decide`` returns the allocation and a JSON state of diagnostics (objective, solver status,
    the chosen configuration per job, the jobs whose count fell back at placement); the policy
    reads nothing from it, since the current configuration is in the job views.
    """

    name = "sia"

    def __init__(self, p: float = -0.5, lambda_n: float = LAMBDA_N, restart_penalty_s: float = 30.0,
                 min_factor: float = 0.1, *, lambda_a: float | None = None, rigid_fixed: bool = False,
                 explore_factor: int = EXPLORE_FACTOR, mip_rel_gap: float = 1e-7, time_limit_s: float = 30.0,
                 cache: int = 4096, reduce_above: int = REDUCE_ABOVE) -> None:
        check_options(float(p), float(lambda_n), float(restart_penalty_s), float(min_factor))
        self.p = float(p)
        self.lambda_n = float(lambda_n)
        self.restart_penalty_s = float(restart_penalty_s)
        self.min_factor = float(min_factor)
        self.rigid_fixed = bool(rigid_fixed)
        if lambda_a is not None and not 0.0 <= lambda_a < float("inf"):
            raise ValueError(f"lambda_a: must be finite and >= 0 (or None), got {lambda_a!r}")
        self.lambda_a = None if lambda_a is None else float(lambda_a)
        if isinstance(explore_factor, bool) or not isinstance(explore_factor, int) or explore_factor < 1:
            raise ValueError(f"explore_factor: must be an integer >= 1, got {explore_factor!r}")
        self.explore_factor = int(explore_factor)
        self.mip_rel_gap = float(mip_rel_gap)
        self.time_limit_s = float(time_limit_s)
        if isinstance(reduce_above, bool) or not isinstance(reduce_above, int) or reduce_above < 0:
            raise ValueError(f"reduce_above: must be an integer >= 0, got {reduce_above!r}")
        self.reduce_above = reduce_above
        self._cache = GoodputCache(cache)
        self._rows = RowMemo(cache)

    def table(self, jobs: Sequence[JobView], cluster: Cluster,
              free_by_type: np.ndarray) -> ConfigTable:
        """This round's configurations of ``jobs`` (in the given order; no pinned jobs)."""
        return build_configs(jobs, cluster, free_by_type, p=self.p, lambda_n=self.lambda_n,
                             restart_penalty_s=self.restart_penalty_s, min_factor=self.min_factor,
                             rigid_fixed=self.rigid_fixed, cache=self._cache,
                             lambda_a=self.lambda_a_for(cluster), explore_factor=self.explore_factor,
                             memo=self._rows)

    def lambda_a_for(self, cluster: Cluster) -> float:
        """λ_a on ``cluster``: the option, or the default for one type or several."""
        if self.lambda_a is not None:
            return self.lambda_a
        return LAMBDA_A_MIXED if cluster.heterogeneous else LAMBDA_A_ONE_TYPE

    @one_blas_thread
    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        out_state: dict[str, Any] = {"version": STATE_VERSION, "objective": 0.0, "status": 0,
                                     "configs": {}, "fallbacks": []}
        if not jobs or cluster.num_nodes == 0 or cluster.total_gpus == 0:
            return {}, out_state
        idx = cluster.index()
        rows = np.zeros((len(jobs), cluster.num_nodes), dtype=np.int64)
        for i, job in enumerate(jobs):
            for node, g in job.allocation.items():
                if node in idx and g > 0:
                    rows[i, idx[node]] += int(g)
        pinned = np.array([not job.preemptible for job in jobs]) & (rows.sum(axis=1) > 0)
        order = sorted(range(len(jobs)), key=lambda i: priority_key(jobs[i], bool(pinned[i])))
        nodes = _Nodes(cluster, rows[pinned])
        alloc: Allocation = {}
        for i in order:
            if pinned[i]:
                alloc[jobs[i].id] = {cluster.nodes[n]: int(rows[i, n]) for n in np.flatnonzero(rows[i])}
        free_by_type = np.bincount(nodes.type_of, weights=np.maximum(nodes.free, 0),
                                   minlength=len(cluster.type_names)).astype(np.int64)
        movable = [i for i in order if not pinned[i]]
        table = self.table([jobs[i] for i in movable], cluster, free_by_type)
        choice, value, status = solve(table, free_by_type, mip_rel_gap=self.mip_rel_gap,
                                      time_limit_s=self.time_limit_s, reduce_above=self.reduce_above)
        fallbacks = self._place(table, choice, [jobs[i] for i in movable], rows[movable], nodes,
                                cluster, alloc)
        out_state["objective"] = value
        out_state["status"] = status
        out_state["configs"] = {table.job_ids[j]: [table.types[int(table.gtype[c])], int(table.count[c])]
                                for j, c in enumerate(choice) if c >= 0}
        out_state["fallbacks"] = fallbacks
        return alloc, out_state

    def _place(self, table: ConfigTable, choice: np.ndarray, jobs: Sequence[JobView], cur: np.ndarray,
               nodes: _Nodes, cluster: Cluster, alloc: Allocation) -> list[str]:
        """Place the chosen configurations into ``alloc``; the ids of jobs that fell back."""
        todo: list[int] = []
        for j, c in enumerate(choice):
            if c < 0:
                continue
            # Unchanged configuration: keep the nodes (always fits: the current allocation did).
            if not table.changed[c] and nodes.fits_as_is(cur[j], j):
                nodes.take(cur[j], j)
                alloc[jobs[j].id] = {cluster.nodes[n]: int(cur[j, n]) for n in np.flatnonzero(cur[j])}
            else:
                todo.append(j)
        # Largest first (distributed jobs claim whole nodes before small jobs fragment them).
        todo.sort(key=lambda j: -int(table.count[choice[j]]))
        fallbacks: list[str] = []
        for j in todo:
            c = int(choice[j])
            t, n = int(table.gtype[c]), int(table.count[c])
            row = nodes.place(t, n)
            if row is None:
                fallbacks.append(jobs[j].id)
                row = self._fallback(table, j, jobs[j], cur[j], t, n, nodes, cluster)
            if row is None:
                continue
            nodes.take(row, j)
            alloc[jobs[j].id] = {cluster.nodes[k]: int(row[k]) for k in np.flatnonzero(row)}
        return fallbacks

    def _fallback(self, table: ConfigTable, j: int, job: JobView, cur: np.ndarray, t: int, n: int,
                  nodes: _Nodes, cluster: Cluster) -> np.ndarray | None:
        """Where job j goes when its chosen ``n`` GPUs of type t fit no single node: the cheapest,
        by the program's own cost, of what can be placed — its current allocation (when it is on
        that type and fits as it is), ``n`` GPUs packed over several nodes (valued on those nodes),
        and each smaller candidate count on one node — or None when nothing fits."""
        options: list[tuple[float, np.ndarray]] = []
        mine = nodes.type_of == t
        held = int(cur.sum())
        if held and int(cur[mine].sum()) == held and nodes.fits_as_is(cur, j):
            options.append((self._cost_of(table, j, job, cluster, t, held, int(np.count_nonzero(cur)),
                                          changed=False), cur))
        split = place_packed(n, np.where(mine & (nodes.owner == -1), nodes.free, 0))
        if split is not None:
            options.append((self._cost_of(table, j, job, cluster, t, n, int(np.count_nonzero(split)),
                                          changed=True), split))
        for smaller in sorted(table.counts[j].get(t, ()), reverse=True):
            if smaller < n:
                row = nodes.place(t, smaller)
                if row is not None:
                    options.append((self._cost_of(table, j, job, cluster, t, smaller,
                                                  int(np.count_nonzero(row)), changed=True), row))
                    break
        if not options:
            return None
        return min(options, key=lambda o: o[0])[1]

    def _cost_of(self, table: ConfigTable, j: int, job: JobView, cluster: Cluster, t: int, count: int,
                 num_nodes: int, *, changed: bool) -> float:
        """The program's cost of job j on ``count`` GPUs of type t over ``num_nodes`` nodes (the
        values of :func:`build_configs`, for a placement the table does not list)."""
        name = table.types[t]
        model = job.model_for(name)
        if model is None:                               # no model: GPUs over its fewest on the type
            raw = count / table.counts[j][t][0]
        else:
            limits = job.limits_for(name) or BatchLimits(model.init_batch_size)
            raw = float(self._cache.goodput(model, limits, np.asarray([num_nodes]), np.asarray([count]))[0])
        cost = config_cost(np.asarray([raw / table.norm[j]]),
                           np.asarray([table.factor[j] if changed else 1.0]),
                           np.asarray([changed and bool(table.running[j])]), self.p,
                           self.lambda_a_for(cluster))
        return float(cost[0])
