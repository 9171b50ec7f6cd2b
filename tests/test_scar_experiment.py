"""The rework harness on a model whose answers are known in closed form.

`Decay` is gradient descent on a diagonal quadratic: deterministic and independent of the
iteration number, so a full recovery from a checkpoint taken ``k`` iterations before the failure
costs exactly ``k`` iterations, which pins the harness's order of events down to the step.
"""

from __future__ import annotations

import numpy as np
import pytest

from pollux.scar.api import BlockLayout, Protocol, ReworkModel, ScarError
from pollux.scar.rework.experiment import (
    checkpoint_trials,
    failure_iterations,
    lost_blocks,
    recovery_trials,
    reduction,
    run_trials,
    unperturbed,
)


class Decay(ReworkModel):
    name = "decay"
    protocol = Protocol(converge_iterations=120, checkpoint_interval=16, failure_mean=40)

    def __init__(self, n: int = 64, blocks: int = 16, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rate = np.exp(rng.uniform(np.log(0.01), np.log(0.08), n))
        self.target = rng.normal(size=n)
        self.layouts = {"rows": BlockLayout({"w": rng.permutation(np.arange(n) % blocks)}, blocks)}

    def init_state(self, trials: int) -> dict[str, np.ndarray]:
        return {"w": np.zeros((trials, self.rate.size))}

    def step(self, state: dict[str, np.ndarray], iteration: int) -> dict[str, np.ndarray]:
        return {"w": state["w"] - self.rate * (state["w"] - self.target)}

    def loss(self, state: dict[str, np.ndarray]) -> np.ndarray:
        return 0.5 * (self.rate * (state["w"] - self.target) ** 2).sum(axis=1)


def test_failure_iterations_are_truncated_geometric_and_seeded() -> None:
    a = failure_iterations(np.random.default_rng(3), 20000, 50.0, 99)
    b = failure_iterations(np.random.default_rng(3), 20000, 50.0, 99)
    assert np.array_equal(a, b)
    assert a.min() >= 1 and a.max() <= 99
    wide = failure_iterations(np.random.default_rng(4), 20000, 20.0, 10**6)
    assert abs(wide.mean() - 20.0) < 0.6  # untruncated: the geometric mean


def test_lost_blocks_are_exactly_the_fraction() -> None:
    lost = lost_blocks(np.random.default_rng(0), 500, 32, 0.25)
    assert (lost.sum(axis=1) == 8).all()
    # every block is lost about equally often
    assert lost.mean(axis=0).min() > 0.18 and lost.mean(axis=0).max() < 0.32


def test_full_recovery_costs_exactly_the_iterations_since_the_checkpoint() -> None:
    m = Decay()
    res = recovery_trials(m, 0.5, "full", trials=60, seed=1)
    period = m.protocol.checkpoint_interval
    since = res.failure_iteration - period * ((res.failure_iteration - 1) // period)
    assert res.unconverged == 0
    assert np.array_equal(res.rework, since.astype(float))


def test_the_recorded_perturbation_is_the_jump_the_recovery_made() -> None:
    m = Decay()
    full = recovery_trials(m, 0.5, "full", trials=40, seed=3)
    part = recovery_trials(m, 0.25, "partial", trials=40, seed=3)
    assert np.array_equal(full.failure_iteration, part.failure_iteration)  # paired trials

    def w(t: np.ndarray) -> np.ndarray:  # the closed-form state after t steps, per trial
        return m.target * (1.0 - (1.0 - m.rate) ** t[:, None])

    period = m.protocol.checkpoint_interval
    fail = full.failure_iteration
    saved = period * ((fail - 1) // period)
    jump = w(saved) - w(fail)
    np.testing.assert_allclose(full.perturbation, np.linalg.norm(jump, axis=1), rtol=1e-9)
    # partial recovery jumps only in the lost blocks: never further than full recovery
    assert (part.perturbation <= full.perturbation + 1e-12).all()
    assert part.perturbation.mean() < 0.8 * full.perturbation.mean()
    assert part.to_dict()["perturbation_mean"] == pytest.approx(part.perturbation.mean(), abs=1e-6)


def test_partial_recovery_is_cheaper_and_ordered_by_lost_fraction() -> None:
    m = Decay()
    full = recovery_trials(m, 0.5, "full", trials=60, seed=2)
    parts = [recovery_trials(m, p, "partial", trials=60, seed=2).mean for p in (0.25, 0.5, 0.75)]
    assert parts[0] < parts[1] < parts[2] < full.mean
    # losing every block is a full recovery
    everything = recovery_trials(m, 1.0, "partial", trials=60, seed=2)
    assert np.array_equal(everything.rework, full.rework)


def test_priority_checkpoints_beat_traditional_ones_and_random_does_not() -> None:
    m = Decay()
    full = recovery_trials(m, 0.5, "full", trials=60, seed=0)
    prio = checkpoint_trials(m, "priority", 1 / 8, 0.5, "partial", trials=60, seed=0)
    rand = checkpoint_trials(m, "random", 1 / 8, 0.5, "partial", trials=60, seed=0)
    assert reduction(prio, full) > 0.4
    assert prio.mean < rand.mean


def test_same_seed_same_result_and_baseline_is_the_unperturbed_run() -> None:
    m = Decay()
    a = checkpoint_trials(m, "random", 1 / 4, trials=30, seed=5)
    b = checkpoint_trials(m, "random", 1 / 4, trials=30, seed=5)
    assert np.array_equal(a.rework, b.rework)
    base = unperturbed(m)
    assert base.iterations == m.protocol.converge_iterations  # the loss decreases strictly
    assert a.to_dict()["baseline_iterations"] == base.iterations
    assert np.isfinite(a.ci95) and a.ci95 > 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"recovery": "some"}, "recovery"),
        ({"strategy": "best"}, "strategy"),
        ({"fraction": 0.0}, "fraction"),
        ({"lost_fraction": 1.5}, "lost_fraction"),
        ({"trials": 0}, "trials"),
        ({"layout": "cols"}, "layout"),
    ],
)
def test_bad_settings_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ScarError, match=field):
        run_trials(Decay(), **kw)  # type: ignore[arg-type]
