"""The threshold rule on a cloud of several GPU types: a node count per type, priced.

:class:`pollux.policy.autoscale.rules.ThresholdRule` comes here when its fleet has pools
(:attr:`Fleet.pools`). The thresholds, the cooldown, "nothing to run" and the one-GPU-per-job floor
are the untyped rule's; what changes is what a size is. Sizes are read along the path of
:mod:`.typed_utility` (one node at a time, the best utility per price first), with ``E`` of the held
vector read directly (the fleet may hold a mix that is not on the path):

* **grow** when ``E(held) > grow_above`` and the path's largest step with ``E ≥ grow_to`` holds more
  nodes of some type than the fleet does: to that step's nodes, keeping every node already held
  (nodes held of another type go only through a shrink, which waits for the cooldown: each was paid
  for since it was asked for);
* **shrink** when ``E(held) < shrink_below``, nothing is on its way and the cooldown has passed: to
  that step's nodes (types not on it are given back);
* **floor**: never fewer GPUs than jobs: at least the first step of the path that holds a GPU per
  job (the cheapest such mix by the path's order);
* every type within its pool's ``min_nodes``..``max_nodes``.

With one pool the path is 1, 2, …, ``max_nodes`` and each case above is the untyped case, so the
decision (target, reason, efficiency, utility) is the untyped rule's; ``tests/test_autoscale_typed.py``
checks it on random cases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pollux.policy.autoscale.api import AutoscaleState, Fleet, ScaleDecision
from pollux.policy.autoscale.typed_utility import typed_curves, utility_path
from pollux.policy.base import JobView

if TYPE_CHECKING:
    from pollux.policy.autoscale.rules import ThresholdRule

__all__ = ["clamp_pools", "decide_typed", "fill_pools"]


def clamp_pools(nodes: np.ndarray, fleet: Fleet) -> np.ndarray:
    """``nodes`` (per pool) within every pool's bounds."""
    low = np.array([p.pool.min_nodes for p in fleet.pools], dtype=np.int64)
    high = np.array([p.pool.max_nodes for p in fleet.pools], dtype=np.int64)
    return np.clip(np.asarray(nodes, dtype=np.int64), low, high)


def fill_pools(total: int, fleet: Fleet) -> np.ndarray:
    """``total`` nodes spread over the pools: every pool's minimum, then the rest in pool order up to
    each pool's maximum. How a rule that answers one count (``fixed``) reads on a typed fleet."""
    nodes = np.array([p.pool.min_nodes for p in fleet.pools], dtype=np.int64)
    left = max(int(total) - int(nodes.sum()), 0)
    for t, held in enumerate(fleet.pools):
        more = min(held.pool.max_nodes - int(nodes[t]), left)
        nodes[t] += more
        left -= more
    return nodes


def typed_decision(target: np.ndarray, reason: str, efficiency: float | None, fleet: Fleet,
                   utility: tuple[float, ...] | None = None,
                   path: tuple[str, ...] | None = None) -> ScaleDecision:
    """A :class:`ScaleDecision` of ``target`` nodes per pool (``target`` the total)."""
    targets = {p.pool.gpu_type: int(n) for p, n in zip(fleet.pools, target, strict=True)}
    return ScaleDecision(int(sum(targets.values())), reason, efficiency, utility, targets, path)


def decide_typed(rule: ThresholdRule, jobs: Sequence[JobView], fleet: Fleet, state: AutoscaleState | None,
                 now: float) -> tuple[ScaleDecision, AutoscaleState]:
    """The rule's decision on a typed fleet (see the module docstring)."""
    state = dict(state or {})
    grown_at = float(state.get("grown_at", -math.inf))
    pools = [p.pool for p in fleet.pools]
    held = np.array([p.held for p in fleet.pools], dtype=np.int64)
    limit = np.array([p.max_nodes for p in pools], dtype=np.int64)
    path = utility_path(typed_curves(jobs, pools, rule.measure))
    good = np.flatnonzero(path.efficiency >= rule.grow_to)
    best = path.steps[int(good[-1]) if good.size else 0]
    current = path.efficiency_of(held) if held.sum() > 0 and np.all(held <= limit) else None
    if not jobs:
        target, reason = np.array([p.min_nodes for p in pools], dtype=np.int64), "nothing to run"
    elif current is None:
        target, reason = best, "start"
    elif current > rule.grow_above and np.any(best > held):
        target, reason = np.maximum(held, best), f"utility per GPU {current:.2f} > {rule.grow_above:.2f}"
    elif current < rule.shrink_below and fleet.pending == 0 and now - grown_at >= rule.cooldown_s:
        target, reason = best, f"utility per GPU {current:.2f} < {rule.shrink_below:.2f}"
    else:
        target, reason = held, "within the band"
    per_node = np.array([p.gpus_per_node for p in pools], dtype=np.int64)
    if int(target @ per_node) < len(jobs):
        target = np.maximum(target, path.steps[path.first_with_gpus(len(jobs))])
        reason = f"{len(jobs)} job(s) need a GPU each"
    target = clamp_pools(target, fleet)
    if np.any(target > held):
        state["grown_at"] = float(now)
    names = tuple(pools[t].gpu_type for t in path.added)
    return typed_decision(target, reason, current, fleet, tuple(float(x) for x in path.efficiency),
                          names), state
