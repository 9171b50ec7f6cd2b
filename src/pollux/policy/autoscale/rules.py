"""The autoscaling rules: grow while the cluster's utility per GPU is high, shrink when it is low.

:class:`ThresholdRule` is the thesis's rule (§3.5.4) made cluster-wide. With ``E(N)`` the cluster's
utility per GPU on ``N`` nodes (:mod:`.utility`; 1 is perfect scaling from one GPU):

* **grow** when ``E(held) > grow_above`` (U = 2/3): to the largest ``N`` with ``E(N) >= grow_to``
  (L = 1/2), the thesis's "to the size where goodput per GPU is about half the ideal";
* **shrink** when ``E(held) < shrink_below`` (1/3 by default, below L so a size just grown to does
  not fall back at once), to the largest ``N`` with ``E(N) >= grow_to``, never while nodes are on
  their way and never within ``cooldown_s`` of growing: a node takes ``provision_delay_s`` to come,
  so a shrink right after a grow would pay for it twice;
* otherwise keep the size: the band between the thresholds is the hysteresis;
* with no job at all, ``min_nodes`` at once (nodes on their way are cancelled): there is nothing
  a node could be kept for;
* and never fewer nodes than give every job one GPU (``ceil(jobs / gpus_per_node)``, within the
  bounds): a job waiting for its first GPU is worth one to the cluster however the rest scale, and
  one job alone on a node of four GPUs would otherwise never reach ``E >= grow_to`` to start.

With ``measure="goodput"`` this is the goodput rule (statistical efficiency included, so a job grows
as larger batches become useful); with ``measure="throughput"`` it is Or et al.'s (MLSys'20):
the throughput of a fixed batch per GPU, which does not change during training, so the cluster grows
early and stays. :class:`FixedSize` holds one size, for reference.

On a fleet of several GPU types (``Fleet.pools``) both rules answer a node count per type, priced:
:mod:`.typed_rule` (the same thresholds along the cheapest-utility path of :mod:`.typed_utility`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pollux.policy.autoscale.api import AutoscaleState, Fleet, ScaleDecision
from pollux.policy.autoscale.typed_rule import decide_typed, fill_pools, typed_decision
from pollux.policy.autoscale.utility import Measure, speedup_curves, utility_by_size
from pollux.policy.base import JobView

__all__ = ["FixedSize", "ThresholdRule"]


def _clamp(n: int, fleet: Fleet) -> int:
    return max(fleet.min_nodes, min(fleet.max_nodes, int(n)))


@dataclass
class ThresholdRule:
    """The grow/shrink rule of the module docstring, on goodput or on throughput."""

    name: str = "goodput"
    measure: Measure = "goodput"
    grow_above: float = 2 / 3
    grow_to: float = 1 / 2
    shrink_below: float = 1 / 3
    cooldown_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.shrink_below <= self.grow_to <= self.grow_above <= 1:
            raise ValueError("thresholds: expected 0 < shrink_below <= grow_to <= grow_above <= 1, got "
                             f"{self.shrink_below}, {self.grow_to}, {self.grow_above}")
        if not (math.isfinite(self.cooldown_s) and self.cooldown_s >= 0):
            raise ValueError(f"cooldown_s: must be >= 0, got {self.cooldown_s}")
        if self.measure not in ("goodput", "throughput"):
            raise ValueError(f"measure: expected 'goodput' or 'throughput', got {self.measure!r}")

    def efficiency(self, jobs: Sequence[JobView], fleet: Fleet) -> np.ndarray:
        """``E(N)`` for N = 0..``fleet.max_nodes`` (``E(0)`` is 0)."""
        g = fleet.gpus_per_node
        gpus = np.arange(1, fleet.max_nodes + 1) * g
        utility = utility_by_size(speedup_curves(jobs, fleet.max_nodes * g, g, self.measure), gpus)
        return np.concatenate([[0.0], utility / gpus])

    def decide(self, jobs: Sequence[JobView], fleet: Fleet, state: AutoscaleState | None,
               now: float) -> tuple[ScaleDecision, AutoscaleState]:
        if fleet.pools:
            return decide_typed(self, jobs, fleet, state, now)      # a node count per GPU type
        state = dict(state or {})
        grown_at = float(state.get("grown_at", -math.inf))
        held = fleet.held
        eff = self.efficiency(jobs, fleet)
        good = np.flatnonzero(eff >= self.grow_to)
        largest_good = int(good[-1]) if good.size else 0
        current = float(eff[held]) if 0 < held <= fleet.max_nodes else None
        if not jobs:
            target, reason = fleet.min_nodes, "nothing to run"
        elif current is None:
            target, reason = largest_good, "start"
        elif current > self.grow_above and largest_good > held:
            target, reason = largest_good, f"utility per GPU {current:.2f} > {self.grow_above:.2f}"
        elif current < self.shrink_below and fleet.pending == 0 and now - grown_at >= self.cooldown_s:
            target, reason = largest_good, f"utility per GPU {current:.2f} < {self.shrink_below:.2f}"
        else:
            target, reason = held, "within the band"
        floor = -(-len(jobs) // fleet.gpus_per_node)
        if target < floor:
            target, reason = floor, f"{len(jobs)} job(s) need a GPU each"
        target = _clamp(target, fleet)
        if target > held:
            state["grown_at"] = float(now)
        return ScaleDecision(target, reason, current, tuple(float(x) for x in eff)), state


@dataclass
class FixedSize:
    """One size, always (``nodes``, within the fleet's bounds; on a typed fleet the pools are filled
    in order, each to its maximum, so ``nodes`` = every pool's maximum is the whole cloud)."""

    nodes: int
    name: str = "fixed"

    def decide(self, jobs: Sequence[JobView], fleet: Fleet, state: AutoscaleState | None,
               now: float) -> tuple[ScaleDecision, AutoscaleState]:
        if fleet.pools:
            nodes = fill_pools(_clamp(self.nodes, fleet), fleet)
            return typed_decision(nodes, "fixed size", None, fleet), dict(state or {})
        return ScaleDecision(_clamp(self.nodes, fleet), "fixed size"), dict(state or {})
