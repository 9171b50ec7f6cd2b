"""What Theorems 5.3.1 and 5.4.2 predict for the rework experiments, from what the experiments measure.

A failure at iteration T makes one jump δ: the recovery moves the state from w⁽ᵀ⁾ to the restored
values (the harness records ‖δ‖ per trial, `ReworkResult.perturbation`). Theorem 5.3.1 applied
from iteration T, with a single perturbation and the unperturbed run as the baseline, bounds that
trial's rework by

    π ≤ log(1 + ‖δ‖ / e_T) / log(1/c),        e_T = ‖w⁽ᵀ⁾ − w*‖,

where c is the contraction per iteration. Two regimes follow, and they are what decides how much
partial recovery and priority can save:

* ‖δ‖ ≪ e_T (the jump is small beside the error still to be removed): π ≈ ‖δ‖ / (e_T log(1/c)),
  linear in ‖δ‖, so shrinking the jump by a factor shrinks the rework by the same factor;
* ‖δ‖ ≫ e_T (the run has converged far beyond the restored values): π ≈ log(‖δ‖/e_T) / log(1/c),
  so shrinking the jump by a factor f saves only log(f)/log(1/c) iterations — with partial recovery
  of a fraction p (Theorem 5.4.2: E‖δ′‖² = p‖δ‖², so ‖δ′‖ ≈ √p‖δ‖) a fixed ½·log(1/p)/log(1/c),
  whatever the rework of full recovery was.

`predict` evaluates the bound per trial from the measured ‖δ‖ and the unperturbed run's e_T, and
reports, per experiment point, the predicted reduction 1 − mean(bound) / mean(bound of full
recovery) next to the measured one. The ratio does not depend on c (the same c divides both), so
only the distances matter; c (from the unperturbed run) only scales the bounds to iterations.

How w* and c are estimated (thesis §5.5.2: "the value of c is determined empirically"): w* is the
unperturbed run's state after `limit_factor` × `converge_iterations` steps, e_t the distance of
its state after t steps from that (L2 over the tensors the model's distances rank), and c the
average contraction (e_N / e_0)^(1/N) over the protocol's N steps. For the non-convex models (CNN,
MF's rotations) and minibatch training the assumptions (5.3) and (5.5) hold only roughly, so the
bound is a guide to the size of the reductions, not a guarantee (docs/scar.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.scar.api import ReworkModel, ScarError
from pollux.scar.rework.experiment import ReworkResult, jump_norm


@dataclass(frozen=True)
class Trajectory:
    """The unperturbed run measured against its own limit: what Theorem 5.3.1 is stated in."""

    errors: np.ndarray  # (N + 1,) e_t = ‖w⁽ᵗ⁾ − w*‖ for t = 0 … N
    contraction: float  # c = (e_N / e_0)^(1/N)
    limit_iterations: int  # the steps after which the state is taken as w*


@dataclass(frozen=True)
class PointPrediction:
    """Theorem 5.3.1's bound at one experiment point, beside what the point measured."""

    label: str
    jump_mean: float  # mean ‖δ‖
    jump_rms_ratio: float  # sqrt(mean ‖δ‖² / mean ‖δ_full‖²), paired trials (Theorem 5.4.2: √p)
    relative_jump: float  # mean ‖δ‖ / e_T
    bound_mean: float  # mean of log(1 + ‖δ‖/e_T) / log(1/c)
    measured_mean: float  # the point's mean rework
    predicted_reduction: float  # 1 − bound_mean / bound_mean of the baseline
    measured_reduction: float  # 1 − measured_mean / measured mean of the baseline

    def to_dict(self) -> dict[str, Any]:
        return {
            "jump_mean": round(self.jump_mean, 6),
            "jump_rms_ratio": round(self.jump_rms_ratio, 4),
            "relative_jump": round(self.relative_jump, 4),
            "bound_mean": round(self.bound_mean, 4),
            "measured_mean": round(self.measured_mean, 4),
            "predicted_reduction": round(self.predicted_reduction, 4),
            "measured_reduction": round(self.measured_reduction, 4),
        }


def trajectory(model: ReworkModel, layout: str | None = None, limit_factor: int = 10) -> Trajectory:
    """The unperturbed run's distances e_t from its state after `limit_factor` × N steps, and c."""
    if limit_factor < 2:
        raise ScarError(f"limit_factor: must be >= 2, got {limit_factor}")
    name = layout if layout is not None else next(iter(model.layouts))
    if name not in model.layouts:
        raise ScarError(f"layout: {model.name} has {', '.join(model.layouts)}, got {name!r}")
    lay = model.layouts[name]
    n = model.protocol.converge_iterations
    limit = limit_factor * n
    state = model.init_state(1)
    early = [state]
    for t in range(limit):
        state = model.step(state, t)
        if t < n:
            early.append(state)
    errors = np.array([float(jump_norm(model, lay, s, state)[0]) for s in early])
    if not (np.all(np.isfinite(errors)) and errors[0] > 0 and errors[n] > 0):
        raise ScarError(f"{model.name}: the unperturbed run has no usable distance to its limit")
    contraction = float((errors[n] / errors[0]) ** (1.0 / n))
    return Trajectory(errors=errors, contraction=contraction, limit_iterations=limit)


def _bounds(result: ReworkResult, path: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """Per trial: ‖δ‖ / e_T and the bound log(1 + ‖δ‖/e_T) / log(1/c)."""
    if result.perturbation.size != result.trials:
        raise ScarError(f"{result.model}: the result records no perturbation sizes")
    e_t = path.errors[result.failure_iteration]
    relative = result.perturbation / e_t
    return relative, np.log1p(relative) / np.log(1.0 / path.contraction)


def predict(
    model: ReworkModel,
    points: Mapping[str, ReworkResult],
    baseline: str = "full",
    layout: str | None = None,
    limit_factor: int = 10,
) -> dict[str, Any]:
    """Theorem 5.3.1's bound for every point of `points` (labels → results of one model and layout,
    all with the same seed so that trials pair up), reductions against the point named `baseline`."""
    if baseline not in points:
        raise ScarError(f"baseline: {baseline!r} is not one of the points ({', '.join(points)})")
    path = trajectory(model, layout, limit_factor)
    base = points[baseline]
    _, base_bound = _bounds(base, path)
    base_sq = float(np.mean(base.perturbation**2))
    if not base_sq > 0:
        raise ScarError(f"{model.name}: the baseline point {baseline!r} made no jump (‖δ‖ = 0)")
    out: dict[str, Any] = {}
    for label, res in points.items():
        relative, bound = _bounds(res, path)
        prediction = PointPrediction(
            label=label,
            jump_mean=float(res.perturbation.mean()),
            jump_rms_ratio=float(np.sqrt(np.mean(res.perturbation**2) / base_sq)),
            relative_jump=float(relative.mean()),
            bound_mean=float(bound.mean()),
            measured_mean=res.mean,
            predicted_reduction=1.0 - float(bound.mean()) / float(base_bound.mean()),
            measured_reduction=1.0 - res.mean / base.mean if base.mean > 0 else float("nan"),
        )
        out[label] = prediction.to_dict()
    return {
        "contraction": round(path.contraction, 5),
        "limit_iterations": path.limit_iterations,
        "baseline": baseline,
        "points": out,
    }
