"""The SPEC's step-time formulas in plain Python, independent of `pollux.goodput`'s vectorised
code: the reference the throughput and goodput-model tests compare against."""

from __future__ import annotations

from pollux.goodput import ThroughputParams


def overlap(tg: float, ts: float, gamma: float) -> float:
    """(tg^γ + ts^γ)^(1/γ): a pass and its synchronisation, overlapped."""
    return (tg**gamma + ts**gamma) ** (1.0 / gamma)


def t_grad(p: ThroughputParams, m: float) -> float:
    """Seconds of one forward/backward pass over a local batch of `m`."""
    return p.alpha_grad + p.beta_grad * m


def t_sync(p: ThroughputParams, n: int, k: int) -> float:
    """Seconds of one gradient synchronisation of `k` replicas on `n` nodes (none for one replica)."""
    if k == 1:
        return 0.0
    if n == 1:
        return p.alpha_local + p.beta_local * (k - 2)
    return p.alpha_node + p.beta_node * (k - 2)


def t_iter(p: ThroughputParams, n: int, k: int, m: float, s: int = 0) -> float:
    """Seconds of one optimiser step: `s` accumulation passes, then a pass overlapped with its sync."""
    tg = t_grad(p, m)
    return s * tg + overlap(tg, t_sync(p, n, k), p.gamma)
