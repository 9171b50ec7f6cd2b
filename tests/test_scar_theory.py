"""Theorems 5.3.1 and 5.4.2 checked numerically (pollux.scar.rework.theory).

Theorem 5.3.1 on gradient descent on a quadratic program: no trial's rework may exceed its bound,
and the bound must not be vacuous — perturbations pointing away from the optimum meet it (the
thesis's tightness remark), random ones come close in some trials. Theorem 5.4.2 on a real MLR
checkpoint/current pair: the partial-recovery perturbation carries the lost fraction of the
full-recovery perturbation's squared norm. Last, the bound evaluated on the experiments' measured
perturbations (`pollux.scar.rework.prediction`), on a QP whose contraction is known exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pollux.scar.api import BlockLayout, ScarError
from pollux.scar.rework.experiment import recovery_trials
from pollux.scar.rework.models import mlr
from pollux.scar.rework.models.qp import QuadraticProgram
from pollux.scar.rework.prediction import predict, trajectory
from pollux.scar.rework.theory import (
    block_perturbation_ratio,
    bound_qp,
    perturbation_ratio,
    rework_bound_trials,
)


@pytest.mark.parametrize("kind", ["random", "adversarial", "mixed"])
def test_no_qp_trial_exceeds_the_rework_bound(kind: str) -> None:
    check = rework_bound_trials(trials=400, kind=kind, seed=3)
    assert check.unconverged == 0
    assert check.violations == 0
    assert (check.rework <= check.bound + 1e-9).all()
    # the unperturbed run is the baseline: κ(w, ε) = N, settled one step later
    assert check.baseline_iterations == check.converge_iterations + 1
    assert check.bound.max() > 10  # perturbations large enough to matter
    json.dumps(check.to_dict())


def test_the_bound_is_tight_for_perturbations_away_from_the_optimum() -> None:
    check = rework_bound_trials(trials=300, kind="adversarial", seed=1)
    # the error stays on the slowest eigenvector: rework is exactly ⌊bound⌋ (5.6 with equality)
    assert np.mean(check.rework == np.floor(check.bound)) > 0.98
    assert check.tightness > 0.95


def test_random_perturbations_come_near_the_bound_but_can_also_help() -> None:
    check = rework_bound_trials(trials=400, kind="random", seed=2)
    assert check.tightness > 0.5  # some trial gets within a factor 2 of its bound
    assert (check.rework < 0).any()  # a perturbation towards w* saves iterations
    assert check.rework.mean() < 0.5 * check.bound.mean()


def test_rework_bound_is_seeded() -> None:
    a = rework_bound_trials(trials=50, seed=7)
    b = rework_bound_trials(trials=50, seed=7)
    assert np.array_equal(a.rework, b.rework) and np.array_equal(a.bound, b.bound)


def test_bound_needs_a_contraction_and_sane_settings() -> None:
    assert 0 < bound_qp().contraction < 1
    with pytest.raises(ScarError, match="kind"):
        rework_bound_trials(trials=10, kind="sideways")
    with pytest.raises(ScarError, match="last_perturbation"):
        rework_bound_trials(trials=10, converge_iterations=50, last_perturbation=50)
    with pytest.raises(ScarError, match="scale"):
        rework_bound_trials(trials=10, scale=(1.0, 0.1))


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_partial_perturbation_carries_the_lost_fraction(p: float) -> None:
    model = mlr.make(samples=300)
    ratio = perturbation_ratio(model, p, checkpoint_at=20, failure_at=30, trials=2000)
    assert abs(ratio.mean - p) <= 0.05
    assert ratio.lost_blocks == round(p * ratio.num_blocks)
    assert ratio.error == pytest.approx(abs(ratio.mean - p))
    json.dumps(ratio.to_dict())


def test_perturbation_ratio_on_known_blocks() -> None:
    # block 0 holds all of δ: losing it gives ratio 1, losing anything else 0; mean = P(lose 0)
    layout = BlockLayout({"x": np.array([0, 1, 2, 3])}, 4)
    current = {"x": np.array([[[3.0], [0.0], [0.0], [0.0]]])}
    saved = {"x": np.zeros((1, 4, 1))}
    ratio = block_perturbation_ratio(current, saved, layout, 0.25, trials=4000, seed=0)
    assert ratio.full_norm_sq == pytest.approx(9.0)
    assert abs(ratio.mean - 0.25) < 0.03
    with pytest.raises(ScarError, match="nothing to compare"):
        block_perturbation_ratio(saved, saved, layout, 0.5)
    with pytest.raises(ScarError, match="trial axis"):
        block_perturbation_ratio({"x": np.zeros((2, 4, 1))}, {"x": np.ones((2, 4, 1))}, layout, 0.5)


# -- Theorem 5.3.1's prediction for the experiments (pollux.scar.rework.prediction) ---------------


def _slow_qp() -> QuadraticProgram:
    # error on a slowest eigenvector: every step shrinks it by exactly c, so (5.3) is tight
    return QuadraticProgram(dim=8, blocks=8, min_eig=0.02, max_eig=1.0, rotate=True, start="slowest")


def test_prediction_is_exact_for_full_recovery_when_contraction_is_tight() -> None:
    model = _slow_qp()
    full = recovery_trials(model, 0.5, "full", trials=120, seed=0)
    part = recovery_trials(model, 0.25, "partial", trials=120, seed=0)
    out = predict(model, {"full": full, "partial 1/4": part})
    assert out["contraction"] == pytest.approx(model.contraction, rel=1e-6)
    # restoring w(T0) from w(T) along the slowest direction costs exactly T − T0: so does the bound
    assert out["points"]["full"]["bound_mean"] == pytest.approx(full.mean, abs=1e-3)
    partial = out["points"]["partial 1/4"]
    assert partial["jump_rms_ratio"] == pytest.approx(0.5, abs=0.08)  # Theorem 5.4.2: √p
    assert partial["measured_mean"] <= partial["bound_mean"]  # a bound, on a model that meets (5.5)
    assert 0 < partial["predicted_reduction"] < 1
    assert partial["measured_reduction"] == pytest.approx(1 - part.mean / full.mean, abs=1e-4)


def test_trajectory_measures_the_contraction() -> None:
    model = _slow_qp()
    path = trajectory(model, limit_factor=4)
    n = model.protocol.converge_iterations
    assert path.errors.shape == (n + 1,) and path.limit_iterations == 4 * n
    ratios = path.errors[1:] / path.errors[:-1]
    np.testing.assert_allclose(ratios, model.contraction, rtol=1e-4)


def test_prediction_needs_a_baseline_and_measured_jumps() -> None:
    model = _slow_qp()
    full = recovery_trials(model, 0.5, "full", trials=10, seed=0)
    with pytest.raises(ScarError, match="baseline"):
        predict(model, {"full": full}, baseline="none")
    bare = recovery_trials(model, 0.5, "full", trials=10, seed=0)
    bare.perturbation = np.zeros(0)
    with pytest.raises(ScarError, match="perturbation"):
        predict(model, {"full": bare})
    with pytest.raises(ScarError, match="limit_factor"):
        trajectory(model, limit_factor=1)
