"""The shortest a hyper-parameter study could take, for trials that know their true profile: lower
bounds on its makespan and on its mean trial JCT under the study protocol of :mod:`pollux.sim.hpo`.

Why it exists: a target such as "30 % shorter than a static 4 GPUs per trial" can be out of reach of
*every* scheduler on a given profile. Telling that apart from a weak scheduler needs a bound.

The protocol: ``trials`` trials of one application, each doing the profile's whole work (no
pruning), at most ``concurrent`` at a time (the next one is asked the moment one ends), on a
cluster of ``gpus`` GPUs. A trial's possible runs are those of :func:`pollux.sim.scaling_bound.gpu_rates`:
any GPU count in each epoch, at its best placement and batch. The only cost of a change of size is
the first start's restart delay (``restart_s``, on at least one GPU), so real trials are slower.

**Makespan.** With ``d_i`` a trial's duration and ``G_i`` its GPU-seconds, any schedule of length
``T`` has ``Σ d_i ≤ concurrent·T`` (never more trials at once) and ``Σ G_i ≤ gpus·T`` (never more
GPUs). So for every ``λ`` in [0, 1], ``T ≥ Σ_i (λ·d_i/concurrent + (1 − λ)·G_i/gpus)``, which is
at least ``trials·c(λ)``. Here ``c(λ)`` is the least value of that sum for one trial, found epoch by
epoch: pick the GPU count ``k`` minimising ``(λ/concurrent + (1 − λ)·k/gpus)·work/rate(k)``. The
bound is the largest ``trials·c(λ)`` over a grid of ``λ``.

**Mean trial JCT.** Trials are asked the moment one ends, so until the last one is asked exactly
``concurrent`` trials are in the study. The JCTs therefore add up to at least ``concurrent·a``, where
``a`` is the time the last trial is asked. By then ``trials − concurrent`` trials have ended, so
``a`` is at least the makespan bound of that many trials. A trial also never takes less than its
fastest run on every GPU.
"""

from __future__ import annotations

import numpy as np

from pollux.sim.scaling_bound import epoch_times

__all__ = ["makespan_bound", "mean_jct_bound", "trial_cost"]

#: The weights λ tried by :func:`makespan_bound` (0: GPU-bound, 1: concurrency-bound).
DEFAULT_LAMBDAS = np.linspace(0.0, 1.0, 1001)


def trial_cost(rates: np.ndarray, work: np.ndarray, time_weight: float, gpu_weight: float,
               restart_s: float = 30.0) -> float:
    """The least ``time_weight·d + gpu_weight·G`` of one trial (``d`` its duration, ``G`` its
    GPU-seconds) over its possible runs: ``rates`` from :func:`pollux.sim.scaling_bound.gpu_rates`,
    ``work`` the progress of each epoch."""
    times = epoch_times(rates, work)
    gpus = np.arange(1, times.shape[1] + 1)
    per_epoch = ((time_weight + gpu_weight * gpus)[None, :] * times).min(axis=1)
    return float(per_epoch.sum() + (time_weight + gpu_weight) * restart_s)


def makespan_bound(rates: np.ndarray, work: np.ndarray, trials: int, concurrent: int,
                   restart_s: float = 30.0, lambdas: np.ndarray = DEFAULT_LAMBDAS) -> float:
    """Seconds no study of ``trials`` unpruned trials, ``concurrent`` at a time, on the
    ``rates.shape[1] − 1`` GPUs of ``rates`` can finish in less than (see the module docstring)."""
    if trials <= 0:
        return 0.0
    gpus = rates.shape[1] - 1
    best = max(trial_cost(rates, work, lam / concurrent, (1.0 - lam) / gpus, restart_s) for lam in lambdas)
    return trials * best


def mean_jct_bound(rates: np.ndarray, work: np.ndarray, trials: int, concurrent: int,
                   restart_s: float = 30.0) -> float:
    """Seconds the mean trial JCT of such a study cannot go below (see the module docstring)."""
    fastest = float(epoch_times(rates, work)[:, -1].sum() + restart_s)
    asked_last = makespan_bound(rates, work, trials - concurrent, concurrent, restart_s)
    return max(fastest, concurrent * asked_last / trials)
