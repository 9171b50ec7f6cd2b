"""Lower bounds on a hyper-parameter study's makespan and mean trial JCT (pollux.sim.study_bound):
closed forms where scaling is perfect or absent, and no feasible schedule below them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pollux.sim.study_bound import makespan_bound, mean_jct_bound, trial_cost

GPUS = 8


def rates_of(per_gpu: np.ndarray, epochs: int = 3) -> np.ndarray:
    """Rates (epochs, GPUS + 1) with the same curve in every epoch."""
    out = np.zeros((epochs, GPUS + 1))
    out[:, 1:] = per_gpu[None, :]
    return out


WORK = np.array([100.0, 200.0, 300.0])      # 600 units of progress in all
K = np.arange(1, GPUS + 1, dtype=np.float64)


def test_perfect_scaling_is_bound_by_the_gpus():
    rates = rates_of(2.0 * K)                 # one GPU does 2 units a second; k GPUs do 2k
    # every run costs 300 GPU-seconds: 40 trials on 8 GPUs need at least 1500 s
    assert makespan_bound(rates, WORK, 40, 4, restart_s=0.0) == pytest.approx(40 * 300 / GPUS)


def test_no_scaling_is_bound_by_the_concurrency():
    rates = rates_of(np.full(GPUS, 2.0))      # 300 s whatever the GPUs
    assert makespan_bound(rates, WORK, 40, 4, restart_s=0.0) == pytest.approx(40 * 300 / 4)
    # the restart is paid once per trial, on one GPU at least: here it lengthens every trial
    assert makespan_bound(rates, WORK, 40, 4, restart_s=30.0) == pytest.approx(40 * 330 / 4)


def test_trial_cost_picks_each_epochs_best_size():
    per_gpu = np.array([1.0, 1.9, 2.7, 3.4, 4.0, 4.5, 4.9, 5.2])
    rates = rates_of(per_gpu)
    for tw, gw in ((1.0, 0.0), (0.0, 1.0), (0.25, 0.125)):
        brute = min(sum((tw + gw * k) * w / per_gpu[k - 1] for w in WORK) for k in range(1, GPUS + 1))
        assert trial_cost(rates, WORK, tw, gw, restart_s=0.0) == pytest.approx(brute)


@pytest.mark.parametrize("share", [1, 2, 4])
def test_waves_of_equal_shares_never_beat_the_bounds(share):
    """A feasible schedule: waves of ``concurrent`` trials on ``share`` GPUs each."""
    per_gpu = np.array([1.0, 1.9, 2.7, 3.4, 4.0, 4.5, 4.9, 5.2])
    rates = rates_of(per_gpu)
    trials, concurrent, restart = 30, GPUS // share, 30.0
    duration = float((WORK / per_gpu[share - 1]).sum()) + restart
    makespan = math.ceil(trials / concurrent) * duration
    assert makespan_bound(rates, WORK, trials, concurrent, restart) <= makespan
    assert mean_jct_bound(rates, WORK, trials, concurrent, restart) <= duration


def test_the_mean_jct_bound_is_at_least_the_fastest_trial():
    rates = rates_of(2.0 * K)
    fastest = float((WORK / (2.0 * GPUS)).sum()) + 30.0
    assert mean_jct_bound(rates, WORK, 2, 4) == pytest.approx(fastest)
    assert makespan_bound(rates, WORK, 0, 4) == 0.0
