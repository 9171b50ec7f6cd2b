"""Share arithmetic of LB-BSP (SPEC §10): integer splits of a global batch among replicas.

Pure numpy, no state: the balancers of :mod:`pollux.balance.balancers` (which re-exports the public
names) and the simulator's slow-node model use these. A split is a vector of non-negative integers
summing to the global batch, each within the replica's local-batch bounds ``[lo_i, hi_i]``.

* :func:`proportional_shares`: ∝ speeds (bounded water-filling, then largest-remainder rounding);
* :func:`affine_split`: equal finish times for per-replica affine compute times;
* :func:`equal_finish_split`: the real-valued balance point with one affine law and speed factors;
* :func:`equal_shares`, :func:`check_shares`, :func:`stragglers`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike


def _int_total(total: object) -> int:
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)):
        raise ValueError(f"total: expected an integer number of samples, got {total!r}")
    if int(total) < 0:
        raise ValueError(f"total: must be non-negative, got {total}")
    return int(total)


def _bounds(value: ArrayLike | None, n: int, name: str, default: int) -> np.ndarray:
    """Per-replica integer bounds from a scalar or a length-n sequence (None → ``default``)."""
    if value is None:
        return np.full(n, default, dtype=np.int64)
    arr = np.asarray(value)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name}: expected integers, got {value!r}")
    arr = np.broadcast_to(arr, (n,)) if arr.ndim == 0 else arr
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected a scalar or {n} values, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
        raise ValueError(f"{name}: expected finite integers, got {value!r}")
    if np.any(arr < 0):
        raise ValueError(f"{name}: must be non-negative, got {value!r}")
    return arr.astype(np.int64)


def _speeds(speeds: ArrayLike, name: str = "speeds") -> np.ndarray:
    try:
        arr = np.asarray(speeds)
        if arr.dtype == bool or arr.dtype.kind not in "iuf":
            raise TypeError
        arr = arr.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers, got {speeds!r}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: must be finite, got {arr.tolist()}")
    if np.any(arr < 0):
        raise ValueError(f"{name}: must be non-negative, got {arr.tolist()}")
    return arr


def _check_feasible(total: int, lo: np.ndarray, hi: np.ndarray) -> None:
    if np.any(lo > hi):
        bad = int(np.argmax(lo > hi))
        raise ValueError(f"lo: lower bound {int(lo[bad])} exceeds upper bound hi={int(hi[bad])} "
                         f"for replica {bad}")
    if int(lo.sum()) > total:
        raise ValueError(f"lo: the lower bounds sum to {int(lo.sum())}, more than the total {total}")
    if int(hi.sum()) < total:
        raise ValueError(f"hi: the upper bounds sum to {int(hi.sum())}, less than the total {total}")


def _round_to_total(target: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Largest-remainder rounding of real targets (within bounds) to integers summing to ``total``.

    Ties in the fractional part go to the lower rank, so the result is deterministic.
    """
    base = np.clip(np.floor(target + 1e-9), lo, hi).astype(np.int64)
    frac = target - base
    rank = np.arange(target.size)
    remainder = total - int(base.sum())
    while remainder != 0:  # at most a couple of passes; float slack only
        if remainder > 0:
            room = base < hi
            order = np.lexsort((rank, -frac))
            chosen = [i for i in order if room[i]][:remainder]
            if not chosen:  # cannot happen for feasible bounds; never loop forever
                raise ValueError(f"shares: cannot round {target.tolist()} to sum {total}")
            base[chosen] += 1
            frac[chosen] = frac[chosen] - 1.0
            remainder -= len(chosen)
        else:
            room = base > lo
            order = np.lexsort((-rank, frac))
            chosen = [i for i in order if room[i]][:-remainder]
            if not chosen:
                raise ValueError(f"shares: cannot round {target.tolist()} to sum {total}")
            base[chosen] -= 1
            frac[chosen] = frac[chosen] + 1.0
            remainder += len(chosen)
    return base


def _water_fill(total: float, v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Real split ``clip(λ·v, lo, hi)`` summing to ``total`` (feasibility already checked).

    Exact active-set iteration: among the free replicas, split the rest in proportion; if some fall
    below their lower bound and some above their upper, the side with the larger total violation is
    certainly at its bounds in the solution, so fix it and repeat (at most n rounds). Speeds are
    scaled by their maximum first, so tiny or huge speeds cannot overflow.
    """
    v = v / v.max() if np.any(v > 0) else np.ones_like(v)
    at_lo = np.zeros(v.size, dtype=bool)
    at_hi = np.zeros(v.size, dtype=bool)
    target = lo.copy()
    for _ in range(v.size + 1):
        free = ~(at_lo | at_hi)
        if not np.any(free):
            break
        rest = total - float(lo[at_lo].sum()) - float(hi[at_hi].sum())
        weight = np.where(free, v, 0.0)
        if not weight.sum() > 0:
            weight = free.astype(np.float64)  # only zero speeds left: split the rest evenly
        target = np.where(at_lo, lo, np.where(at_hi, hi, rest * weight / weight.sum()))
        below = free & (target < lo)
        above = free & (target > hi)
        if not (np.any(below) or np.any(above)):
            break
        if float((lo - target)[below].sum()) >= float((target - hi)[above].sum()):
            at_lo |= below
        else:
            at_hi |= above
    return np.clip(target, lo, hi)


def equal_finish_split(speeds: ArrayLike, alpha: float, beta: float, total: float, lo: ArrayLike,
                       hi: ArrayLike) -> tuple[np.ndarray, float]:
    """Real shares ``x`` (Σ x = ``total``, ``lo ≤ x ≤ hi``) minimising the slowest ``(alpha + beta·x_i)/f_i``.

    The balance point of LB-BSP when replica i computes a share x in ``(alpha + beta·x)/f_i``; returns
    the shares and that slowest time. At the optimum ``x_i = clip((f_i·τ − alpha)/beta, lo_i, hi_i)``;
    shifted by ``c = alpha/beta`` that is ``x_i + c = clip(f_i·τ/beta, lo_i + c, hi_i + c)``, the bounded
    proportional split that :func:`proportional_shares` uses, of ``total + n·c``. One solver serves
    both. Needs ``alpha ≥ 0``, ``beta > 0``, speeds > 0 and ``Σ lo ≤ total ≤ Σ hi``; ``lo``/``hi`` are
    scalars or per-replica arrays.
    """
    f = np.asarray(speeds, dtype=np.float64)
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha: must be finite and >= 0, got {alpha}")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: must be finite and > 0, got {beta}")
    if f.ndim != 1 or f.size == 0 or not np.all(np.isfinite(f) & (f > 0)):
        raise ValueError(f"speeds: expected positive finite numbers, got {f.tolist()}")
    lo_arr = np.broadcast_to(np.asarray(lo, dtype=np.float64), f.shape)
    hi_arr = np.broadcast_to(np.asarray(hi, dtype=np.float64), f.shape)
    if not (lo_arr.sum() - 1e-9 <= total <= hi_arr.sum() + 1e-9):
        raise ValueError(f"total: {total} is outside [{lo_arr.sum():g}, {hi_arr.sum():g}] "
                         f"for {f.size} replicas")
    c = alpha / beta
    x = _water_fill(float(total) + f.size * c, f, lo_arr + c, hi_arr + c) - c
    return x, float(np.max((alpha + beta * x) / f))


def proportional_shares(
    total: int, speeds: ArrayLike, lo: ArrayLike | None = 1, hi: ArrayLike | None = None
) -> np.ndarray:
    """Integer shares of ``total`` proportional to ``speeds``, each within ``[lo_i, hi_i]``.

    The real-valued split is ``clip(λ·v_i, lo_i, hi_i)`` with λ chosen so it sums to ``total``
    (bounded water-filling: replicas at a bound keep it, the others share the rest in proportion),
    then rounded by largest remainder with ties to the lower rank. ``lo`` and ``hi`` are scalars or
    per-replica sequences (``hi=None``: no upper bound). A replica with speed 0 gets ``lo``. If all
    speeds are 0 the split is as equal as the bounds allow.

    Raises ``ValueError`` naming ``total``, ``speeds``, ``lo`` or ``hi`` when the input is malformed
    or no split can satisfy the bounds (``Σ lo > total`` or ``Σ hi < total``).
    """
    total = _int_total(total)
    v = _speeds(speeds)
    n = v.size
    lo_arr = _bounds(lo, n, "lo", 0)
    hi_arr = _bounds(hi, n, "hi", total)
    _check_feasible(total, lo_arr, hi_arr)
    target = _water_fill(float(total), v, lo_arr.astype(np.float64), hi_arr.astype(np.float64))
    return _round_to_total(target, total, lo_arr, hi_arr)


def equal_shares(total: int, replicas: int) -> np.ndarray:
    """The split used when balancing is off: as equal as possible, the larger shares first.

    ``equal_shares(K·m, K)`` is ``[m] * K``, the agent's split before balancing existed.
    """
    total = _int_total(total)
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ValueError(f"replicas: expected a positive integer, got {replicas!r}")
    q, r = divmod(total, int(replicas))
    return np.array([q + 1] * r + [q] * (int(replicas) - r), dtype=np.int64)


def check_shares(shares: ArrayLike, total: int | None = None, lo: ArrayLike | None = None,
                 hi: ArrayLike | None = None) -> np.ndarray:
    """Validate user- or peer-supplied shares; returns them as an int64 array.

    Raises ``ValueError`` naming ``shares`` (not integers, negative, wrong sum) or the bound.
    """
    arr = np.asarray(shares)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"shares: expected a non-empty 1-D sequence of integers, got {shares!r}")
    if arr.dtype == bool or arr.dtype.kind not in "iuf" or not np.all(np.isfinite(arr)) \
            or np.any(arr != np.round(arr)):
        raise ValueError(f"shares: expected integers, got {shares!r}")
    out = arr.astype(np.int64)
    if np.any(out < 0):
        raise ValueError(f"shares: must be non-negative, got {out.tolist()}")
    if total is not None and int(out.sum()) != int(total):
        raise ValueError(f"shares: sum to {int(out.sum())}, expected the global batch {total}")
    if lo is not None:
        lo_arr = _bounds(lo, out.size, "lo", 0)
        if np.any(out < lo_arr):
            raise ValueError(f"shares: {out.tolist()} below the lower bounds lo={lo_arr.tolist()}")
    if hi is not None:
        hi_arr = _bounds(hi, out.size, "hi", 0)
        if np.any(out > hi_arr):
            raise ValueError(f"shares: {out.tolist()} above the upper bounds hi={hi_arr.tolist()}")
    return out


def stragglers(shares: ArrayLike, lo: ArrayLike = 1) -> list[int]:
    """Ranks whose share has fallen to the minimum ``lo``: stragglers the user should remove.

    Only meaningful with more than one replica; a single replica is never a straggler.
    """
    arr = check_shares(shares)
    if arr.size < 2:
        return []
    lo_arr = _bounds(lo, arr.size, "lo", 0)
    return [int(i) for i in np.flatnonzero(arr <= lo_arr)]


def affine_split(alpha: ArrayLike, beta: ArrayLike, total: int, lo: ArrayLike, hi: ArrayLike
                 ) -> np.ndarray:
    """Integer shares (Σ = ``total``, within ``[lo, hi]``) equalising affine compute times
    ``alpha_i + beta_i·x_i`` (``beta_i > 0``; ``alpha_i`` may be negative: a time that grows faster
    than the batch). The common time τ solves ``Σ clip((τ − alpha_i)/beta_i, lo_i, hi_i) = total``,
    monotone in τ: found by bisection, then rounded by largest remainder."""
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    n = a.size
    if b.shape != a.shape or not np.all(np.isfinite(a)) or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"beta: expected positive finite slopes beside alpha, got {b.tolist()}")
    total = _int_total(total)
    lo_arr = _bounds(lo, n, "lo", 0)
    hi_arr = _bounds(hi, n, "hi", total)
    _check_feasible(total, lo_arr, hi_arr)
    lo_f, hi_f = lo_arr.astype(np.float64), hi_arr.astype(np.float64)
    t_lo, t_hi = float(np.min(a + b * lo_f)), float(np.max(a + b * hi_f))
    for _ in range(100):
        tau = 0.5 * (t_lo + t_hi)
        if float(np.clip((tau - a) / b, lo_f, hi_f).sum()) < total:
            t_lo = tau
        else:
            t_hi = tau
    target = np.clip((t_hi - a) / b, lo_f, hi_f)
    return _round_to_total(target, total, lo_arr, hi_arr)
