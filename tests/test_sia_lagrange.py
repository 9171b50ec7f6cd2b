"""pollux.policy.sia_lagrange: the Lagrangian bound and Sia's program solved through it.

The reduction must keep the optimal value of the whole program (solved by HiGHS as it is, and by
brute force where that is small enough), return a feasible choice, and its bound must be a lower
bound equal to the LP relaxation's optimum (the Lagrangian dual of a program with one convexity row
per job is its LP relaxation).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.sparse import csr_array, vstack

from pollux.policy.binary_program import solve_binary
from pollux.policy.sia import SiaPolicy, solve_whole
from pollux.policy.sia_lagrange import Columns, lagrange_bound, program_matrix, solve_reduced


def _program(rng: np.random.Generator, jobs: int, types: int, *, per_job: int = 7,
             tight: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sia-shaped columns: per job a few (type, count) with a cost that falls with the count on each
    type (more GPUs, more goodput), a few positive (worse than idle); capacity ``tight`` × demand."""
    options = rng.integers(1, per_job + 1, size=jobs)
    job = np.repeat(np.arange(jobs), options)
    gtype = rng.integers(0, types, size=job.size)
    count = 2 ** rng.integers(0, 4, size=job.size)
    speed = rng.uniform(0.5, 2.0, size=(jobs, types))
    cost = -speed[job, gtype] * count ** rng.uniform(0.3, 0.9, size=job.size)
    cost[rng.random(job.size) < 0.05] *= -0.5
    demand = np.bincount(gtype, weights=count, minlength=types) / max(1, per_job // 2)
    free = np.floor(tight * demand * rng.uniform(0.5, 1.5, size=types)).astype(np.int64)
    return cost, gtype, count, job, free


def _brute_force(cost: np.ndarray, gtype: np.ndarray, count: np.ndarray, job: np.ndarray,
                 free: np.ndarray) -> float:
    options = [[-1, *np.flatnonzero(job == j).tolist()] for j in range(int(job.max()) + 1)]
    best = 0.0
    for pick in itertools.product(*options):
        chosen = [k for k in pick if k >= 0]
        use = np.bincount(gtype[chosen], weights=count[chosen], minlength=free.size)
        if (use <= free).all():
            best = min(best, float(cost[chosen].sum()))
    return best


def _check_feasible(x: np.ndarray, gtype: np.ndarray, count: np.ndarray, job: np.ndarray,
                    free: np.ndarray) -> np.ndarray:
    chosen = np.flatnonzero(np.rint(x) > 0)
    assert np.bincount(job[chosen]).max(initial=0) <= 1
    assert (np.bincount(gtype[chosen], weights=count[chosen], minlength=free.size) <= free).all()
    return chosen


@pytest.mark.parametrize("seed", range(6))
def test_program_matrix_is_scipys_construction(seed: int) -> None:
    # Written directly as compressed arrays: the same matrix, entry for entry and in the same order
    # (HiGHS walks the columns as given), as stacking the two blocks with scipy.
    rng = np.random.default_rng(seed)
    jobs, types = int(rng.integers(1, 60)), int(rng.integers(1, 4))
    _, gtype, count, job, free = _program(rng, jobs=jobs, types=types)
    rows = int(job.max()) + 1
    cols = np.arange(job.size)
    theirs = vstack([csr_array((np.ones(job.size), (job, cols)), shape=(rows, job.size)),
                     csr_array((count.astype(np.float64), (gtype, cols)), shape=(free.size, job.size))],
                    format="csc")
    ours = program_matrix(job, rows, gtype, count, free.size)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.indptr, theirs.indptr)
    np.testing.assert_array_equal(ours.indices, theirs.indices)
    np.testing.assert_array_equal(ours.data, theirs.data)
    np.testing.assert_array_equal(ours.toarray(), theirs.toarray())


@pytest.mark.parametrize("seed", range(40))
def test_same_optimum_as_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cost, gtype, count, job, free = _program(rng, int(rng.integers(1, 6)), int(rng.integers(1, 4)),
                                             per_job=3, tight=float(rng.uniform(0.2, 1.5)))
    result = solve_reduced(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=30.0)
    assert result.status == 0 and result.x is not None
    chosen = _check_feasible(result.x, gtype, count, job, free)
    assert float(cost[chosen].sum()) == pytest.approx(_brute_force(cost, gtype, count, job, free),
                                                      rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_same_optimum_as_the_whole_program(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    cost, gtype, count, job, free = _program(rng, int(rng.integers(20, 400)), int(rng.integers(1, 4)),
                                             tight=float(rng.uniform(0.1, 2.0)))
    reduced = solve_reduced(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=60.0)
    whole = solve_whole(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=60.0)
    assert reduced.status == whole.status == 0
    assert reduced.x is not None and whole.x is not None
    ours = _check_feasible(reduced.x, gtype, count, job, free)
    theirs = _check_feasible(whole.x, gtype, count, job, free)
    assert float(cost[ours].sum()) == pytest.approx(float(cost[theirs].sum()), rel=1e-9, abs=1e-9)


def _columns(cost: np.ndarray, gtype: np.ndarray, count: np.ndarray, job: np.ndarray) -> Columns:
    starts = np.flatnonzero(np.r_[True, job[1:] != job[:-1]])
    return Columns(cost.astype(np.float64), gtype.astype(np.int64), count.astype(np.float64), job, starts)


@pytest.mark.parametrize("seed", range(12))
def test_the_bound_is_the_lp_relaxation(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    jobs, types = int(rng.integers(5, 300)), int(rng.integers(1, 4))
    cost, gtype, count, job, free = _program(rng, jobs, types, tight=float(rng.uniform(0.1, 1.5)))
    bound = lagrange_bound(_columns(cost, gtype, count, job), free.astype(np.float64))
    cols = np.arange(cost.size)
    matrix = vstack([csr_array((np.ones(cost.size), (job, cols)), shape=(jobs, cost.size)),
                     csr_array((count.astype(np.float64), (gtype, cols)), shape=(types, cost.size))])
    lp = linprog(cost, A_ub=matrix, b_ub=np.r_[np.ones(jobs), free], bounds=(0.0, 1.0), method="highs")
    assert lp.status == 0
    assert bound.value == pytest.approx(lp.fun, rel=1e-8, abs=1e-9)
    assert (bound.multipliers >= 0).all()
    assert bound.steps < 200


def test_every_job_idle_when_running_costs_more() -> None:
    cost = np.array([0.5, 1.0, 0.25])
    result = solve_reduced(cost, np.zeros(3, dtype=np.int64), np.array([1, 2, 1]), np.array([0, 0, 1]),
                           np.array([4]), mip_rel_gap=1e-7, time_limit_s=10.0)
    assert result.status == 0 and result.x is not None
    assert not result.x.any()


def test_no_free_gpus_of_a_type() -> None:
    rng = np.random.default_rng(7)
    cost, gtype, count, job, free = _program(rng, 60, 3)
    free[1] = 0
    result = solve_reduced(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=30.0)
    assert result.x is not None
    chosen = _check_feasible(result.x, gtype, count, job, free)
    assert not (gtype[chosen] == 1).any()
    whole = solve_whole(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=30.0)
    assert whole.x is not None
    assert float(cost[chosen].sum()) == pytest.approx(float(cost @ np.rint(whole.x)), rel=1e-9)


def test_time_limit_returns_status_one() -> None:
    rng = np.random.default_rng(3)
    cost, gtype, count, job, free = _program(rng, 200, 3)
    result = solve_reduced(cost, gtype, count, job, free, mip_rel_gap=0.0, time_limit_s=0.0)
    assert result.status == 1 and result.x is None


def test_lower_bounds_and_offset_of_solve_binary() -> None:
    # Two jobs, one GPU: alone the cheaper (−2) job runs; a lower bound of 1 on the other forces it.
    cost = np.array([-1.0, -2.0])
    matrix = vstack([csr_array(np.eye(2)), csr_array(np.ones((1, 2)))], format="csc")
    upper = np.array([1.0, 1.0, 1.0])
    free_choice = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=10.0)
    assert free_choice.x is not None and np.rint(free_choice.x).tolist() == [0.0, 1.0]
    forced = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=10.0,
                          lower=np.array([1.0, -np.inf, -np.inf]), offset=100.0,
                          start=np.array([1.0, 0.0]))
    assert forced.x is not None and np.rint(forced.x).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="lower"):
        solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=1.0, lower=np.zeros(2))


@pytest.mark.parametrize("value", [-1, 1.5, True, "10"])
def test_reduce_above_is_checked(value: object) -> None:
    with pytest.raises(ValueError, match="reduce_above"):
        SiaPolicy(reduce_above=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seed", "jobs"), [(3, 505), (16, 369), (38, 224)])
def test_restrictions_beyond_the_root_are_solved_with_presolve(seed: int, jobs: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Programs whose restrictions HiGHS does not close at the root (found by a search over seeds):
    the presolved second solve must still give the whole program's optimum."""
    import pollux.policy.sia_lagrange as module
    calls: list[bool] = []
    solve = module.solve_binary

    def watched(*args: object, **options: object) -> object:
        result = solve(*args, **options)  # type: ignore[arg-type]
        calls.append(result.node_limit)
        return result

    monkeypatch.setattr(module, "solve_binary", watched)
    rng = np.random.default_rng(seed)
    assert int(rng.integers(100, 600)) == jobs
    cost, gtype, count, job, free = _program(rng, jobs, 3, per_job=12, tight=float(rng.uniform(0.3, 3.0)))
    cost = np.round(cost, 3)                              # ties, as identical jobs give
    reduced = module.solve_reduced(cost, gtype, count, job, free, mip_rel_gap=1e-7, time_limit_s=60.0)
    assert any(calls), "no restriction went past the root: the test no longer covers that path"
    whole = solve_whole(cost, gtype, count, job, free, mip_rel_gap=1e-7, time_limit_s=60.0)
    assert reduced.status == whole.status == 0
    assert reduced.x is not None and whole.x is not None
    ours = _check_feasible(reduced.x, gtype, count, job, free)
    assert float(cost[ours].sum()) == pytest.approx(float(cost @ np.rint(whole.x)), rel=2e-7)
