"""A 0/1 program ``min c·x subject to A·x ≤ b`` solved by HiGHS through its own binding, ``highspy``.

Why not :func:`scipy.optimize.milp`, which runs the same solver: its wrapper walks every column in
Python on every call — it builds the integrality as a list of enum objects and reads each column's
basis status back for bound multipliers this caller never uses. On Sia's 960-job run (2,375 programs
of 833 columns on average) that was about a fifth of ``milp``'s time under a profiler, 1.7 s of
the 63 s run measured plainly (``docs/benchmarks.md``). ``highspy`` takes the arrays as they are.

Same answers: ``highspy`` is pinned to the HiGHS release that scipy bundles (1.12.0,
``constraints.txt``) and gets the options scipy's ``milp`` passes (no console log, the relative gap,
the time limit, presolve as asked), so the solver walks the same path. All 2,375 programs of that run
gave the same choice both ways, and again with the feasibility-jump heuristic off, as Sia runs it.
:data:`SCIPY_STATUS` keeps ``milp``'s status codes, which Sia writes into its state, so the state
reads as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np
from scipy.sparse import csc_array

_STATUS = highspy.HighsModelStatus

#: HiGHS model status → :func:`scipy.optimize.milp`'s ``status`` (0 optimal, 1 iteration or time
#: limit, 2 infeasible, 3 unbounded, 4 anything else), as scipy maps them.
SCIPY_STATUS: dict[object, int] = {
    _STATUS.kOptimal: 0,
    _STATUS.kTimeLimit: 1,
    _STATUS.kIterationLimit: 1,
    _STATUS.kModelError: 2,
    _STATUS.kInfeasible: 2,
    _STATUS.kUnbounded: 3,
}

#: Statuses after which HiGHS may hold a usable (feasible, perhaps not optimal) solution.
_STOPPED_EARLY = (_STATUS.kTimeLimit, _STATUS.kIterationLimit, _STATUS.kSolutionLimit)


@dataclass(frozen=True, slots=True)
class BinarySolution:
    """``x`` (0/1 as floats, to be rounded by the caller) or None when no feasible point was found;
    ``status`` in :func:`scipy.optimize.milp`'s codes (:data:`SCIPY_STATUS`)."""

    x: np.ndarray | None
    status: int
    #: HiGHS stopped at ``max_nodes`` (status 4 then, as :func:`scipy.optimize.milp` has no code for it).
    node_limit: bool = False


def solve_binary(cost: np.ndarray, matrix: csc_array, upper: np.ndarray, *, mip_rel_gap: float,
                 time_limit_s: float, presolve: bool = False, feasibility_jump: bool = True,
                 lower: np.ndarray | None = None, offset: float = 0.0,
                 start: np.ndarray | None = None, max_nodes: int | None = None,
                 relaxation_first: bool = False) -> BinarySolution:
    """Minimise ``cost·x`` over binary ``x`` with ``lower ≤ matrix·x ≤ upper`` (``lower`` None: the
    rows are unbounded below; −inf in it leaves that row unbounded below). ``offset`` is added to
    the objective; it matters only through the relative gap, which HiGHS measures on the objective
    with its offset (a part of a larger program, solved to that program's gap, passes the rest's value).
    ``start`` (0/1 per column) is a feasible point HiGHS starts from, as its first incumbent.
    ``max_nodes`` stops the branch and bound after that many nodes (1: the root only), a limit that,
    unlike the time limit, gives the same answer on every machine.

    ``presolve`` and ``feasibility_jump`` (HiGHS's primal heuristic of that name, which spends a
    fixed budget of moves before the search, ~11 ms even on a two-column program) switch those
    parts of HiGHS on or off; the defaults are HiGHS's own but for presolve, off as Sia runs it.

    ``relaxation_first`` solves the linear relaxation (0 ≤ x ≤ 1) by the simplex method first. The
    simplex ends at a vertex; when that vertex is 0/1 it is an optimum of the binary program too (no
    binary point is cheaper than the relaxation's optimum), and it is returned without the branch and
    bound. Otherwise HiGHS solves the binary program as without the option. On Sia's programs, whose
    relaxations are mostly integral, this halved the solve of the 960-job run (20.3 → 11.3 s;
    :func:`pollux.policy.sia.solve_whole`).

    ``matrix`` is column-compressed (HiGHS's own column-wise format, passed without conversion).
    A solution is returned when HiGHS proves it optimal, or stops at a limit holding a feasible one
    (finite objective) — what :func:`scipy.optimize.milp` returns in those cases.
    """
    num_col = int(cost.size)
    num_row = int(upper.size)
    if matrix.shape != (num_row, num_col):
        raise ValueError(f"matrix: shape {matrix.shape}, expected ({num_row}, {num_col})")
    if lower is None:
        lower = np.full(num_row, -np.inf)
    elif lower.shape != (num_row,):
        raise ValueError(f"lower: shape {lower.shape}, expected ({num_row},)")
    if relaxation_first:
        vertex = _integral_vertex(cost, matrix, lower, upper, offset, time_limit_s)
        if vertex is not None:
            return BinarySolution(vertex, SCIPY_STATUS[_STATUS.kOptimal])
    solver = _quiet_solver(time_limit_s, presolve)
    solver.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    solver.setOptionValue("mip_heuristic_run_feasibility_jump", bool(feasibility_jump))
    if max_nodes is not None:
        solver.setOptionValue("mip_max_nodes", int(max_nodes))
    _pass_model(solver, cost, matrix, lower, upper, offset, integral=True)
    if start is not None:
        solver.setSolution(num_col, np.arange(num_col, dtype=np.int32),
                           np.ascontiguousarray(start, dtype=np.float64))
    solver.run()
    model_status = solver.getModelStatus()
    status = SCIPY_STATUS.get(model_status, 4)
    found = model_status == _STATUS.kOptimal or (
        model_status in _STOPPED_EARLY
        and solver.getInfo().objective_function_value != highspy.kHighsInf)
    node_limit = max_nodes is not None and model_status == _STATUS.kSolutionLimit
    if not found:
        return BinarySolution(None, status, node_limit)
    return BinarySolution(np.asarray(solver.getSolution().col_value, dtype=np.float64), status, node_limit)


def _quiet_solver(time_limit_s: float, presolve: bool) -> highspy.Highs:
    """A HiGHS instance without console output, with a time limit and presolve on or off."""
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("log_to_console", False)
    solver.setOptionValue("time_limit", float(time_limit_s))
    solver.setOptionValue("presolve", "on" if presolve else "off")
    return solver


def _pass_model(solver: highspy.Highs, cost: np.ndarray, matrix: csc_array, lower: np.ndarray,
                upper: np.ndarray, offset: float, *, integral: bool) -> None:
    """Hand the program to ``solver``: columns in [0, 1], binary when ``integral``."""
    num_col, num_row = int(cost.size), int(upper.size)
    solver.passModel(
        num_col, num_row, int(matrix.nnz), int(highspy.MatrixFormat.kColwise),
        int(highspy.ObjSense.kMinimize), float(offset),
        np.ascontiguousarray(cost, dtype=np.float64), np.zeros(num_col), np.ones(num_col),
        np.ascontiguousarray(lower, dtype=np.float64), np.ascontiguousarray(upper, dtype=np.float64),
        matrix.indptr.astype(np.int32), matrix.indices.astype(np.int32),
        matrix.data.astype(np.float64), np.full(num_col, 1 if integral else 0, dtype=np.int32),
    )


#: A relaxation's value this close to 0 or 1 counts as that integer (HiGHS's primal feasibility
#: tolerance is 1e-7; a vertex of these programs is exactly 0/1 where it is integral).
INTEGRAL_TOL = 1e-9


def _integral_vertex(cost: np.ndarray, matrix: csc_array, lower: np.ndarray, upper: np.ndarray,
                     offset: float, time_limit_s: float) -> np.ndarray | None:
    """The simplex optimum of the linear relaxation when it is 0/1 (as 0.0/1.0), else None."""
    solver = _quiet_solver(time_limit_s, presolve=False)
    solver.setOptionValue("solver", "simplex")
    _pass_model(solver, cost, matrix, lower, upper, offset, integral=False)
    solver.run()
    if solver.getModelStatus() != _STATUS.kOptimal:
        return None
    x = np.asarray(solver.getSolution().col_value, dtype=np.float64)
    rounded = np.rint(x)
    if x.size and float(np.abs(x - rounded).max()) > INTEGRAL_TOL:
        return None
    return rounded
