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

A cloud of several GPU types (:class:`pollux.sim.typed_cloud.TypedCloudConfig`, one pool per type
at its own price) works the same way pool by pool: the rule answers a node count per type
(``ScaleDecision.targets``), each pool grows and shrinks by the rules above within its own nodes, and
each node is billed at its pool's price; the report adds node-seconds and cost per type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pollux.policy.autoscale.api import Autoscaler, AutoscaleState, Fleet, PoolNodes, ScaleDecision
from pollux.policy.autoscale.typed_rule import fill_pools
from pollux.policy.base import Cluster, JobView
from pollux.sim.typed_cloud import TypedCloudConfig

__all__ = ["CloudConfig", "CloudFleet", "FleetReport", "TypedCloudConfig"]


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
    """What the fleet cost and how its size moved, one entry per round (``time``).

    On a typed cloud ``type_node_seconds`` and ``type_prices`` hold, per GPU type, the node-seconds
    billed and the price per node-hour (``node_seconds`` is still the total), ``cost`` is the sum of
    the types' costs (``price_per_node_hour`` is then 0: there is no one price), and
    ``held_by_type``/``target_by_type`` hold each round's nodes per type. On an
    untyped cloud they stay empty and ``cost`` is ``node_hours × price_per_node_hour``, as before."""

    node_seconds: float = 0.0
    price_per_node_hour: float = 1.0
    time: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    efficiency: list[float | None] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    type_node_seconds: dict[str, float] = field(default_factory=dict)
    type_prices: dict[str, float] = field(default_factory=dict)
    held_by_type: list[dict[str, int]] = field(default_factory=list)
    target_by_type: list[dict[str, int]] = field(default_factory=list)

    @property
    def node_hours(self) -> float:
        return self.node_seconds / 3600.0

    @property
    def type_node_hours(self) -> dict[str, float]:
        """Node-hours per GPU type (empty on an untyped cloud)."""
        return {t: s / 3600.0 for t, s in self.type_node_seconds.items()}

    @property
    def type_cost(self) -> dict[str, float]:
        """Money per GPU type: its node-hours at its price (empty on an untyped cloud)."""
        return {t: h * self.type_prices[t] for t, h in self.type_node_hours.items()}

    @property
    def cost(self) -> float:
        if self.type_prices:
            return float(sum(self.type_cost.values()))
        return self.node_hours * self.price_per_node_hour


class CloudFleet:
    """The nodes of a simulated cloud and the rule that sizes it (see the module docstring).

    ``config`` is a :class:`CloudConfig` (one pool of alike nodes, the rule sees an untyped
    :class:`Fleet`) or a :class:`TypedCloudConfig` (a pool per GPU type, the rule sees
    ``Fleet.pools``). Internally both are pools of node indices; an untyped cloud is one pool holding
    every node, so its decisions are carried out exactly as before pools existed."""

    READY, PENDING, DRAINING, ABSENT = "ready", "pending", "draining", "absent"

    def __init__(self, config: CloudConfig | TypedCloudConfig, autoscaler: Autoscaler) -> None:
        self.config = config
        self.autoscaler = autoscaler
        self.full = config.cluster()
        self.status = [self.ABSENT] * config.max_nodes
        self.arrives = [math.inf] * config.max_nodes
        if isinstance(config, TypedCloudConfig):
            owner = config.pool_of_node()
            self._members = [np.flatnonzero(owner == t).tolist() for t in range(len(config.pools))]
            start = np.flatnonzero(config.start_ready()).tolist()
            self.report = FleetReport(price_per_node_hour=0.0,
                                      type_node_seconds=dict.fromkeys(config.gpu_types, 0.0),
                                      type_prices={p.gpu_type: float(p.price_per_node_hour)
                                                   for p in config.pools})
        else:
            self._members = [list(range(config.max_nodes))]
            start = list(range(config.start_nodes))
            self.report = FleetReport(price_per_node_hour=config.price_per_node_hour)
        for i in start:
            self.status[i] = self.READY
            self.arrives[i] = 0.0
        self.state: AutoscaleState | None = None
        self._last = 0.0

    @property
    def typed(self) -> bool:
        return isinstance(self.config, TypedCloudConfig)

    def _count(self, status: str, members: list[int] | None = None) -> int:
        if members is None:
            return sum(1 for s in self.status if s == status)
        return sum(1 for i in members if self.status[i] == status)

    def _held(self, members: list[int]) -> int:
        return sum(1 for i in members if self.status[i] != self.ABSENT)

    def offered(self, now: float) -> Cluster:
        """The nodes the policy may use at ``now``: ready and not drained (nodes due by now arrive)."""
        for i, s in enumerate(self.status):
            if s == self.PENDING and self.arrives[i] <= now + 1e-9:
                self.status[i] = self.READY
        keep = [i for i, s in enumerate(self.status) if s == self.READY]
        types = tuple(self.full.types[i] for i in keep) if self.full.types else ()
        return Cluster(tuple(self.full.nodes[i] for i in keep), tuple(self.full.gpus[i] for i in keep), types)

    def bill(self, now: float) -> None:
        """Add the node-seconds since the last bill: every node asked for and not given back."""
        held = sum(1 for s in self.status if s != self.ABSENT)
        elapsed = max(now - self._last, 0.0)
        self.report.node_seconds += held * elapsed
        if isinstance(self.config, TypedCloudConfig):
            for pool, members in zip(self.config.pools, self._members, strict=True):
                self.report.type_node_seconds[pool.gpu_type] += self._held(members) * elapsed
        self._last = now

    def _fleet(self) -> Fleet:
        """What the rule sees: the untyped totals, or one :class:`PoolNodes` per pool."""
        config = self.config
        if isinstance(config, TypedCloudConfig):
            pools = [PoolNodes(pool, self._count(self.READY, m), self._count(self.PENDING, m))
                     for pool, m in zip(config.pools, self._members, strict=True)]
            return Fleet.typed(pools, config.provision_delay_s)
        return Fleet(ready=self._count(self.READY), pending=self._count(self.PENDING),
                     min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                     gpus_per_node=config.gpus_per_node, provision_delay_s=config.provision_delay_s)

    def _targets(self, decision: ScaleDecision, fleet: Fleet) -> list[int]:
        """The node count per pool that ``decision`` asks for. A typed decision without per-type
        targets is read as :func:`fill_pools` reads a count; a type it leaves out keeps its nodes;
        a type the cloud lacks is an error (the rule and the cloud disagree on the pools)."""
        if not fleet.pools:
            return [decision.target]
        if decision.targets is None:
            return [int(n) for n in fill_pools(decision.target, fleet)]
        unknown = sorted(set(decision.targets) - set(fleet.gpu_types))
        if unknown:
            raise ValueError(f"autoscaler {self.autoscaler.name!r}: targets name unknown GPU type(s) "
                             f"{', '.join(map(repr, unknown))} (the cloud has {', '.join(fleet.gpu_types)})")
        return [int(decision.targets.get(p.pool.gpu_type, p.held)) for p in fleet.pools]

    def _resize(self, members: list[int], target: int, used: np.ndarray, now: float) -> None:
        """Grow or shrink one pool (its node indices ``members``) to ``target`` nodes."""
        held = self._count(self.READY, members) + self._count(self.PENDING, members)
        if target > held:
            grow = target - held
            # Drained nodes not yet empty come back first: they are paid for and hold jobs.
            for i in members:
                if grow and self.status[i] == self.DRAINING:
                    self.status[i] = self.READY
                    grow -= 1
            for i in members:
                if grow and self.status[i] == self.ABSENT:
                    self.status[i] = self.PENDING
                    self.arrives[i] = now + self.config.provision_delay_s
                    grow -= 1
        elif target < held:
            shrink = held - target
            for i in members:                              # nodes not yet here are cancelled first
                if shrink and self.status[i] == self.PENDING:
                    self.status[i] = self.ABSENT
                    shrink -= 1
            order = sorted((int(used[i]), -i, i) for i in members if self.status[i] == self.READY)
            for _, _, i in order[:shrink]:
                self.status[i] = self.DRAINING if used[i] > 0 else self.ABSENT

    def after_round(self, jobs: Sequence[JobView], used: np.ndarray, now: float) -> None:
        """The rule's size after a round whose allocation holds ``used`` GPUs per node (of the full
        cluster); empty drained nodes are given back, then nodes are asked for or drained."""
        self.bill(now)
        for i, s in enumerate(self.status):
            if s == self.DRAINING and used[i] == 0:
                self.status[i] = self.ABSENT
        fleet = self._fleet()
        decision, self.state = self.autoscaler.decide(jobs, fleet, self.state, now)
        targets = self._targets(decision, fleet)
        for members, target in zip(self._members, targets, strict=True):
            self._resize(members, target, used, now)
        self.report.time.append(now)
        self.report.ready.append(self._count(self.READY))
        self.report.held.append(sum(1 for s in self.status if s != self.ABSENT))
        self.report.target.append(decision.target)
        self.report.efficiency.append(decision.efficiency)
        self.report.reasons.append(decision.reason)
        if fleet.pools:
            self.report.held_by_type.append({t: self._held(m) for t, m in zip(fleet.gpu_types, self._members,
                                                                             strict=True)})
            self.report.target_by_type.append(dict(zip(fleet.gpu_types, targets, strict=True)))

    def finish(self, now: float) -> None:
        """Everything done at ``now``: bill to then and give every node back."""
        self.bill(now)
        self.status = [self.ABSENT] * self.config.max_nodes
