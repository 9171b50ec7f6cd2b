"""A simulated cloud: nodes asked for, delivered after a delay, billed until they are given back.

The simulator's cluster in cloud mode is the largest it may grow to (``CloudConfig.max_nodes`` nodes
of ``gpus_per_node`` GPUs, named as :meth:`Cluster.uniform` names them); :class:`CloudFleet` says,
each round, which of those nodes exist. The scheduling policy sees only the ready ones that are not
being drained. After each round the autoscaling rule (:mod:`pollux.policy.autoscale`) names a size:

* larger: the missing nodes are asked for now and become ready ``provision_delay_s`` later (at the
  first round from then on);
* smaller: the ready nodes holding the fewest GPUs in use are drained: the policy no longer sees
  them, so it moves their jobs (a restart, as for any re-allocation), and a drained node is given
  back at the first round it holds no job. Nothing is lost: a node goes only once it is empty.

Every node is billed from the moment it is asked for until it is given back (clouds bill while a
machine boots), in node-seconds, at ``price_per_node_hour``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pollux.policy.autoscale.api import Autoscaler, AutoscaleState, Fleet
from pollux.policy.base import Cluster, JobView

__all__ = ["CloudConfig", "CloudFleet", "FleetReport"]


@dataclass(frozen=True)
class CloudConfig:
    """The cloud's bounds and terms: ``min_nodes``..``max_nodes`` nodes of ``gpus_per_node`` GPUs,
    delivered ``provision_delay_s`` after they are asked for, at ``price_per_node_hour``."""

    min_nodes: int = 1
    max_nodes: int = 16
    gpus_per_node: int = 4
    provision_delay_s: float = 120.0
    price_per_node_hour: float = 1.0
    #: Nodes ready at time 0 (None: ``min_nodes``).
    initial_nodes: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes or self.max_nodes < 1:
            raise ValueError(f"nodes: expected 0 <= MIN <= MAX and MAX >= 1, "
                             f"got {self.min_nodes}:{self.max_nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {self.gpus_per_node}")
        if not (math.isfinite(self.provision_delay_s) and self.provision_delay_s >= 0):
            raise ValueError(f"provision_delay_s: must be >= 0, got {self.provision_delay_s}")
        if not (math.isfinite(self.price_per_node_hour) and self.price_per_node_hour >= 0):
            raise ValueError(f"price_per_node_hour: must be >= 0, got {self.price_per_node_hour}")
        start = self.start_nodes
        if not self.min_nodes <= start <= self.max_nodes:
            raise ValueError(f"initial_nodes: must be within {self.min_nodes}:{self.max_nodes}, got {start}")

    @property
    def start_nodes(self) -> int:
        return self.min_nodes if self.initial_nodes is None else int(self.initial_nodes)

    def cluster(self) -> Cluster:
        """The largest cluster: every node the fleet may ever hold."""
        return Cluster.uniform(self.max_nodes, self.gpus_per_node)


@dataclass
class FleetReport:
    """What the fleet cost and how its size moved, one entry per round (``time``)."""

    node_seconds: float = 0.0
    price_per_node_hour: float = 1.0
    time: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    efficiency: list[float | None] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def node_hours(self) -> float:
        return self.node_seconds / 3600.0

    @property
    def cost(self) -> float:
        return self.node_hours * self.price_per_node_hour


class CloudFleet:
    """The nodes of a simulated cloud and the rule that sizes it (see the module docstring)."""

    READY, PENDING, DRAINING, ABSENT = "ready", "pending", "draining", "absent"

    def __init__(self, config: CloudConfig, autoscaler: Autoscaler) -> None:
        self.config = config
        self.autoscaler = autoscaler
        self.full = config.cluster()
        self.status = [self.ABSENT] * config.max_nodes
        self.arrives = [math.inf] * config.max_nodes
        for i in range(config.start_nodes):
            self.status[i] = self.READY
            self.arrives[i] = 0.0
        self.state: AutoscaleState | None = None
        self.report = FleetReport(price_per_node_hour=config.price_per_node_hour)
        self._last = 0.0

    def _count(self, status: str) -> int:
        return sum(1 for s in self.status if s == status)

    def offered(self, now: float) -> Cluster:
        """The nodes the policy may use at ``now``: ready and not drained (nodes due by now arrive)."""
        for i, s in enumerate(self.status):
            if s == self.PENDING and self.arrives[i] <= now + 1e-9:
                self.status[i] = self.READY
        keep = [i for i, s in enumerate(self.status) if s == self.READY]
        return Cluster(tuple(self.full.nodes[i] for i in keep), tuple(self.full.gpus[i] for i in keep))

    def bill(self, now: float) -> None:
        """Add the node-seconds since the last bill: every node asked for and not given back."""
        held = sum(1 for s in self.status if s != self.ABSENT)
        self.report.node_seconds += held * max(now - self._last, 0.0)
        self._last = now

    def after_round(self, jobs: Sequence[JobView], used: np.ndarray, now: float) -> None:
        """The rule's size after a round whose allocation holds ``used`` GPUs per node (of the full
        cluster); empty drained nodes are given back, then nodes are asked for or drained."""
        self.bill(now)
        for i, s in enumerate(self.status):
            if s == self.DRAINING and used[i] == 0:
                self.status[i] = self.ABSENT
        ready = self._count(self.READY)
        pending = self._count(self.PENDING)
        fleet = Fleet(ready=ready, pending=pending, min_nodes=self.config.min_nodes,
                      max_nodes=self.config.max_nodes, gpus_per_node=self.config.gpus_per_node,
                      provision_delay_s=self.config.provision_delay_s)
        decision, self.state = self.autoscaler.decide(jobs, fleet, self.state, now)
        held = ready + pending
        if decision.target > held:
            grow = decision.target - held
            # Drained nodes not yet empty come back first: they are paid for and hold jobs.
            for i, s in enumerate(self.status):
                if grow and s == self.DRAINING:
                    self.status[i] = self.READY
                    grow -= 1
            for i, s in enumerate(self.status):
                if grow and s == self.ABSENT:
                    self.status[i] = self.PENDING
                    self.arrives[i] = now + self.config.provision_delay_s
                    grow -= 1
        elif decision.target < held:
            shrink = held - decision.target
            for i, s in enumerate(self.status):          # nodes not yet here are cancelled first
                if shrink and s == self.PENDING:
                    self.status[i] = self.ABSENT
                    shrink -= 1
            order = sorted((int(used[i]), -i, i) for i, s in enumerate(self.status) if s == self.READY)
            for _, _, i in order[:shrink]:
                self.status[i] = self.DRAINING if used[i] > 0 else self.ABSENT
        self.report.time.append(now)
        self.report.ready.append(self._count(self.READY))
        self.report.held.append(sum(1 for s in self.status if s != self.ABSENT))
        self.report.target.append(decision.target)
        self.report.efficiency.append(decision.efficiency)
        self.report.reasons.append(decision.reason)

    def finish(self, now: float) -> None:
        """Everything done at ``now``: bill to then and give every node back."""
        self.bill(now)
        self.status = [self.ABSENT] * self.config.max_nodes
