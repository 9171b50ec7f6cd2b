"""Statistical efficiency from the (pre-conditioned) gradient noise scale (SPEC §2).

A larger batch gives a less noisy gradient, but the benefit saturates: once the batch is much larger
than the noise scale, doubling it barely improves each step. ``gain(S)`` says how many M0-sized steps
one step at ``S = M/M0`` is worth, and ``efficiency = gain/S`` is the progress per example relative to
M0. This module holds those formulas, the estimators of (sqr, var) from micro-batch gradient norms,
the smoother the agent runs them through, and the learning-rate scaling rules built on ``gain``.
All functions accept numpy arrays and broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.records import GradStats, check_number

#: Floor of the smoothed variance, so that efficiency stays defined before statistics arrive.
VAR_FLOOR = 1e-6
#: Per-step EMA decay at S = 1; at scale S a step decays by ``EMA_DECAY ** S``.
EMA_DECAY = 0.999
#: Pessimistic start: all signal, no noise, so efficiency ≈ M0/M until measurements arrive.
INITIAL_STATS = GradStats(sqr=1.0, var=0.0)


def gain(scale: ArrayLike, sqr: ArrayLike, var: ArrayLike) -> np.ndarray:
    """``gain(S) = (var + sqr) / (var/S + sqr)``: M0-steps of progress made by one step at scale S.

    ``gain(1) = 1`` and ``1 <= gain(S) <= S`` for ``S >= 1``. With no signal (sqr = 0) the gain is
    S (perfectly efficient); with no noise (var = 0) it is 1.

    Only the ratio of ``var`` and ``sqr`` matters, so near the ends of the float range both are first
    divided by the larger: a subnormal ``var`` divided by S would otherwise underflow to 0 for some S
    and not others (gain jumping between 1 and S). Ordinary values are divided by 1, exactly.
    """
    scale = np.asarray(scale, dtype=np.float64)
    sqr = np.asarray(sqr, dtype=np.float64)
    var = np.maximum(np.asarray(var, dtype=np.float64), 0.0)
    top = np.maximum(var, sqr)
    with np.errstate(invalid="ignore", divide="ignore"):
        unit = np.where((top > 0.0) & ((top < 1e-280) | (top > 1e280)), top, 1.0)
        v, q = var / unit, sqr / unit
        den = v / scale + q
        out = np.where(den > 0.0, (v + q) / np.where(den > 0.0, den, 1.0), scale)
    return out


def gain_of(scale: float, sqr: float, var: float) -> float:
    """:func:`gain` of one scale and one pair of statistics, as a Python float, bit for bit.

    For the simulator's inner loop, which asks once per step segment of every running job: numpy's
    per-call cost was most of the work there. The same IEEE operations in the same order give the
    same double; a NaN or a zero scale goes through :func:`gain` itself, so that numpy's rules for
    them (NaN propagation, division by zero) hold too.
    """
    if scale != scale or sqr != sqr or var != var or scale == 0.0:
        return float(gain(scale, sqr, var))
    var = max(var, 0.0)
    top = max(var, sqr)
    unit = top if top > 0.0 and (top < 1e-280 or top > 1e280) else 1.0
    v, q = var / unit, sqr / unit
    den = v / scale + q
    return (v + q) / den if den > 0.0 else float(scale)


def efficiency(
    batch_size: ArrayLike, init_batch_size: ArrayLike, sqr: ArrayLike, var: ArrayLike
) -> np.ndarray:
    """``EFFICIENCY(M) = (φ + M0)/(φ + M) = gain(S)/S`` with ``S = M/M0``; lies in (0, 1] for M ≥ M0."""
    scale = np.asarray(batch_size, dtype=np.float64) / np.asarray(init_batch_size, dtype=np.float64)
    return gain(scale, sqr, var) / scale


def pgns(sqr: ArrayLike, var: ArrayLike, init_batch_size: ArrayLike) -> np.ndarray:
    """Pre-conditioned gradient noise scale ``φ = tr(PΣPᵀ)/|Pg|² = var·M0/sqr`` (inf if sqr = 0)."""
    sqr = np.asarray(sqr, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sqr > 0, var * np.asarray(init_batch_size, dtype=np.float64) / sqr, np.inf)


# --------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------


def estimate_from_norms(
    local_sqr: float, total_sqr: float, count: int, scale: float
) -> tuple[float, float]:
    """Unbiased (sqr, var) from ``count`` micro-batch gradients of a step at scale ``S``.

    ``local_sqr`` is the mean over micro-batches of ``|P ĝ_i|²`` and ``total_sqr`` is ``|P ĝ|²`` for
    their mean ĝ. Each micro-batch holds ``M/count`` examples, so
    ``E[local] = |g|² + count·tr(Σ)/M`` and ``E[total] = |g|² + tr(Σ)/M``; solving gives
    ``sqr = (count·total − local)/(count − 1)`` and ``var = (local − total)·S/(count − 1)``
    (variance at batch M0). Single estimates may be negative; the smoother floors the averages.
    """
    if count < 2:
        raise ValueError(f"count: need at least 2 micro-batch gradients, got {count}")
    n = float(count)
    sqr = (n * total_sqr - local_sqr) / (n - 1.0)
    var = (local_sqr - total_sqr) * float(scale) / (n - 1.0)
    return sqr, var


def estimate_unequal(
    local_sqr_mean: ArrayLike,
    inv_size_mean: ArrayLike,
    total_sqr: ArrayLike,
    batch_size: ArrayLike,
    init_batch_size: ArrayLike,
) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased (sqr, var) from n micro-batch gradients of UNEQUAL sizes b_i (LB-BSP shares).

    ``local_sqr_mean = (1/n)·Σ|Pĝ_i|²`` (ĝ_i the mean gradient of micro-batch i),
    ``inv_size_mean = h = (1/n)·Σ 1/b_i``, ``total_sqr = |Pĝ|²`` for the size-weighted mean
    ``ĝ = Σ b_i ĝ_i / B`` (the gradient the weighted all-reduce applies) and ``batch_size = B = Σ b_i``.

    Derivation, with ``T = tr(PΣPᵀ)`` the per-example noise: ĝ_i averages b_i independent examples,
    so ``E|Pĝ_i|² = |Pg|² + T/b_i`` and ``E[local_sqr_mean] = |Pg|² + T·h``; ĝ averages all B, so
    ``E[total_sqr] = |Pg|² + T/B``. Subtracting: ``T̂ = (local − total)/(h − 1/B)``, then
    ``sqr = total − T̂/B`` and ``var = T̂/M0``. Both are linear in the two norms, hence unbiased.
    With equal sizes (b_i = B/n, h = n/B) this is exactly :func:`estimate_from_norms`.
    By the AM–HM inequality ``h ≥ n/B``, so ``h − 1/B ≥ (n−1)/B``: positive iff n ≥ 2.
    """
    def _positive(name: str, value: ArrayLike) -> np.ndarray:
        arr = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"{name}: must be finite and positive, got {value!r}")
        return arr

    inv = _positive("inv_size_mean", inv_size_mean)
    big_b = _positive("batch_size", batch_size)
    m0 = _positive("init_batch_size", init_batch_size)
    local = np.asarray(local_sqr_mean, dtype=np.float64)
    total = np.asarray(total_sqr, dtype=np.float64)
    denom = inv - 1.0 / big_b
    if np.any(denom <= 0):
        raise ValueError(f"inv_size_mean: {inv_size_mean!r} must exceed 1/batch_size "
                         "(need at least 2 micro-batches whose sizes sum to batch_size)")
    noise = (local - total) / denom
    return total - noise / big_b, noise / m0


def estimate_differenced(
    prev_sqr: float, cur_sqr: float, mean_sqr: float, scale: float
) -> tuple[float, float]:
    """Biased (sqr, var) for one replica without accumulation, from two consecutive steps.

    ``prev_sqr = |P ĝ(t−1)|²``, ``cur_sqr = |P ĝ(t)|²`` and ``mean_sqr = |P (ĝ(t−1)+ĝ(t))/2|²``. The
    two gradients are treated as two micro-batches of one step at scale 2S; the estimate is biased
    because the weights moved between the steps, so the smoother drops it once real multi-sample
    estimates exist.
    """
    return estimate_from_norms(0.5 * (prev_sqr + cur_sqr), mean_sqr, 2, 2.0 * float(scale))


def estimate_from_grads(
    grads: np.ndarray, scale: float, precond: np.ndarray | None = None
) -> tuple[float, float]:
    """Convenience: (sqr, var) from an ``(n, d)`` array of micro-batch gradients.

    ``precond`` is the diagonal of P (for Adam, ``1/(sqrt(v̂) + eps)``); identity when None.
    """
    grads = np.asarray(grads, dtype=np.float64)
    if grads.ndim != 2:
        raise ValueError(f"grads: expected an (n, d) array, got shape {grads.shape}")
    if precond is not None:
        grads = grads * np.asarray(precond, dtype=np.float64)
    local_sqr = float(np.mean(np.sum(grads * grads, axis=1)))
    mean = grads.mean(axis=0)
    total_sqr = float(mean @ mean)
    return estimate_from_norms(local_sqr, total_sqr, grads.shape[0], scale)


# --------------------------------------------------------------------------------------------
# Smoothing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ema:
    """Bias-corrected EMA of (sqr, var): stores the raw averages and the weight ``1 − Π decay``."""

    sqr: float = 0.0
    var: float = 0.0
    weight: float = 0.0

    def update(self, sqr: float, var: float, decay: float) -> _Ema:
        keep = decay
        return _Ema(
            sqr=keep * self.sqr + (1.0 - keep) * sqr,
            var=keep * self.var + (1.0 - keep) * var,
            weight=keep * self.weight + (1.0 - keep),
        )


@dataclass(frozen=True, slots=True)
class GradNoiseState:
    """Smoothed gradient statistics of one optimiser parameter group (immutable; easy to checkpoint).

    ``sqr`` and ``var`` are averaged separately (ratio of averages, which is less biased than an
    average of ratios) with a per-step decay of ``0.999 ** S``, so a step at a larger batch counts
    for as many M0-steps as it covers. Estimates from the differenced single-replica estimator are
    kept apart and used only until the first multi-sample estimate arrives.
    """

    unbiased: _Ema = _Ema()
    biased: _Ema = _Ema()

    def update(self, sqr: float, var: float, scale: float, *, biased: bool = False) -> GradNoiseState:
        """Return the state after one step's estimate. Non-finite estimates are skipped."""
        if not (math.isfinite(sqr) and math.isfinite(var)):
            return self
        scale = check_number("scale", scale, minimum=1e-12)
        decay = EMA_DECAY**scale
        if biased:
            return replace(self, biased=self.biased.update(sqr, var, decay))
        return replace(self, unbiased=self.unbiased.update(sqr, var, decay))

    @property
    def has_unbiased(self) -> bool:
        return self.unbiased.weight > 0.0

    def stats(self) -> GradStats:
        """Current smoothed statistics, floored (sqr ≥ 0, var ≥ 1e-6); the pessimistic start if empty."""
        ema = self.unbiased if self.unbiased.weight > 0.0 else self.biased
        if ema.weight <= 0.0:
            sqr, var = INITIAL_STATS.sqr, INITIAL_STATS.var
        else:
            sqr, var = ema.sqr / ema.weight, ema.var / ema.weight
        return GradStats(sqr=max(sqr, 0.0), var=max(var, VAR_FLOOR))

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            "unbiased": {"sqr": self.unbiased.sqr, "var": self.unbiased.var,
                         "weight": self.unbiased.weight},
            "biased": {"sqr": self.biased.sqr, "var": self.biased.var,
                       "weight": self.biased.weight},
        }

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, float]]) -> GradNoiseState:
        return cls(unbiased=_Ema(**data["unbiased"]), biased=_Ema(**data["biased"]))


def combine_groups(states: list[GradNoiseState] | tuple[GradNoiseState, ...]) -> GradStats:
    """Statistics of a model whose optimiser has several parameter groups: sums of sqr and var."""
    if not states:
        return GradStats(sqr=max(INITIAL_STATS.sqr, 0.0), var=max(INITIAL_STATS.var, VAR_FLOOR))
    per_group = [s.stats() for s in states]
    return GradStats(sqr=sum(s.sqr for s in per_group), var=sum(s.var for s in per_group))


# --------------------------------------------------------------------------------------------
# Learning-rate scaling rules
# --------------------------------------------------------------------------------------------


class ScalingRule(Protocol):
    """``rule(scale, stats, epoch) -> λ``: factor applied to the base learning rate each step."""

    def __call__(self, scale: float, stats: GradStats, epoch: float = 0.0) -> float: ...


@dataclass(frozen=True, slots=True)
class AdaScale:
    """λ = gain(S): the default for SGD (with or without momentum)."""

    def __call__(self, scale: float, stats: GradStats, epoch: float = 0.0) -> float:
        return float(gain(scale, stats.sqr, stats.var))


@dataclass(frozen=True, slots=True)
class SquareRoot:
    """λ = sqrt(gain(S)) (AdamScale, the default for Adam/AdamW), or plain sqrt(S) if ``plain``."""

    plain: bool = False

    def __call__(self, scale: float, stats: GradStats, epoch: float = 0.0) -> float:
        if self.plain:
            return math.sqrt(scale)
        return math.sqrt(float(gain(scale, stats.sqr, stats.var)))


@dataclass(frozen=True, slots=True)
class Linear:
    """λ = S (the linear scaling rule)."""

    def __call__(self, scale: float, stats: GradStats, epoch: float = 0.0) -> float:
        return float(scale)


@dataclass(frozen=True, slots=True)
class LEGW:
    """Linear-epoch gradual warm-up: ramp linearly over ``warmup_epochs·S`` epochs, then sqrt(S)."""

    warmup_epochs: float = 1.0

    def __post_init__(self) -> None:
        check_number("warmup_epochs", self.warmup_epochs)

    def __call__(self, scale: float, stats: GradStats, epoch: float = 0.0) -> float:
        target = math.sqrt(scale)
        span = self.warmup_epochs * scale
        if span <= 0.0 or epoch >= span:
            return target
        return target * max(epoch, 0.0) / span


def scaling_rule_for(optimizer_name: str) -> ScalingRule:
    """Default rule for an optimiser class name: square-root for the Adam family, AdaScale otherwise."""
    return SquareRoot() if optimizer_name.lower().startswith("adam") else AdaScale()
