"""Sia's large programs, cut down by a Lagrangian bound before HiGHS solves them (issue 38).

Sia's program (:mod:`.sia`) is, over binary ``x[j, c]``::

    minimise  Σ a[c] · x[j, c]     (a: cost minus the job's idle cost; the constant is left out)
    subject to  Σ_c x[j, c] ≤ 1 per job j,   Σ_{c of type t} n[c] · x[j, c] ≤ F[t] per GPU type t

At 4,096 GPUs and 1,000 waiting jobs (19,974 columns) HiGHS needed 10–20 s, and at 5,000 jobs on 64
GPUs about 4 s, although the LP relaxation is within 2·10⁻⁶ of the optimum from the start: HiGHS
spends its time in cut rounds at the root (about 5 s each on the largest) before any of its
heuristics finds a solution that close. Only a few of the columns can be in a good solution, and a
bound says which.

**The bound.** Take one multiplier ``λ[t] ≥ 0`` per GPU type, each column's *price*
``v[c] = a[c] + λ[t(c)] · n[c]``, and per job ``m[j] = min(0, min_c v[c])`` (0: the job idle). Then
``L(λ) = Σ_j m[j] − λ·F`` is a lower bound on the program, and more precisely, for every feasible
choice ``x``::

    a·x  =  Σ_j (v[x_j] − λ·n[x_j])  ≥  Σ_j v[x_j] − λ·F  =  L(λ) + Σ_j r[x_j]

(``λ ≥ 0`` and the choice uses at most ``F``), where the *reduced cost* ``r = v − m[j]`` of a column,
and ``−m[j]`` of leaving job j idle, is never negative. So a choice worth at most ``U`` uses only
columns, and idles, whose reduced cost is at most ``U − L(λ)``: given any feasible choice of value
``U``, the program restricted to them has the same optimum.

**How it is used** (:func:`solve_reduced`):

1. ``λ`` maximising ``L`` — the dual of the LP relaxation — by Kelley's cutting planes: each step
   prices the columns at the best ``λ`` of a small LP over the cuts so far (one variable per type
   and one for the bound), and adds the cut of its subgradient (GPUs the priced choice uses per
   type, minus ``F``). It stops within 10⁻⁹ (relative) of the best bound; any ``λ ≥ 0`` gives a valid
   bound, so stopping early only keeps more columns.
2. ``θ = 10⁻⁶·|L|``: the program restricted to the columns and idles with reduced cost at most θ
   (a job left with a single option takes it; one left with none stays idle) is solved by HiGHS.
   Its optimum ``U`` is feasible for the whole program. When ``U − L ≤ θ`` every choice worth at most
   ``U`` was in the restricted program, so ``U`` is the optimum; otherwise ``θ ← min(2θ, U − L)`` and
   again (an infeasible restriction doubles θ). The last θ is at most twice the gap between the
   optimum and ``L``, which is small when many jobs share the GPUs: the LP relaxation splits at
   most one job per type.

The optimal value is the one HiGHS finds on the whole program (both to the same relative gap);
when several choices are optimal, or within that gap of each other, it may return another of them.
Measured in ``docs/benchmarks.md`` ("Sia's program through a Lagrangian bound").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np
from scipy.sparse import csc_array

from pollux.policy.binary_program import BinarySolution, solve_binary

#: Kelley's method stops when its LP's bound is within this share of the best bound found.
DUAL_TOLERANCE = 1e-9
#: ... or after this many steps (the bound is valid wherever it stops).
DUAL_STEPS = 200
#: The first restriction keeps reduced costs up to this share of ``|L|``.
FIRST_SHARE = 1e-6


@dataclass(frozen=True, slots=True)
class LagrangeBound:
    """The best ``L(λ)`` found (``value``), its ``multipliers`` λ (per type) and the steps taken."""

    value: float
    multipliers: np.ndarray
    steps: int


@dataclass(frozen=True, slots=True)
class Columns:
    """A program's columns sorted by job: ``cost`` (a), ``gtype``, ``count`` and each column's job
    row ``job`` (0 … ``num_jobs`` − 1, non-decreasing); ``starts`` is where each job's columns begin."""

    cost: np.ndarray
    gtype: np.ndarray
    count: np.ndarray
    job: np.ndarray
    starts: np.ndarray

    @property
    def num_jobs(self) -> int:
        return int(self.starts.size)

    def prices(self, multipliers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each column's price ``v`` and each job's ``m`` (its cheapest price, or 0 for idle)."""
        price = self.cost + multipliers[self.gtype] * self.count
        best = np.minimum(np.minimum.reduceat(price, self.starts), 0.0)
        return price, best

    def usage(self, chosen: np.ndarray, num_types: int) -> np.ndarray:
        """GPUs per type taken by the columns ``chosen`` (indices)."""
        return np.bincount(self.gtype[chosen], weights=self.count[chosen], minlength=num_types)


def lagrange_bound(columns: Columns, free: np.ndarray, *, tolerance: float = DUAL_TOLERANCE,
                   max_steps: int = DUAL_STEPS) -> LagrangeBound:
    """λ ≥ 0 maximising ``L(λ)`` (module docstring) by Kelley's cutting planes."""
    num_types = int(free.size)
    # Beyond the price at which no column of a type is worth running, raising λ_t only lowers L.
    per_gpu = np.where(columns.cost < 0, -columns.cost / columns.count, 0.0)
    ceiling = np.zeros(num_types)
    np.maximum.at(ceiling, columns.gtype, per_gpu)
    master = highspy.Highs()
    master.setOptionValue("output_flag", False)
    master.setOptionValue("log_to_console", False)
    # Variables λ_0 … λ_{T−1} and the bound z; maximise z (minimise −z) below every cut.
    master.passModel(num_types + 1, 0, 0, int(highspy.MatrixFormat.kColwise),
                     int(highspy.ObjSense.kMinimize), 0.0, np.r_[np.zeros(num_types), -1.0],
                     np.r_[np.zeros(num_types), -highspy.kHighsInf], np.r_[ceiling, highspy.kHighsInf],
                     np.zeros(0), np.zeros(0), np.zeros(num_types + 2, dtype=np.int32),
                     np.zeros(0, dtype=np.int32), np.zeros(0), np.zeros(num_types + 1, dtype=np.int32))
    multipliers = np.zeros(num_types)
    best_value, best_multipliers = -np.inf, multipliers
    index = np.arange(num_types + 1, dtype=np.int32)
    steps = 0
    while steps < max_steps:
        steps += 1
        price, best = columns.prices(multipliers)
        value = float(best.sum() - multipliers @ free)
        if value > best_value:
            best_value, best_multipliers = value, multipliers.copy()
        gradient = columns.usage(first_minimum(columns, price, best), num_types) - free
        # z ≤ value + g·(λ − λ_k)  ⇔  z − g·λ ≤ value − g·λ_k
        master.addRow(-highspy.kHighsInf, value - float(gradient @ multipliers), num_types + 1, index,
                      np.r_[-gradient, 1.0])
        master.run()
        solution = np.asarray(master.getSolution().col_value)
        if solution[-1] - best_value <= tolerance * max(1.0, abs(best_value)):
            break
        multipliers = np.clip(solution[:-1], 0.0, ceiling)
    return LagrangeBound(best_value, best_multipliers, steps)


def first_minimum(columns: Columns, price: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Per job that runs at these prices (``m < 0``), the first of its columns priced ``m``."""
    at_best = price <= best[columns.job]
    position = np.where(at_best, np.arange(price.size), price.size)
    first = np.minimum.reduceat(position, columns.starts)
    return first[(best < 0) & (first < price.size)]


def program_matrix(job_row: np.ndarray, num_rows: int, gtype: np.ndarray, count: np.ndarray,
                   num_types: int) -> csc_array:
    """The constraint matrix of Sia's program: one row per job (its columns), then one per GPU type
    (each column's GPU count), column-compressed as HiGHS takes it.

    Every column has exactly two entries, its job's row (1) and its type's row below (its count),
    so the compressed arrays are written directly: indices sorted within each column, as scipy's
    own construction gives them, at a small fraction of its cost (it was 6 of the 21 s of solving
    in Sia's 960-job run under a profiler).
    """
    size = int(job_row.size)
    indices = np.empty(2 * size, dtype=np.int32)
    indices[0::2] = job_row
    indices[1::2] = num_rows + np.asarray(gtype)
    data = np.empty(2 * size, dtype=np.float64)
    data[0::2] = 1.0
    data[1::2] = count
    indptr = np.arange(0, 2 * size + 1, 2, dtype=np.int32)
    return csc_array((data, indices, indptr), shape=(num_rows + num_types, size))


def solve_reduced(cost: np.ndarray, gtype: np.ndarray, count: np.ndarray, job: np.ndarray,
                  free: np.ndarray, *, mip_rel_gap: float, time_limit_s: float) -> BinarySolution:
    """Sia's program (module docstring) with ``job[k]`` the job row (0, 1, …) of column k: the
    chosen columns as 0/1 in ``x``, as :func:`.binary_program.solve_binary` returns them."""
    clock = time.perf_counter()
    order = np.argsort(job, kind="stable")
    sorted_job = job[order]
    starts = np.flatnonzero(np.r_[True, sorted_job[1:] != sorted_job[:-1]])
    rank = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, sorted_job.size]))
    columns = Columns(cost[order].astype(np.float64), gtype[order].astype(np.int64),
                      count[order].astype(np.float64), rank, starts)
    capacity = free.astype(np.float64)
    bound = lagrange_bound(columns, capacity)
    price, best = columns.prices(bound.multipliers)
    reduced = price - best[columns.job]
    idle_reduced = -best
    widest = max(float(reduced.max()), float(idle_reduced.max()))
    slack = 1e-9 * max(1.0, abs(bound.value))
    threshold = FIRST_SHARE * max(1.0, abs(bound.value))
    best_x: np.ndarray | None = None
    start: np.ndarray | None = None            # the last restriction's choice, feasible in the next
    while True:
        left = time_limit_s - (time.perf_counter() - clock)
        if left <= 0:
            break                              # the time limit: what was found is not proven
        whole = threshold + slack >= widest
        chosen, status = solve_restricted(columns, capacity, reduced <= threshold + slack,
                                          idle_reduced <= threshold + slack, mip_rel_gap, left, start)
        if chosen is None:
            if whole or status == 1:
                break
            threshold *= 2.0                   # too few options to be feasible: widen
            continue
        best_x = np.zeros(cost.size)
        best_x[order[chosen]] = 1.0
        start = chosen
        if status != 0:
            break                              # stopped at the time limit holding a solution
        gap = float(columns.cost[chosen].sum()) - bound.value
        if whole or gap <= threshold:
            return BinarySolution(best_x, 0)   # proven: every choice worth as much was offered
        threshold = min(2.0 * threshold, gap)
    return BinarySolution(best_x, 1)


def solve_restricted(columns: Columns, capacity: np.ndarray, kept: np.ndarray, idle_ok: np.ndarray,
                     mip_rel_gap: float, time_limit_s: float,
                     start: np.ndarray | None = None) -> tuple[np.ndarray | None, int]:
    """The program over the ``kept`` columns, a job idle only where ``idle_ok``: the chosen column
    indices (None if it has no solution) and the solver's status (0: optimal). ``start`` (column
    indices, all kept) is a feasible choice to start from."""
    options = np.bincount(columns.job[kept], minlength=columns.num_jobs)
    fixed = (options == 1) & ~idle_ok
    if ((options == 0) & ~idle_ok).any():
        return None, 2                       # a job that must run has nothing left to run on
    open_jobs = options - fixed > 0
    fixed_columns = np.flatnonzero(kept & fixed[columns.job])
    left = capacity - columns.usage(fixed_columns, capacity.size)
    if (left < 0).any():
        return None, 2
    free_columns = np.flatnonzero(kept & open_jobs[columns.job])
    if free_columns.size == 0:
        return fixed_columns, 0
    row_of = np.cumsum(open_jobs) - 1
    num_rows = int(open_jobs.sum())
    matrix = program_matrix(row_of[columns.job[free_columns]], num_rows, columns.gtype[free_columns],
                            columns.count[free_columns], capacity.size)
    must_run = ~idle_ok[open_jobs]
    lower = np.r_[np.where(must_run, 1.0, -np.inf), np.full(capacity.size, -np.inf)]
    upper = np.r_[np.ones(num_rows), left]
    # The fixed columns' cost as the objective's offset: the relative gap is then the whole program's.
    offset = float(columns.cost[fixed_columns].sum())
    first = None if start is None else np.isin(free_columns, start).astype(np.float64)
    # Most restrictions are solved at the root without presolve; those that are not took HiGHS
    # hundreds of nodes (6–7 s) that its presolve avoids (one node, 0.02–0.26 s), while presolve
    # costs 0.1–0.5 s on the others. So: the root alone first, then with presolve if it was not enough.
    clock = time.perf_counter()
    result = solve_binary(columns.cost[free_columns], matrix, upper, lower=lower, mip_rel_gap=mip_rel_gap,
                          time_limit_s=time_limit_s, feasibility_jump=False, offset=offset, start=first,
                          max_nodes=1)
    left_s = time_limit_s - (time.perf_counter() - clock)
    if result.node_limit and left_s > 0:
        if result.x is not None:
            first = result.x
        result = solve_binary(columns.cost[free_columns], matrix, upper, lower=lower,
                              mip_rel_gap=mip_rel_gap, time_limit_s=left_s, feasibility_jump=False,
                              offset=offset, start=first, presolve=True)
    if result.x is None:
        return None, result.status
    picked = free_columns[np.rint(result.x).astype(bool)]
    return np.sort(np.r_[fixed_columns, picked]), result.status
