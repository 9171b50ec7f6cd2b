"""pollux.policy.binary_program against scipy.optimize.milp, which runs the same HiGHS release."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csc_array, csr_array, vstack

from pollux.policy.binary_program import solve_binary


def _sia_like(rng: np.random.Generator, jobs: int, types: int) -> tuple[np.ndarray, csc_array, np.ndarray]:
    """A multiple-choice knapsack shaped like Sia's program: one configuration per job at most,
    GPUs per type within capacity; costs negative (running beats idling) with some ties."""
    per_job = rng.integers(1, 7, size=jobs)
    job = np.repeat(np.arange(jobs), per_job)
    k = job.size
    gtype = rng.integers(0, types, size=k)
    count = 2 ** rng.integers(0, 4, size=k)
    cost = -np.round(rng.uniform(0.1, 2.0, size=k), 2)        # rounded: ties between columns
    cols = np.arange(k)
    one_each = csr_array((np.ones(k), (job, cols)), shape=(jobs, k))
    capacity = csr_array((count.astype(np.float64), (gtype, cols)), shape=(types, k))
    matrix = vstack([one_each, capacity], format="csc")
    upper = np.concatenate([np.ones(jobs), rng.integers(0, 3 * jobs, size=types).astype(np.float64)])
    return cost, matrix, upper


def _scipy(cost: np.ndarray, matrix: csc_array, upper: np.ndarray):
    return milp(cost, constraints=LinearConstraint(matrix, -np.inf, upper),
                integrality=np.ones(cost.size), bounds=Bounds(0.0, 1.0),
                options={"mip_rel_gap": 1e-7, "time_limit": 30.0, "presolve": False})


@pytest.mark.parametrize("seed", range(12))
def test_same_solution_as_scipy_milp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cost, matrix, upper = _sia_like(rng, jobs=int(rng.integers(1, 120)), types=int(rng.integers(1, 4)))
    ours = solve_binary(cost, matrix, upper, mip_rel_gap=1e-7, time_limit_s=30.0)
    theirs = _scipy(cost, matrix, upper)
    assert ours.status == theirs.status == 0
    assert ours.x is not None
    np.testing.assert_array_equal(np.rint(ours.x), np.rint(theirs.x))
    chosen = np.rint(ours.x)
    assert np.all(matrix @ chosen <= upper + 1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_feasibility_jump_off_reaches_the_same_optimum(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    cost, matrix, upper = _sia_like(rng, jobs=int(rng.integers(1, 120)), types=int(rng.integers(1, 4)))
    on = solve_binary(cost, matrix, upper, mip_rel_gap=1e-7, time_limit_s=30.0)
    off = solve_binary(cost, matrix, upper, mip_rel_gap=1e-7, time_limit_s=30.0, feasibility_jump=False)
    assert on.x is not None and off.x is not None
    assert on.status == off.status == 0
    assert float(cost @ np.rint(off.x)) == pytest.approx(float(cost @ np.rint(on.x)), rel=1e-7, abs=1e-9)
    assert np.all(matrix @ np.rint(off.x) <= upper + 1e-9)


def test_infeasible_program_has_no_solution_and_scipys_status() -> None:
    # x = 0 violates 0 ≤ −1: nothing is feasible.
    matrix = csc_array(np.array([[1.0, 1.0]]))
    upper = np.array([-1.0])
    cost = np.array([-1.0, -2.0])
    ours = solve_binary(cost, matrix, upper, mip_rel_gap=1e-7, time_limit_s=30.0)
    assert ours.x is None
    assert ours.status == _scipy(cost, matrix, upper).status == 2


def test_brute_force_optimum_on_a_small_program() -> None:
    rng = np.random.default_rng(7)
    cost = rng.normal(size=8)
    matrix = csc_array(rng.integers(0, 3, size=(3, 8)).astype(np.float64))
    upper = np.array([3.0, 4.0, 2.0])
    best = min((float(cost @ x), tuple(x)) for bits in range(256)
               for x in [np.array([(bits >> i) & 1 for i in range(8)], dtype=np.float64)]
               if np.all(matrix @ x <= upper))
    ours = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=30.0)
    assert ours.x is not None
    assert float(cost @ np.rint(ours.x)) == pytest.approx(best[0], abs=1e-9)


def test_shape_mismatch_is_a_clear_error() -> None:
    matrix = csc_array(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"matrix: shape \(2, 3\), expected \(2, 4\)"):
        solve_binary(np.zeros(4), matrix, np.ones(2), mip_rel_gap=1e-7, time_limit_s=1.0)


@pytest.mark.parametrize("seed", range(16))
def test_relaxation_first_reaches_the_same_optimum(seed: int) -> None:
    # Sia-like programs, some with a fractional relaxation (tight capacities), some without: the
    # optimum is the branch and bound's either way, and every answer is a feasible 0/1 point.
    rng = np.random.default_rng(300 + seed)
    cost, matrix, upper = _sia_like(rng, jobs=int(rng.integers(1, 80)), types=int(rng.integers(1, 4)))
    plain = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=30.0)
    first = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=30.0, relaxation_first=True)
    assert plain.x is not None and first.x is not None
    assert first.status == plain.status == 0
    assert set(np.unique(first.x).tolist()) <= {0.0, 1.0}
    assert np.all(matrix @ first.x <= upper + 1e-9)
    assert float(cost @ first.x) == pytest.approx(float(cost @ np.rint(plain.x)), rel=1e-9, abs=1e-9)


def test_a_fractional_relaxation_goes_on_to_the_branch_and_bound() -> None:
    # Two jobs of 2 GPUs each, 3 GPUs free: the relaxation runs one and a half jobs (value −1.5);
    # the binary optimum runs one (−1). An answer taken from the relaxation would be fractional or
    # infeasible.
    cost = np.array([-1.0, -1.0])
    matrix = csc_array(np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]))
    upper = np.array([1.0, 1.0, 3.0])
    res = solve_binary(cost, matrix, upper, mip_rel_gap=0.0, time_limit_s=30.0, relaxation_first=True)
    assert res.x is not None and res.status == 0
    np.testing.assert_array_equal(np.sort(np.rint(res.x)), [0.0, 1.0])
    assert np.all(np.abs(res.x - np.rint(res.x)) < 1e-9)


def test_relaxation_first_keeps_the_infeasible_answer() -> None:
    matrix = csc_array(np.array([[1.0, 1.0]]))
    res = solve_binary(np.array([-1.0, -2.0]), matrix, np.array([-1.0]), mip_rel_gap=1e-7,
                       time_limit_s=30.0, relaxation_first=True)
    assert res.x is None and res.status == 2
