"""A simulated cloud of several GPU types, each at its own price (issue 36).

:class:`pollux.sim.fleet.CloudConfig` describes one pool of alike nodes; :class:`TypedCloudConfig`
describes several (:class:`pollux.policy.autoscale.NodePool`: a GPU type, its GPUs per node, its
bounds, its price and its nodes at time 0). A record of its own rather than more optional fields on
``CloudConfig``: an untyped config keeps exactly its fields and behaviour, and a typed one has no
untyped bounds or price that it would have to ignore.

Its largest cluster is the typed :class:`pollux.policy.base.Cluster` of every pool's nodes, named as
:func:`pollux.policy.clusterspec.parse_cluster` names them (``<type>-<i>``, pools in order), so the
typed simulator (typed profiles, :class:`pollux.sim.type_context.TypeContext`) runs on it unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pollux.policy.autoscale.api import NodePool, check_pool_types
from pollux.policy.base import Cluster

__all__ = ["TypedCloudConfig"]


@dataclass(frozen=True)
class TypedCloudConfig:
    """Pools of nodes (one per GPU type, each with its bounds and price), delivered
    ``provision_delay_s`` after they are asked for."""

    pools: tuple[NodePool, ...]
    provision_delay_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("pools: a typed cloud needs at least one pool")
        for i, pool in enumerate(self.pools):
            if not isinstance(pool, NodePool):
                raise ValueError(f"pools[{i}]: expected a NodePool, got {type(pool).__name__}")
        check_pool_types(self.pools)
        if not (math.isfinite(self.provision_delay_s) and self.provision_delay_s >= 0):
            raise ValueError(f"provision_delay_s: must be >= 0, got {self.provision_delay_s}")

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(p.gpu_type for p in self.pools)

    @property
    def max_nodes(self) -> int:
        """Every node the cloud may ever hold, all pools together."""
        return sum(p.max_nodes for p in self.pools)

    def pool_of_node(self) -> np.ndarray:
        """Per node of :meth:`cluster`, the index of its pool."""
        return np.repeat(np.arange(len(self.pools)), [p.max_nodes for p in self.pools])

    def start_ready(self) -> np.ndarray:
        """Per node of :meth:`cluster`, whether it is ready at time 0 (each pool's first
        ``start_nodes``)."""
        return np.concatenate([np.arange(p.max_nodes) < p.start_nodes for p in self.pools])

    def cluster(self) -> Cluster:
        """The largest cluster: every node of every pool, typed."""
        nodes: list[str] = []
        gpus: list[int] = []
        types: list[str] = []
        for pool in self.pools:
            part = Cluster.uniform(pool.max_nodes, pool.gpus_per_node, prefix=pool.gpu_type,
                                   gpu_type=pool.gpu_type)
            nodes.extend(part.nodes)
            gpus.extend(part.gpus)
            types.extend(part.types)
        return Cluster(tuple(nodes), tuple(gpus), tuple(types))
