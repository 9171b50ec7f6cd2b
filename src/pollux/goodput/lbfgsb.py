"""L-BFGS-B for the throughput fit, without scipy's per-evaluation wrapper.

The scheduler refits a job's throughput model from a handful of records many times (1,331 fits in
one simulation of workload-6), and each fit runs a few descents of about 35 evaluations of a
seven-parameter objective that costs about 40 µs. Through ``scipy.optimize.minimize`` each
evaluation costs about 105 µs: the rest is the wrapper's bookkeeping (``ScalarFunction`` compares
and copies every point, counts and memoises the calls), not the algorithm.

:func:`minimise` drives the same L-BFGS-B iteration as ``minimize(..., method="L-BFGS-B",
jac=True)``: scipy's own compiled ``setulb`` step, called the way scipy 1.15–1.17's
``_minimize_lbfgsb`` calls it (the same workspace, the same stopping rules), so it visits the same
points and returns the same result to the last bit (``tests/test_goodput_lbfgsb.py`` checks this
against ``minimize``). ``setulb`` is scipy's private interface, so the direct path is used only on
the scipy releases whose signature it was written for; on any other, :func:`minimise` calls
``minimize`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy
from scipy.optimize import minimize

__all__ = ["DIRECT", "LbfgsbResult", "minimise"]

#: Stored corrections of the limited-memory matrix, the projected-gradient tolerance, the most line
#: search steps an iteration and the most evaluations: scipy's defaults for L-BFGS-B.
MAXCOR = 10
GTOL = 1e-5
MAXLS = 20
MAXFUN = 15000

#: The scipy releases (major, minor) whose private ``setulb`` (the C translation of L-BFGS-B that
#: arrived in 1.15) :func:`minimise` calls directly.
DIRECT_RELEASES = ((1, 15), (1, 16), (1, 17))

# setulb's task codes (the first entry of its ``task`` array).
_EVALUATE = 3
_NEW_ITERATE = 1
_CONVERGED = 4
_STOP = 5
_ITERATION_LIMIT = 504
_EVALUATION_LIMIT = 502

#: Why a run stopped, by ``task`` (first and second entries), worded as scipy words it.
_STATUS = {0: "START", 1: "NEW_X", 2: "RESTART", 3: "FG", 4: "CONVERGENCE", 5: "STOP", 6: "WARNING",
           7: "ERROR", 8: "ABNORMAL"}
_REASON = {
    401: "NORM OF PROJECTED GRADIENT <= PGTOL",
    402: "RELATIVE REDUCTION OF F <= FACTR*EPSMCH",
    502: "TOTAL NO. OF F,G EVALUATIONS EXCEEDS LIMIT",
    503: "PROJECTED GRADIENT IS SUFFICIENTLY SMALL",
    504: "TOTAL NO. OF ITERATIONS REACHED LIMIT",
    601: "ROUNDING ERRORS PREVENT PROGRESS",
    602: "STP = STPMAX",
    603: "STP = STPMIN",
    604: "XTOL TEST SATISFIED",
}


def _setulb() -> Callable[..., None] | None:
    """scipy's ``setulb`` where its signature is the one :func:`minimise` was written for."""
    release = tuple(int(part) for part in scipy.__version__.split(".")[:2])
    if release not in DIRECT_RELEASES:
        return None
    try:
        from scipy.optimize import _lbfgsb
    except ImportError:
        return None
    return getattr(_lbfgsb, "setulb", None)


_SETULB = _setulb()
#: Whether :func:`minimise` drives ``setulb`` itself (False: it calls ``scipy.optimize.minimize``).
DIRECT = _SETULB is not None


@dataclass(frozen=True, slots=True)
class LbfgsbResult:
    """Where a descent ended: the point ``x``, the objective ``fun`` there, why it stopped
    (``message``, as scipy words it), whether that was convergence, and the iterations and
    evaluations it took."""

    x: np.ndarray
    fun: float
    message: str
    success: bool
    nit: int
    nfev: int


def minimise(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray,
             lower: np.ndarray, upper: np.ndarray, *, ftol: float, maxiter: int) -> LbfgsbResult:
    """Minimise ``fun`` (returning the value and the gradient) from ``x0`` within finite bounds.

    The same as ``scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=...,
    options={"maxiter": maxiter, "ftol": ftol})`` with its other options at their defaults.
    """
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))):
        raise ValueError("minimise: every bound must be finite")
    if np.any(lower > upper):
        raise ValueError("minimise: a lower bound is above its upper bound")
    x = np.clip(np.asarray(x0, dtype=np.float64).ravel(), lower, upper)
    if _SETULB is None:
        res = minimize(fun, x, jac=True, method="L-BFGS-B", bounds=list(zip(lower, upper, strict=True)),
                       options={"maxiter": maxiter, "ftol": ftol})
        return LbfgsbResult(np.asarray(res.x), float(res.fun), str(res.message), bool(res.success),
                            int(res.nit), int(res.nfev))
    return _drive(_SETULB, fun, x, lower, upper, ftol, maxiter)


def _drive(setulb: Callable[..., None], fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
           x: np.ndarray, lower: np.ndarray, upper: np.ndarray, ftol: float,
           maxiter: int) -> LbfgsbResult:
    """scipy's L-BFGS-B loop: ``setulb`` asks for the objective at its point or reports a new
    iterate until it stops; the iteration and evaluation limits are checked at each new iterate."""
    n = x.size
    m = MAXCOR
    factr = ftol / np.finfo(float).eps
    bound_kinds = np.full(n, 2, dtype=np.int32)          # 2: bounded below and above
    f: float | np.ndarray = np.array(0.0, dtype=np.float64)
    g = np.zeros(n, dtype=np.float64)
    wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m, dtype=np.float64)
    iwa = np.zeros(3 * n, dtype=np.int32)
    task = np.zeros(2, dtype=np.int32)
    ln_task = np.zeros(2, dtype=np.int32)
    lsave = np.zeros(4, dtype=np.int32)
    isave = np.zeros(44, dtype=np.int32)
    dsave = np.zeros(29, dtype=np.float64)
    iterations = evaluations = 0
    last_point, last_g = b"", g
    while True:
        g = g.astype(np.float64)
        setulb(m, x, lower, upper, bound_kinds, f, g, factr, GTOL, wa, iwa, task, lsave, isave,
               dsave, MAXLS, ln_task)
        if task[0] == _EVALUATE:
            # The line search may ask again for the point it last asked for: it gets the values
            # it had (as through minimize, which keeps them), without another evaluation.
            point = x.tobytes()
            if point != last_point:
                value, last_g = fun(x.copy())
                f, last_point = float(value), point
                evaluations += 1
            g = last_g
        elif task[0] == _NEW_ITERATE:
            iterations += 1
            if iterations >= maxiter:
                task[0], task[1] = _STOP, _ITERATION_LIMIT
            elif evaluations > MAXFUN:
                task[0], task[1] = _STOP, _EVALUATION_LIMIT
        else:
            break
    message = f"{_STATUS.get(int(task[0]), 'UNKNOWN')}: {_REASON.get(int(task[1]), '')}"
    return LbfgsbResult(x.copy(), float(f), message, int(task[0]) == _CONVERGED, iterations,
                        evaluations)
