"""The autoscaling contract: what a rule sees of the fleet, what it answers, and its protocol."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pollux.policy.base import JobView

__all__ = ["AutoscaleState", "Autoscaler", "Fleet", "NodePool", "PoolNodes", "ScaleDecision",
           "check_pool_types"]

AutoscaleState = dict[str, Any]


@dataclass(frozen=True)
class NodePool:
    """One kind of node a cloud rents: ``gpus_per_node`` GPUs of ``gpu_type`` each, between
    ``min_nodes`` and ``max_nodes`` of them, at ``price_per_node_hour``.

    A record of its own because the rule and the simulator both read it: the rule weighs a node's
    gain against its price, the simulator bills it. ``initial_nodes`` (None: ``min_nodes``) is where
    a simulated cloud starts; the rule ignores it.
    """

    gpu_type: str
    gpus_per_node: int
    min_nodes: int = 0
    max_nodes: int = 1
    price_per_node_hour: float = 1.0
    initial_nodes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu_type, str) or not self.gpu_type:
            raise ValueError(f"gpu_type: must be a non-empty string, got {self.gpu_type!r}")
        if not 0 <= self.min_nodes <= self.max_nodes or self.max_nodes < 1:
            raise ValueError(f"pool {self.gpu_type!r}: nodes: expected 0 <= MIN <= MAX and MAX >= 1, "
                             f"got {self.min_nodes}:{self.max_nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"pool {self.gpu_type!r}: gpus_per_node: must be >= 1, got {self.gpus_per_node}")
        price = self.price_per_node_hour
        if not (isinstance(price, int | float) and math.isfinite(price) and price >= 0):
            raise ValueError(f"pool {self.gpu_type!r}: price_per_node_hour: must be a number >= 0, "
                             f"got {price!r}")
        if not self.min_nodes <= self.start_nodes <= self.max_nodes:
            raise ValueError(f"pool {self.gpu_type!r}: initial_nodes: must be within "
                             f"{self.min_nodes}:{self.max_nodes}, got {self.start_nodes}")

    @property
    def start_nodes(self) -> int:
        """The nodes ready at time 0 in a simulated cloud."""
        return self.min_nodes if self.initial_nodes is None else int(self.initial_nodes)


def check_pool_types(pools: Sequence[NodePool], where: str = "pools") -> None:
    """ValueError unless every pool has a GPU type of its own: a type is how a decision names a pool."""
    seen: set[str] = set()
    for pool in pools:
        if pool.gpu_type in seen:
            raise ValueError(f"{where}: duplicate GPU type {pool.gpu_type!r}")
        seen.add(pool.gpu_type)


@dataclass(frozen=True)
class PoolNodes:
    """What a fleet holds of one pool: ``ready`` nodes and ``pending`` ones (asked for, not here)."""

    pool: NodePool
    ready: int
    pending: int = 0

    def __post_init__(self) -> None:
        if self.ready < 0 or self.pending < 0:
            raise ValueError(f"pool {self.pool.gpu_type!r}: ready and pending nodes must be >= 0, "
                             f"got {self.ready} and {self.pending}")

    @property
    def held(self) -> int:
        return self.ready + self.pending


@dataclass(frozen=True)
class Fleet:
    """The nodes a cluster holds and may hold: ``ready`` ones run jobs, ``pending`` ones were asked
    for and have not arrived (a cloud takes ``provision_delay_s`` to deliver one); the rule keeps the
    count within ``min_nodes``..``max_nodes``. Nodes are alike: ``gpus_per_node`` GPUs each.

    A cloud of several GPU types (``pools``, one :class:`PoolNodes` per type; build it with
    :meth:`typed`) also fills the totals: ``ready``, ``pending``, ``min_nodes`` and ``max_nodes`` are
    the sums over the pools and ``gpus_per_node`` the smallest pool's, so a rule that reads only the
    totals still sees a fleet that holds together. Without ``pools`` the fleet is untyped, as before."""

    ready: int
    pending: int
    min_nodes: int
    max_nodes: int
    gpus_per_node: int
    provision_delay_s: float = 0.0
    pools: tuple[PoolNodes, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"nodes: expected 0 <= MIN <= MAX, got {self.min_nodes}:{self.max_nodes}")
        if self.ready < 0 or self.pending < 0:
            raise ValueError(f"ready and pending nodes must be >= 0, got {self.ready} and {self.pending}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {self.gpus_per_node}")
        if not (math.isfinite(self.provision_delay_s) and self.provision_delay_s >= 0):
            raise ValueError(f"provision_delay_s: must be >= 0, got {self.provision_delay_s}")
        if self.pools:
            self._check_pools()

    def _check_pools(self) -> None:
        check_pool_types([p.pool for p in self.pools])
        sums = {"ready": sum(p.ready for p in self.pools), "pending": sum(p.pending for p in self.pools),
                "min_nodes": sum(p.pool.min_nodes for p in self.pools),
                "max_nodes": sum(p.pool.max_nodes for p in self.pools)}
        for name, total in sums.items():
            if getattr(self, name) != total:
                raise ValueError(f"{name}: {getattr(self, name)} is not the pools' sum {total}")

    @classmethod
    def typed(cls, pools: Sequence[PoolNodes], provision_delay_s: float = 0.0) -> Fleet:
        """The fleet of ``pools`` (one per GPU type), its totals filled in (see the class docstring)."""
        if not pools:
            raise ValueError("pools: a typed fleet needs at least one pool")
        return cls(ready=sum(p.ready for p in pools), pending=sum(p.pending for p in pools),
                   min_nodes=sum(p.pool.min_nodes for p in pools),
                   max_nodes=sum(p.pool.max_nodes for p in pools),
                   gpus_per_node=min(p.pool.gpus_per_node for p in pools),
                   provision_delay_s=provision_delay_s, pools=tuple(pools))

    @property
    def held(self) -> int:
        """The nodes paid for: ready and on their way."""
        return self.ready + self.pending

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types of the pools, in pool order (empty for an untyped fleet)."""
        return tuple(p.pool.gpu_type for p in self.pools)


@dataclass(frozen=True)
class ScaleDecision:
    """The node count a rule wants (``target``, within the fleet's bounds), why, and the cluster's
    utility per GPU at the size it held (``efficiency``: 1 is perfect scaling from one GPU; None
    where the rule reads none). ``utility`` is that utility per GPU at every size 0..``max_nodes``
    the rule read (None where it reads none): what the live service records, so that a decision can
    be replayed in the simulator with the same inputs.

    On a typed fleet (``Fleet.pools``) ``targets`` holds the node count per GPU type (``target`` is
    still their total, so a caller that knows one pool only reads what it always read), ``utility``
    is indexed by the step of the rule's path rather than by size, and ``path`` names the type each
    step of that path adds. Both are None on an untyped fleet."""

    target: int
    reason: str
    efficiency: float | None = None
    utility: tuple[float, ...] | None = None
    targets: Mapping[str, int] | None = None
    path: tuple[str, ...] | None = None


class Autoscaler(Protocol):
    """A rule for the size of the fleet; ``name`` is its name in :mod:`.registry`.

    ``decide`` reads the jobs (their fitted models, limits and current GPUs) and the fleet at
    ``now``, and returns the decision and a JSON-able state to pass back next time.
    """

    name: str

    def decide(self, jobs: Sequence[JobView], fleet: Fleet, state: AutoscaleState | None,
               now: float) -> tuple[ScaleDecision, AutoscaleState]: ...
