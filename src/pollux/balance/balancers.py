"""Unequal per-replica batches (LB-BSP, SPEC §10): share math, balancers and speed predictors.

With bulk-synchronous training every step waits for the slowest replica. LB-BSP splits the global
batch M into per-replica shares ``x_i`` (``Σ x_i = M``) at iteration boundaries so that all replicas
finish their compute together; the gradients are then weighted by ``x_i / M`` so the update is still
the mean over the whole global batch. This module holds the pure math (numpy only, no torch):

* share arithmetic (in ``splits.py``, re-exported here): :func:`proportional_shares`,
  :func:`equal_shares`, :func:`affine_split`, and :func:`equal_finish_split`, the real-valued
  balance point the simulator models;
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
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from pollux.balance.predictors import (
    LastValue,
    MovingAverage,
    NarxPredictor,
    SpeedPredictor,
)
from pollux.balance.splits import (
    _bounds,
    _check_feasible,
    affine_split,
    check_shares,
    equal_finish_split,
    equal_shares,
    proportional_shares,
    stragglers,
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
    "affine_split",
    "check_shares",
    "equal_finish_split",
    "equal_shares",
    "make_balancer",
    "proportional_shares",
    "stragglers",
]

#: The accepted ``balance`` modes, in the order error messages list them.
BALANCE_MODES: tuple[str, ...] = ("auto", "gpu", "cpu", "off")


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


#: The noise prior counts as this many prediction errors (:attr:`CpuBalancer.noise`).
PRIOR_WEIGHT = 8
#: Updates of the held shares kept for the second evidence test (:meth:`CpuBalancer._held_evidence`).
HELD_KEEP = 64

class CpuBalancer:
    """The paper's CPU algorithm (Alg. 1): shares proportional to each replica's predicted speed.

    On CPUs compute time is close to proportional to the batch, ``t_i = x_i / v_i``, so equal finish
    times need ``x_i ∝ v_i``; the speed of the next iteration is predicted per replica by a
    :class:`SpeedPredictor` made by ``predictor_factory`` (default: :class:`NarxPredictor`). One
    update suffices when speeds are steady; how fast it follows a change is the predictor's.

    Measured speeds are noisy (a few % per step on a shared machine), and a move the noise caused
    costs real time: the step waits for the replica that got more. So a change has to earn its
    place. The predictors' proposal is taken when it is predicted to shorten the step by more than
    the dead band, ``max(tolerance, noise_factor · noise)``, with ``noise`` the robust scale of the
    predictors' recent relative errors. The update after such a move *settles* it: it takes the
    split proportional to the speeds just measured at the new shares if that promises more than
    ``tolerance``; with per-step costs that do not grow with the batch, ``x ∝ v``
    is a fixed-point iteration that needs that one more measurement to land near the equal-finish
    split. Otherwise a smaller correction is made only on evidence: the speeds
    measured since the shares last changed, averaged over ``n`` updates, must predict a gain above
    ``max(tolerance, evidence_z · noise / √n)``, or (the second test) the gains the correction
    promises at each of those ``m ≥ held_min`` updates' own speeds must average above
    ``max(tolerance, held_z · sd / √m)``, with ``sd`` their scatter: the predictors' errors carry
    every level shift and the prior, and can stay several times the noise of the held measurements
    long after a move, which left a settling move that one noisy step sent 5–10 % astray in place for
    tens of steps in the LB-BSP benchmark. Equally fast replicas therefore stay put, a lasting
    imbalance is followed at once, and a small one (a few %) is corrected once enough steps show it.

    A level shift (a replica's measured speed off its prediction by more than ``level_shift``, a
    fraction; default 0.4, far above the step noise: a new 2× straggler gives 0.5, a slowdown that
    moves from one replica to another 0.5 and 1.0) is taken from the measurement, not the
    prediction: the predictors follow a shift over several updates, so their first proposal was a
    partial move and the real one came an update or two later (in the LB-BSP benchmark, 4–7 steps
    after the slowdown moved instead of 2–3). Speeds measured before a shift are then dropped from
    the evidence and from the settling update's lines.
    """

    mode = "cpu"

    def __init__(self, predictor_factory: Callable[[], SpeedPredictor] | None = None,
                 tolerance: float = 0.005, noise_factor: float = 1.0, noise_window: int = 50,
                 prior_noise: float = 0.2, evidence_z: float = 2.0, level_shift: float = 0.4,
                 held_z: float = 4.0, held_min: int = 3) -> None:
        if not (math.isfinite(held_z) and held_z >= 0.0):
            raise ValueError(f"held_z: expected a non-negative number, got {held_z!r}")
        if isinstance(held_min, bool) or int(held_min) != held_min or held_min < 3:
            raise ValueError(f"held_min: expected an integer >= 3, got {held_min!r}")
        self.held_z, self.held_min = float(held_z), int(held_min)
        if not (math.isfinite(level_shift) and level_shift > 0.0):
            raise ValueError(f"level_shift: expected a positive fraction, got {level_shift!r}")
        self.level_shift = float(level_shift)
        if not (math.isfinite(tolerance) and 0.0 <= tolerance < 1.0):
            raise ValueError(f"tolerance: expected a fraction in [0, 1), got {tolerance!r}")
        if not (math.isfinite(noise_factor) and noise_factor >= 0.0):
            raise ValueError(f"noise_factor: expected a non-negative number, got {noise_factor!r}")
        if not (math.isfinite(evidence_z) and evidence_z >= 0.0):
            raise ValueError(f"evidence_z: expected a non-negative number, got {evidence_z!r}")
        if not (math.isfinite(prior_noise) and prior_noise >= 0.0):
            raise ValueError(f"prior_noise: expected a non-negative fraction, got {prior_noise!r}")
        if isinstance(noise_window, bool) or int(noise_window) != noise_window or noise_window < 8:
            raise ValueError(f"noise_window: expected an integer >= 8, got {noise_window!r}")
        self.predictor_factory: Callable[[], SpeedPredictor] = (
            predictor_factory if predictor_factory is not None else NarxPredictor)
        #: The least predicted gain (a fraction of the step) worth a change of shares (class doc).
        self.tolerance = float(tolerance)
        self.evidence_z = float(evidence_z)
        self.noise_factor = float(noise_factor)
        #: The noise assumed until 8 prediction errors were seen (the first updates of a run).
        self.prior_noise = float(prior_noise)
        self.predictors: list[SpeedPredictor] = []
        self.predicted_speeds = np.zeros(0)
        self.predicted_step_time = math.nan
        #: Recent relative errors |measured / predicted − 1| of every replica's speed prediction.
        self._errors: deque[float] = deque(maxlen=int(noise_window))
        self._errors_seen = 0
        #: The shares in force since the last change, the sum of the speeds measured with them and
        #: how many updates that sum holds (the evidence for a small correction).
        self._held: tuple[int, ...] | None = None
        self._speed_sum = np.zeros(0)
        self._held_n = 0
        #: The speeds of each update since the last change (the newest HELD_KEEP): their scatter is
        #: the noise of the held measurements themselves (the second evidence test, class doc).
        self._held_speeds: deque[np.ndarray] = deque(maxlen=HELD_KEEP)
        #: The shares held before the last change and the mean speeds measured with them (the
        #: settling update's second point).
        self._before: tuple[np.ndarray, np.ndarray] | None = None
        self._settling = False  # the previous update made a move beyond the dead band
        #: Why the last update changed the shares: "predicted" (beyond the dead band), "settled" (the
        #: update after such a move) or "evidence" (a small correction); None: it kept them.
        self.last_move: str | None = None

    @property
    def noise(self) -> float:
        """Robust scale of the predictors' recent relative errors (1.4826 × their median absolute
        value: the standard deviation for normal errors, unmoved by a few bursts or a level shift),
        shrunk towards ``prior_noise`` as if the prior were 8 more errors (of all seen): a handful of
        errors can look quiet by chance, and a band trusted too early lets the noise move the shares."""
        k = self._errors_seen
        if k == 0:
            return self.prior_noise
        measured = 1.4826 * float(np.median(np.fromiter(self._errors, dtype=np.float64)))
        return (k * measured + PRIOR_WEIGHT * self.prior_noise) / (k + PRIOR_WEIGHT)

    @property
    def dead_band(self) -> float:
        """The predicted relative gain a change of shares must exceed (see ``tolerance``)."""
        return max(self.tolerance, self.noise_factor * self.noise)

    def reset(self) -> None:
        """Forget all predictors (call when the replica set changes)."""
        self.predictors = []
        self.predicted_speeds = np.zeros(0)
        self.predicted_step_time = math.nan
        self._errors.clear()
        self._errors_seen = 0
        self._held, self._speed_sum, self._held_n = None, np.zeros(0), 0
        self._held_speeds.clear()
        self._before = None
        self._settling = False

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
        measured = np.where(x > 0, x / t, 0.0)
        before = self.predicted_speeds if self.predicted_speeds.size == n else None
        any_shift = False
        for i, pred in enumerate(self.predictors):
            shifted = False
            if x[i] > 0:
                if before is not None and before[i] > 0:
                    error = abs(float(measured[i]) / float(before[i]) - 1.0)
                    self._errors.append(error)
                    self._errors_seen += 1
                    shifted = error > self.level_shift
                pred.observe(float(measured[i]), None if loads is None else loads[i])
            speeds[i] = float(measured[i]) if shifted else pred.predict()
            any_shift |= shifted
        if any_shift:
            # speeds measured before the shift are no evidence after it, nor a point of the settling
            # update's lines (`_secant_split`): start both afresh from this measurement
            self._held, self._speed_sum, self._held_n, self._before = None, np.zeros(0), 0, None
            self._held_speeds.clear()
        held = tuple(int(v) for v in x)
        if held == self._held:
            self._speed_sum, self._held_n = self._speed_sum + measured, self._held_n + 1
        else:
            if self._held is not None and len(self._held) == n and self._held_n > 0:
                self._before = (np.asarray(self._held, dtype=np.float64), self._speed_sum / self._held_n)
            self._held, self._speed_sum, self._held_n = held, measured, 1
            self._held_speeds.clear()
        self._held_speeds.append(measured)
        if not np.all(np.isfinite(speeds) & (speeds > 0)):
            speeds = np.where(np.isfinite(speeds) & (speeds > 0), speeds, 0.0)
        out = proportional_shares(total, speeds, lo_arr, hi_arr)
        self.predicted_speeds = speeds
        new_time = _predicted_time(out, speeds)
        settling, self._settling = self._settling, False
        feasible = bool(np.all((x >= lo_arr) & (x <= hi_arr)))
        reason = "predicted"
        if settling and feasible:
            reason = "settled"
            out, new_time = self._refine(x, speeds, total, lo_arr, hi_arr, _predicted_time(x, speeds),
                                         measured, 1, settle=True)
            # A large settling move (a level shift the predictors have not caught up with) is
            # followed by another settling update; a small one ends the settling.
            self._settling = not np.array_equal(out, x) and (
                _predicted_time(out, measured) < _predicted_time(x, measured) * (1.0 - self.dead_band))
        elif not np.array_equal(out, x) and feasible:
            old_time = _predicted_time(x, speeds)
            if new_time >= old_time * (1.0 - self.dead_band):
                reason = "evidence"
                out, new_time = self._refine(x, speeds, total, lo_arr, hi_arr, old_time,
                                             self._speed_sum, self._held_n)
            else:
                self._settling = True
        self.last_move = None if np.array_equal(out, x) else reason
        self.predicted_step_time = new_time
        return out

    def _secant_split(self, x: np.ndarray, speeds: np.ndarray, total: int, lo: np.ndarray,
                      hi: np.ndarray) -> np.ndarray | None:
        """The settling split from two measurements per replica: the speeds before the last move
        and just after it give each replica's compute time as a line through both points, so the
        split equalises those lines instead of assuming time ∝ share (which lands short when a
        per-step cost does not grow with the batch, and overshoots when the time grows faster than
        it). A replica whose share hardly moved (< 10 %), or whose line does not rise, keeps the
        proportional model ``t = x / v``; None when no replica has a usable line."""
        if self._before is None or self._before[0].size != x.size:
            return None
        x_old, v_old = self._before
        x_new = x.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_old = np.where(v_old > 0, x_old / v_old, np.nan)
            t_new = np.where(speeds > 0, x_new / speeds, np.nan)
            slope = (t_new - t_old) / (x_new - x_old)
        usable = (np.abs(x_new - x_old) >= 0.1 * np.maximum(x_new, 1.0)) & np.isfinite(slope) & (slope > 0)
        if not np.any(usable) or not np.all(np.isfinite(t_new)):
            return None
        beta = np.where(usable, slope, t_new / np.maximum(x_new, 1.0))
        alpha = np.where(usable, t_new - slope * x_new, 0.0)
        try:
            return affine_split(alpha, beta, total, lo, hi)
        except ValueError:
            return None

    def _refine(self, x: np.ndarray, speeds: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray,
                old_time: float, speed_sum: np.ndarray, n: int, settle: bool = False
                ) -> tuple[np.ndarray, float]:
        """A correction inside the dead band from measured speeds (``speed_sum`` over ``n`` updates):
        when ``settle`` (the update after a move), on the speeds just measured at the new shares,
        for any gain above ``tolerance``; otherwise the speeds measured since the last change must
        show a gain above ``max(tolerance, evidence_z · noise / √n)`` (class doc)."""
        keep = (x.copy(), old_time)
        if n < (1 if settle else 2) or speed_sum.size != x.size:
            return keep
        mean = speed_sum / n
        candidate = (self._secant_split(x, mean, total, lo, hi) if settle else None)
        if candidate is None:
            candidate = proportional_shares(total, mean, lo, hi)
        if np.array_equal(candidate, x):
            return keep
        gain = 1.0 - _predicted_time(candidate, mean) / _predicted_time(x, mean)
        need = self.tolerance if settle else max(self.tolerance,
                                                 self.evidence_z * self.noise / math.sqrt(n))
        if gain > need or (not settle and self._held_evidence(x, candidate)):
            return candidate, _predicted_time(candidate, speeds)
        return keep

    def _held_evidence(self, x: np.ndarray, candidate: np.ndarray) -> bool:
        """The second evidence test (class doc): the candidate's gain at each update's speeds since
        the shares last changed, whose mean must exceed ``held_z`` of its own standard errors (and
        ``tolerance``) over at least ``held_min`` updates. The predictors' errors, the noise of the
        first test, include every level shift and the fit's own misses; the held measurements'
        scatter is the noise of just what is averaged, often a few times smaller on a steady
        machine, so a lasting imbalance of several % (a settling move that a noisy step sent
        astray) is corrected after a few updates instead of tens."""
        m = len(self._held_speeds)
        if m < self.held_min:
            return False
        v = np.stack(self._held_speeds)
        if v.shape[1] != x.size or not np.all(np.isfinite(v) & (v > 0)):
            return False
        gains = 1.0 - np.max(candidate / v, axis=1) / np.max(x / v, axis=1)   # v > 0 checked above
        mean, sd = float(np.mean(gains)), float(np.std(gains, ddof=1))
        return mean > max(self.tolerance, self.held_z * sd / math.sqrt(m))


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
