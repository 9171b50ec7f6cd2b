"""The simulator's model of slow nodes and of LB-BSP batch balancing inside a job (SPEC §10).

A node may run at a speed factor ``f`` in (0, 1]: a replica on it computes at ``f`` times the speed
the profile measured, so its compute time at local batch ``x`` is ``t(x) / f``; synchronisation (the
profile's exposed ``sync_time``) is not slowed. A synchronous step waits for its slowest replica:

* **equal local batches** (no balancing): every replica computes ``m`` examples, so the step's
  compute time is ``t(m) / min f``;
* **balanced local batches** (LB-BSP): the ``r·m`` examples of a micro-step are split into shares
  ``x_i`` so that every replica finishes together. With ``t`` linearised around ``m`` as
  ``t(x) = a + b·x`` (the secant of the profile through ``m`` and ``m/2``), share ``x_i`` takes
  ``(a + b·x_i)/f_i``; the common time ``τ`` with ``Σ x_i = r·m`` is ``t(m) / mean f`` exactly
  when no share reaches a bound. Shares are kept within the job's local-batch bounds ``[lo, hi]``
  (memory, the agent's limits): a fast replica cannot take more than ``hi`` and a straggler no
  fewer than ``lo``, so the step takes the longest of the bounded replicas' times
  (:func:`balanced_compute_time`, with ``pollux.balance.balancers.equal_finish_split``, the same
  balance point the agent's shares round; shares are continuous here).

The simulated agent observes (and fits its throughput model on) the step times this model gives, so
the policy sees the throughput a job really achieves on its nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pollux.balance.balancers import equal_finish_split

__all__ = ["balanced_compute_time", "check_node_speed", "slow_node_speeds"]


def slow_node_speeds(num_nodes: int, slow_nodes: int, factor: float) -> tuple[float, ...]:
    """Speed factors of ``num_nodes`` nodes of which the first ``slow_nodes`` run at ``factor``."""
    if not 0 <= slow_nodes <= num_nodes:
        raise ValueError(f"slow_nodes: must be in [0, {num_nodes}], got {slow_nodes}")
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise ValueError(f"slow_factor: must be in (0, 1], got {factor}")
    return tuple([float(factor)] * slow_nodes + [1.0] * (num_nodes - slow_nodes))


def check_node_speed(speeds: Sequence[float], num_nodes: int) -> None:
    """Raise ``ValueError`` naming ``node_speed`` unless it holds at most ``num_nodes`` factors in (0, 1]."""
    if len(speeds) > num_nodes:
        raise ValueError(f"node_speed: {len(speeds)} factors for {num_nodes} nodes")
    for i, f in enumerate(speeds):
        if not (isinstance(f, int | float) and math.isfinite(f) and 0 < f <= 1):
            raise ValueError(f"node_speed.{i}: must be a number in (0, 1], got {f!r}")


def balanced_compute_time(speeds: np.ndarray, t_m: float, t_half: float, m: float, lo: float,
                          hi: float) -> float:
    """Compute time of one micro-step with LB-BSP shares on replicas of speed factors ``speeds``.

    ``t_m`` and ``t_half`` are the profile's compute times (``step − sync``) at local batches ``m`` and
    ``m/2``; their secant linearises ``t`` (``t_half`` not finite, or a secant with a negative
    intercept or no slope, falls back to ``t`` proportional to the batch). Equal speeds give ``t_m``.
    """
    f = np.asarray(speeds, dtype=np.float64)
    if f.size <= 1 or float(f.min()) >= 1.0:
        return t_m / float(f.min()) if f.size else t_m
    lo, hi = min(lo, m), max(hi, m)
    beta = (t_m - t_half) / (m - m / 2) if math.isfinite(t_half) and m > 0 else math.nan
    alpha = t_m - beta * m
    if not (math.isfinite(beta) and beta > 0 and alpha >= 0):
        alpha, beta = 0.0, t_m / m if m > 0 else 0.0
    if not beta > 0:
        return t_m / float(f.min())
    _, tau = equal_finish_split(f, alpha, beta, f.size * m, lo, hi)
    return tau
