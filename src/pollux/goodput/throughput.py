"""The throughput model of SPEC §3 and its fit from observed step times.

The model predicts the time of one optimiser step for ``K`` replicas on ``N`` nodes with local batch
``m`` and ``s`` gradient-accumulation steps::

    T_grad(m)       = α_grad + β_grad·m
    T_sync(K, N)    = 0 (K = 1) | α_local + β_local·(K−2) (N = 1) | α_node + β_node·(K−2)
    T_iter          = s·T_grad + (T_grad^γ + T_sync^γ)^(1/γ)

Seven parameters are enough to extrapolate from the few configurations a job has run to every
allocation the scheduler may consider; the exploration priors make an unexplored dimension look
cheap (perfect scaling), which draws the scheduler to try it and so measure it.

The fit of these parameters to a job's step times is :mod:`pollux.goodput.throughput_fit`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.records import ThroughputParams

__all__ = ["PARAM_NAMES", "overlap", "t_grad", "t_iter", "t_sync", "throughput"]

#: The seven parameters in their array order (``ThroughputParams.as_array``).
PARAM_NAMES = ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node", "gamma")
_AG, _BG, _AL, _BL, _AN, _BN, _GAMMA = range(7)


def _params_array(params: ThroughputParams | ArrayLike) -> np.ndarray:
    if isinstance(params, ThroughputParams):
        return np.array(params.as_array(), dtype=np.float64)
    return np.asarray(params, dtype=np.float64)


def t_grad(params: ThroughputParams | ArrayLike, local_bsz: ArrayLike) -> np.ndarray:
    """Time of one forward/backward pass over a local batch of ``local_bsz`` examples."""
    p = _params_array(params)
    return p[_AG] + p[_BG] * np.asarray(local_bsz, dtype=np.float64)


def t_sync(params: ThroughputParams | ArrayLike, nodes: ArrayLike, replicas: ArrayLike) -> np.ndarray:
    """Time of the gradient all-reduce of one optimiser step (zero for a single replica)."""
    p = _params_array(params)
    nodes = np.asarray(nodes)
    replicas = np.asarray(replicas, dtype=np.float64)
    local = p[_AL] + p[_BL] * (replicas - 2.0)
    remote = p[_AN] + p[_BN] * (replicas - 2.0)
    out = np.where(nodes <= 1, local, remote)
    return np.where(replicas <= 1, 0.0, out)


def overlap(tg: np.ndarray, ts: np.ndarray, gamma: float) -> np.ndarray:
    """``(tg^γ + ts^γ)^(1/γ)`` computed without overflow or underflow."""
    top = np.maximum(tg, ts)
    safe = np.where(top > 0.0, top, 1.0)
    return top * ((tg / safe) ** gamma + (ts / safe) ** gamma) ** (1.0 / gamma)


def t_iter(
    params: ThroughputParams | ArrayLike,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> np.ndarray:
    """Seconds per optimiser step: ``s`` accumulation passes plus one overlapped pass-and-sync."""
    p = _params_array(params)
    tg = t_grad(p, local_bsz)
    ts = t_sync(p, nodes, replicas)
    return np.asarray(accum_steps, dtype=np.float64) * tg + overlap(tg, ts, p[_GAMMA])


def throughput(
    params: ThroughputParams | ArrayLike,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> np.ndarray:
    """Examples per second: ``M / T_iter`` with ``M = K·m·(s+1)``."""
    replicas_f = np.asarray(replicas, dtype=np.float64)
    m = np.asarray(local_bsz, dtype=np.float64)
    s = np.asarray(accum_steps, dtype=np.float64)
    return replicas_f * m * (s + 1.0) / t_iter(params, nodes, replicas, local_bsz, accum_steps)
