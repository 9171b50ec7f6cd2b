"""Unequal per-replica batches (LB-BSP, SPEC §10): share math, balancers and speed predictors.

With bulk-synchronous training every step waits for the slowest replica. LB-BSP splits the global
batch M into per-replica shares ``x_i`` (``Σ x_i = M``) at iteration boundaries so that all replicas
finish their compute together; the gradients are then weighted by ``x_i / M`` so the update is still
the mean over the whole global batch. This module holds the pure math (numpy only, no torch):

* :func:`proportional_shares` / :func:`equal_shares`: integer splits of a global batch, and
  :func:`equal_finish_split`, the real-valued balance point the simulator models;
* :class:`GpuBalancer`: the paper's iterative algorithm (move Δ samples from the slowest to the
  fastest replica after D consistent observations; Δ = 1, D = 20 after the first oscillation);
* :class:`CpuBalancer`: the paper's analytic algorithm (shares proportional to predicted speeds);
* speed predictors :class:`LastValue`, :class:`MovingAverage` and :class:`NarxPredictor`
  (in ``predictors.py``, re-exported here);
* :func:`stragglers` and :func:`make_balancer`.

See ``docs/goodput.md`` ("Unequal batches") for the algorithms, their convergence and their limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.predictors import (
    LastValue,
    MovingAverage,
    NarxPredictor,
    SpeedPredictor,
)

__all__ = [
    "BALANCE_MODES",
    "Balancer",
    "CpuBalancer",
    "GpuBalancer",
    "LastValue",
    "MovingAverage",
    "NarxPredictor",
    "SpeedPredictor",
    "check_shares",
    "equal_shares",
    "make_balancer",
    "proportional_shares",
    "stragglers",
]

#: The accepted ``balance`` modes, in the order error messages list them.
BALANCE_MODES: tuple[str, ...] = ("auto", "gpu", "cpu", "off")


# --------------------------------------------------------------------------------------------
# Share arithmetic
# --------------------------------------------------------------------------------------------


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


def _step_times(step_times: ArrayLike, n: int) -> np.ndarray:
    t = np.asarray(step_times, dtype=np.float64)
    if t.shape != (n,):
        raise ValueError(f"step_times: expected {n} values (one per replica), got shape {t.shape}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"step_times: must be finite and positive, got {t.tolist()}")
    return t


# --------------------------------------------------------------------------------------------
# Balancers
# --------------------------------------------------------------------------------------------


def _prepare(shares: ArrayLike, step_times: ArrayLike, lo: ArrayLike, hi: ArrayLike | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    x = check_shares(shares)
    n = x.size
    total = int(x.sum())
    t = _step_times(step_times, n)
    lo_arr = _bounds(lo, n, "lo", 0)
    hi_arr = _bounds(hi, n, "hi", total)
    _check_feasible(total, lo_arr, hi_arr)
    return x, t, lo_arr, hi_arr, total


class GpuBalancer:
    """The paper's GPU algorithm (Alg. 2): iterative shares without a model of step time vs batch.

    After each iteration the leader (fastest replica that may grow: below ``hi`` and, when
    ``memory_ok`` is given, allowed by memory) and the straggler (slowest replica above ``lo``) are
    identified. When the same pair held, leader strictly faster, in each of the last ``window``
    iterations, ``delta`` samples move from straggler to leader (less if a bound is in the way). The
    window slides, so a persistent imbalance moves ``delta`` every iteration after the first
    ``window``. Oscillation (the last move's leader is now the straggler, or its straggler the leader)
    switches to the fine phase (``fine_delta``, ``fine_window``) for good.

    Convergence is coarse by design: from an even split of M, reaching 2:1 takes about
    ``window + (M/6)/delta`` iterations and may overshoot by up to ``delta``, after which the fine
    phase walks back at one sample per iteration once ``fine_window`` consistent observations exist.
    ``step_times`` are per-replica compute times (before waiting for the others).
    """

    mode = "gpu"

    def __init__(self, delta: int = 5, window: int = 5, fine_delta: int = 1, fine_window: int = 20,
                 memory_fraction: float = 0.95) -> None:
        for name, value in (("delta", delta), ("window", window), ("fine_delta", fine_delta),
                            ("fine_window", fine_window)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if not 0.0 < float(memory_fraction) <= 1.0:
            raise ValueError(f"memory_fraction: must be in (0, 1], got {memory_fraction!r}")
        self.delta, self.window = int(delta), int(window)
        self.fine_delta, self.fine_window = int(fine_delta), int(fine_window)
        #: Memory use (fraction of the device) above which a replica may not grow; the agent
        #: turns ``torch.cuda.mem_get_info`` into ``memory_ok`` with it.
        self.memory_fraction = float(memory_fraction)
        self.fine = False
        self.predicted_step_time = math.nan
        self._pair: tuple[int, int] | None = None
        self._streak = 0
        self._last_move: tuple[int, int] | None = None

    @property
    def phase(self) -> str:
        """"fast" (Δ = delta, D = window) or "fine" (Δ = fine_delta, D = fine_window)."""
        return "fine" if self.fine else "fast"

    def reset(self) -> None:
        """Forget the history (call when the replica set or the global batch changes)."""
        self.fine = False
        self._pair, self._streak, self._last_move = None, 0, None
        self.predicted_step_time = math.nan

    def update(self, shares: ArrayLike, step_times: ArrayLike, lo: ArrayLike = 1,
               hi: ArrayLike | None = None, memory_ok: Sequence[bool] | None = None,
               loads: Sequence[ArrayLike | None] | None = None) -> np.ndarray:
        """Shares for the next iteration from this iteration's ``shares`` and compute ``step_times``.

        ``loads`` is accepted for interface parity with :class:`CpuBalancer` and ignored.
        """
        x, t, lo_arr, hi_arr, _ = _prepare(shares, step_times, lo, hi)
        n = x.size
        grow = x < hi_arr
        if memory_ok is not None:
            ok = np.asarray(memory_ok)
            if ok.shape != (n,) or ok.dtype != bool:
                raise ValueError(f"memory_ok: expected {n} booleans, got {memory_ok!r}")
            grow &= ok
        shrink = x > lo_arr
        per_sample = t / np.maximum(x, 1)
        self.predicted_step_time = float(t.max())
        if n < 2 or not grow.any() or not shrink.any():
            self._pair, self._streak = None, 0
            return x
        leader = int(np.flatnonzero(grow)[np.argmin(t[grow])])
        straggler = int(np.flatnonzero(shrink)[np.argmax(t[shrink])])
        if leader == straggler or not t[leader] < t[straggler]:
            self._pair, self._streak = None, 0
            return x
        last = self._last_move
        if last is not None and not self.fine and (straggler == last[0] or leader == last[1]):
            self.fine = True  # oscillation: the former leader is now the straggler, or vice versa
            self._pair, self._streak = (leader, straggler), 1
            return x
        if self._pair == (leader, straggler):
            self._streak += 1
        else:
            self._pair, self._streak = (leader, straggler), 1
        step, window = (self.fine_delta, self.fine_window) if self.fine else (self.delta, self.window)
        if self._streak < window:
            return x
        amount = int(min(step, x[straggler] - lo_arr[straggler], hi_arr[leader] - x[leader]))
        if amount <= 0:
            return x
        out = x.copy()
        out[leader] += amount
        out[straggler] -= amount
        self._last_move = (leader, straggler)
        # Linear extrapolation of the two changed replicas, for reporting only.
        self.predicted_step_time = float(np.max(np.where(out != x, per_sample * out, t)))
        return out


class CpuBalancer:
    """The paper's CPU algorithm (Alg. 1): shares proportional to each replica's predicted speed.

    On CPUs compute time is close to proportional to the batch, ``t_i = x_i / v_i``, so equal finish
    times need ``x_i ∝ v_i``; the speed of the next iteration is predicted per replica by a
    :class:`SpeedPredictor` made by ``predictor_factory`` (default: :class:`NarxPredictor`). One
    update suffices when speeds are steady; how fast it follows a change is the predictor's.
    """

    mode = "cpu"

    def __init__(self, predictor_factory: Callable[[], SpeedPredictor] | None = None,
                 tolerance: float = 0.015) -> None:
        if not (math.isfinite(tolerance) and 0.0 <= tolerance < 1.0):
            raise ValueError(f"tolerance: expected a fraction in [0, 1), got {tolerance!r}")
        self.predictor_factory: Callable[[], SpeedPredictor] = (
            predictor_factory if predictor_factory is not None else NarxPredictor)
        #: Keep the current shares unless the new ones are predicted to shorten the step by more than
        #: this fraction: on equally fast replicas the predicted speeds differ by noise only, and
        #: chasing it costs more (a new data iterator, a step that waits for the larger share) than
        #: it could gain.
        self.tolerance = float(tolerance)
        self.predictors: list[SpeedPredictor] = []
        self.predicted_speeds = np.zeros(0)
        self.predicted_step_time = math.nan

    def reset(self) -> None:
        """Forget all predictors (call when the replica set changes)."""
        self.predictors = []
        self.predicted_speeds = np.zeros(0)
        self.predicted_step_time = math.nan

    def update(self, shares: ArrayLike, step_times: ArrayLike, lo: ArrayLike = 1,
               hi: ArrayLike | None = None, memory_ok: Sequence[bool] | None = None,
               loads: Sequence[ArrayLike | None] | None = None) -> np.ndarray:
        """Shares for the next iteration; ``loads[i]`` are replica i's load features (optional).

        A replica whose ``memory_ok`` is False keeps at most its current share.
        """
        x, t, lo_arr, hi_arr, total = _prepare(shares, step_times, lo, hi)
        n = x.size
        if loads is not None and len(loads) != n:
            raise ValueError(f"loads: expected {n} entries (one per replica), got {len(loads)}")
        if memory_ok is not None:
            ok = np.asarray(memory_ok)
            if ok.shape != (n,) or ok.dtype != bool:
                raise ValueError(f"memory_ok: expected {n} booleans, got {memory_ok!r}")
            hi_arr = np.where(ok, hi_arr, np.minimum(hi_arr, np.maximum(x, lo_arr)))
            if int(hi_arr.sum()) < total:
                hi_arr = _bounds(hi, n, "hi", total)  # memory cannot hold the batch: ignore it
        if len(self.predictors) != n:
            self.predictors = [self.predictor_factory() for _ in range(n)]
        speeds = np.empty(n)
        for i, pred in enumerate(self.predictors):
            if x[i] > 0:
                pred.observe(float(x[i]) / float(t[i]), None if loads is None else loads[i])
            speeds[i] = pred.predict()
        if not np.all(np.isfinite(speeds) & (speeds > 0)):
            speeds = np.where(np.isfinite(speeds) & (speeds > 0), speeds, 0.0)
        out = proportional_shares(total, speeds, lo_arr, hi_arr)
        self.predicted_speeds = speeds
        new_time = _predicted_time(out, speeds)
        if not np.array_equal(out, x) and np.all((x >= lo_arr) & (x <= hi_arr)):
            old_time = _predicted_time(x, speeds)
            if new_time >= old_time * (1.0 - self.tolerance):
                out, new_time = x.copy(), old_time
        self.predicted_step_time = new_time
        return out


def _predicted_time(shares: np.ndarray, speeds: np.ndarray) -> float:
    """Predicted compute time of a step: the slowest replica's share over its predicted speed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        times = np.where(speeds > 0, shares / speeds, np.where(shares > 0, np.inf, 0.0))
    return float(np.max(times))


Balancer = GpuBalancer | CpuBalancer


def make_balancer(mode: str | None, *, cuda: bool) -> Balancer | None:
    """The balancer for a ``balance`` mode: "auto" (GPU algorithm on CUDA, else CPU), "gpu", "cpu",
    or "off" / None (no balancing: equal shares). Anything else is a ``ValueError`` naming ``balance``.
    """
    if mode is None or mode == "off":
        return None
    if not isinstance(mode, str) or mode not in BALANCE_MODES:
        raise ValueError(f"balance: expected one of {', '.join(BALANCE_MODES)} or None, got {mode!r}")
    if mode == "auto":
        mode = "gpu" if cuda else "cpu"
    return GpuBalancer() if mode == "gpu" else CpuBalancer()
