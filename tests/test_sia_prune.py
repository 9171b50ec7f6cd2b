"""pollux.policy.sia_prune: the columns an optimum of Sia's program needs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array, vstack

from pollux.policy.sia_prune import needed_columns


def _program(rng: np.random.Generator, jobs: int, types: int):
    """Sia-shaped: per job a few (type, count) configurations, coefficients negative (running is
    better than idling), some rounded so that ties occur; few free GPUs, so many jobs must wait."""
    rows = []
    for j in range(jobs):
        for t in range(types):
            for n in (1, 2, 4):
                if rng.random() < 0.7:
                    rows.append((j, t, n, -round(float(rng.uniform(0.1, 3.0)) * n ** 0.5, 1)))
    job, gtype, count, coef = (np.array(x) for x in zip(*rows, strict=True))
    free = rng.integers(0, 6, size=types)
    return job.astype(np.int64), gtype.astype(np.int64), count.astype(np.int64), coef.astype(float), free


def _optimum(job, gtype, count, coef, free, jobs, types, columns) -> float:
    """The exact optimum (gap 0) of the program restricted to ``columns``."""
    if columns.size == 0:
        return 0.0
    k = columns.size
    cols = np.arange(k)
    a = vstack([csr_array((np.ones(k), (job[columns], cols)), shape=(jobs, k)),
                csr_array((count[columns].astype(float), (gtype[columns], cols)), shape=(types, k))])
    ub = np.concatenate([np.ones(jobs), free.astype(float)])
    res = milp(coef[columns], constraints=LinearConstraint(a, -np.inf, ub), integrality=np.ones(k),
               bounds=Bounds(0.0, 1.0), options={"mip_rel_gap": 0.0})
    assert res.status == 0
    return float(res.fun)


@pytest.mark.parametrize("seed", range(40))
def test_dropping_the_columns_keeps_the_optimal_value(seed: int) -> None:
    rng = np.random.default_rng(seed)
    jobs, types = int(rng.integers(2, 30)), int(rng.integers(1, 4))
    job, gtype, count, coef, free = _program(rng, jobs, types)
    keep = needed_columns(gtype, count, job, coef, int(free.sum()))
    full = _optimum(job, gtype, count, coef, free, jobs, types, np.arange(coef.size))
    reduced = _optimum(job, gtype, count, coef, free, jobs, types, keep)
    assert reduced == pytest.approx(full, abs=1e-9)


def test_with_room_for_every_job_nothing_is_dropped() -> None:
    rng = np.random.default_rng(3)
    job, gtype, count, coef, _ = _program(rng, 12, 3)
    keep = needed_columns(gtype, count, job, coef, free_gpus=12 + 4)
    np.testing.assert_array_equal(keep, np.arange(coef.size))


def test_per_configuration_the_best_are_kept_ties_by_job() -> None:
    # Six jobs offer (type 0, 2 GPUs), one of them also (type 0, 1 GPU); 3 free GPUs: at most
    # 3 − 2 + 1 = 2 jobs of the first configuration and 3 of the second are needed.
    job = np.array([0, 1, 2, 3, 4, 5, 5])
    gtype = np.zeros(7, dtype=np.int64)
    count = np.array([2, 2, 2, 2, 2, 2, 1])
    coef = np.array([-1.0, -3.0, -2.0, -3.0, -0.5, -2.0, -0.1])
    keep = needed_columns(gtype, count, job, coef, free_gpus=3)
    # best two of count 2: jobs 1 and 3 (both −3.0; job order breaks the tie); count 1: its only one.
    np.testing.assert_array_equal(keep, [1, 3, 6])


def test_no_columns() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert needed_columns(empty, empty, empty, np.zeros(0), 8).size == 0
