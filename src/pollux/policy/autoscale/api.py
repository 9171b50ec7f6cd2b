"""The autoscaling contract: what a rule sees of the fleet, what it answers, and its protocol."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pollux.policy.base import JobView

__all__ = ["AutoscaleState", "Autoscaler", "Fleet", "ScaleDecision"]

AutoscaleState = dict[str, Any]


@dataclass(frozen=True)
class Fleet:
    """The nodes a cluster holds and may hold: ``ready`` ones run jobs, ``pending`` ones were asked
    for and have not arrived (a cloud takes ``provision_delay_s`` to deliver one); the rule keeps the
    count within ``min_nodes``..``max_nodes``. Nodes are alike: ``gpus_per_node`` GPUs each."""

    ready: int
    pending: int
    min_nodes: int
    max_nodes: int
    gpus_per_node: int
    provision_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"nodes: expected 0 <= MIN <= MAX, got {self.min_nodes}:{self.max_nodes}")
        if self.ready < 0 or self.pending < 0:
            raise ValueError(f"ready and pending nodes must be >= 0, got {self.ready} and {self.pending}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {self.gpus_per_node}")
        if not (math.isfinite(self.provision_delay_s) and self.provision_delay_s >= 0):
            raise ValueError(f"provision_delay_s: must be >= 0, got {self.provision_delay_s}")

    @property
    def held(self) -> int:
        """The nodes paid for: ready and on their way."""
        return self.ready + self.pending


@dataclass(frozen=True)
class ScaleDecision:
    """The node count a rule wants (``target``, within the fleet's bounds), why, and the cluster's
    utility per GPU at the size it held (``efficiency``: 1 is perfect scaling from one GPU; None
    where the rule reads none). ``utility`` is that utility per GPU at every size 0..``max_nodes``
    the rule read (None where it reads none): what the live service records, so that a decision can
    be replayed in the simulator with the same inputs."""

    target: int
    reason: str
    efficiency: float | None = None
    utility: tuple[float, ...] | None = None


class Autoscaler(Protocol):
    """A rule for the size of the fleet; ``name`` is its name in :mod:`.registry`.

    ``decide`` reads the jobs (their fitted models, limits and current GPUs) and the fleet at
    ``now``, and returns the decision and a JSON-able state to pass back next time.
    """

    name: str

    def decide(self, jobs: Sequence[JobView], fleet: Fleet, state: AutoscaleState | None,
               now: float) -> tuple[ScaleDecision, AutoscaleState]: ...
