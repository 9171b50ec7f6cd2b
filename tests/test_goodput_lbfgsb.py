"""The throughput fit's L-BFGS-B driver (:mod:`pollux.goodput.lbfgsb`) against ``scipy.optimize.minimize``.

The driver calls scipy's compiled step itself to skip the wrapper's per-evaluation bookkeeping; it
must visit the same points and end at the same result, to the last bit, on the pinned scipy — and
fall back to ``minimize`` on a release it was not written for.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

import pollux.goodput.lbfgsb as lbfgsb
from pollux.goodput import ThroughputParams, fit_throughput
from pollux.goodput.throughput import t_grad, t_iter
from pollux.goodput.throughput_fit import _bounds, _Objective


def reference(fun, x0, lower, upper, ftol, maxiter):
    return minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=list(zip(lower, upper, strict=True)),
                    options={"maxiter": maxiter, "ftol": ftol})


def assert_same(got: lbfgsb.LbfgsbResult, want) -> None:
    assert got.x.tobytes() == np.asarray(want.x, dtype=np.float64).tobytes()
    assert got.fun == float(want.fun)
    assert got.message == want.message
    assert got.success == bool(want.success)
    assert (got.nit, got.nfev) == (want.nit, want.nfev)


class Counted:
    """An objective that records the points it is asked for."""

    def __init__(self, fun):
        self.fun = fun
        self.points: list[bytes] = []

    def __call__(self, x):
        self.points.append(np.array(x).tobytes())
        return self.fun(x)


def rosenbrock(x):
    a, b = x[:-1], x[1:]
    value = float(np.sum(100.0 * (b - a * a) ** 2 + (1.0 - a) ** 2))
    grad = np.zeros_like(x)
    grad[:-1] = -400.0 * a * (b - a * a) - 2.0 * (1.0 - a)
    grad[1:] += 200.0 * (b - a * a)
    return value, grad


def test_the_direct_path_runs_on_the_pinned_scipy():
    # constraints.txt pins a release the driver was written for: the fast path is the one tested.
    assert lbfgsb.DIRECT


@pytest.mark.parametrize("ftol", [2.2e-9, 1e-4])
@pytest.mark.parametrize("box", [(-2.0, 2.0), (0.5, 3.0), (-1.5, 0.8)])   # optimum inside, at, beyond
def test_same_points_and_result_as_minimize_on_rosenbrock(ftol, box):
    rng = np.random.default_rng(3)
    lower, upper = np.full(5, box[0]), np.full(5, box[1])
    for _ in range(5):
        x0 = rng.uniform(-3.0, 3.0, 5)          # partly outside the box: both clip it
        mine, theirs = Counted(rosenbrock), Counted(rosenbrock)
        got = lbfgsb.minimise(mine, x0, lower, upper, ftol=ftol, maxiter=500)
        assert_same(got, reference(theirs, x0, lower, upper, ftol, 500))
        assert mine.points == theirs.points


def test_iteration_limit_stops_as_minimize_does():
    lower, upper = np.full(4, -5.0), np.full(4, 5.0)
    x0 = np.array([-1.2, 1.0, -1.2, 1.0])
    got = lbfgsb.minimise(rosenbrock, x0, lower, upper, ftol=2.2e-9, maxiter=3)
    want = reference(rosenbrock, x0, lower, upper, 2.2e-9, 3)
    assert_same(got, want)
    assert not got.success and "ITERATIONS REACHED LIMIT" in got.message


def test_same_result_as_minimize_on_the_fit_objective():
    # The objective the scheduler minimises, on records of a known model with noise, each series
    # and smoothing, from the starts a fit uses and from random ones.
    rng = np.random.default_rng(11)
    truth = ThroughputParams(0.05, 0.002, 0.02, 0.004, 0.06, 0.01, 1.4)
    for trial in range(40):
        size = int(rng.integers(1, 9))
        replicas = rng.choice([1, 2, 3, 4, 8, 16], size).astype(np.float64)
        nodes = np.minimum(replicas, rng.choice([1, 2, 4], size)).astype(np.float64)
        m = rng.choice([8, 16, 32, 64, 128], size).astype(np.float64)
        optim = t_iter(truth, nodes, replicas, m) * rng.lognormal(0.0, 0.05, size)
        accum = np.where(rng.random(size) < 0.5, t_grad(truth, m) * rng.lognormal(0.0, 0.05, size), np.nan)
        free = np.arange(7) if trial % 2 else np.array([0, 1, 2, 3, 6])
        fixed = np.log(np.array(truth.as_array()))
        fixed[6] = truth.gamma
        objective = _Objective(nodes, replicas, m, optim, accum, free, fixed,
                               smooth=[0.0, 1e-3, 1e-5][trial % 3])
        lower, upper = _bounds(free)
        x0 = np.where(free == 6, rng.uniform(1.0, 4.0, free.size), rng.uniform(-12.0, 2.0, free.size))
        with np.errstate(all="ignore"):
            got = lbfgsb.minimise(objective, x0, lower, upper, ftol=2.2e-9, maxiter=500)
            want = reference(objective, x0, lower, upper, 2.2e-9, 500)
        assert_same(got, want)


def test_fits_are_the_same_through_minimize(monkeypatch):
    # A scipy release the driver was not written for: minimize itself, and the very same fits.
    records = ([1, 1, 1, 2], [1, 2, 4, 8], [32, 32, 64, 64], [0.11, 0.13, 0.2, 0.31],
               [0.1, float("nan"), 0.19, 0.2])
    direct = fit_throughput(*records)
    monkeypatch.setattr(lbfgsb, "_SETULB", None)
    through = fit_throughput(*records)
    assert direct == through
    assert direct.ok


def test_bad_bounds_are_refused_with_their_reason():
    with pytest.raises(ValueError, match="finite"):
        lbfgsb.minimise(rosenbrock, np.zeros(2), np.array([-np.inf, 0.0]), np.ones(2), ftol=1e-9, maxiter=5)
    with pytest.raises(ValueError, match="above its upper"):
        lbfgsb.minimise(rosenbrock, np.zeros(2), np.array([2.0, 0.0]), np.ones(2), ftol=1e-9, maxiter=5)
