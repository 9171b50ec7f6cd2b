"""GPU types in the live service: which type each node has, and keeping replicas on that type.

A node's type comes from its resources (:func:`gpu_type_of`):

* ``pollux_gpu_type_<type>`` (= the node's GPU count) — declared by the embedded cluster's virtual
  nodes (``pollux server start --local-nodes t4:2x2,a100:1x2``), or by an operator starting a Ray
  node with ``--resources '{"pollux_gpu_type_a100": 8}'``;
* else ``accelerator_type:<X>`` — what Ray itself reports for a node with a recognised GPU (``A100``,
  ``T4``, ...);
* else none: the node is *untyped*. A cluster whose nodes are all untyped is given to the scheduler
  exactly as before types existed (``Cluster.types == ()``); in a cluster where some nodes are typed,
  an untyped node has :data:`~pollux.policy.base.DEFAULT_GPU_TYPE`.

The allocation a policy returns names nodes, so its type is the type those nodes had in the round's
:class:`~pollux.policy.base.Cluster`. The controller checks at launch that each node still has that
type (:func:`type_mismatch`) and asks the backend for the type's resource with every replica
(:func:`with_type_resources`), so Ray itself refuses to place a replica on a node of another type
even if a node name were reused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pollux.cluster.backends.api import NodeInfo, ReplicaLaunch
from pollux.contract import ENV_GPU_TYPE
from pollux.policy.base import DEFAULT_GPU_TYPE, Cluster

__all__ = ["ACCELERATOR_PREFIX", "ACCELERATOR_SHARE", "TYPE_RESOURCE_PREFIX", "cluster_of", "gpu_type_of",
           "job_gpu_types", "node_types", "type_mismatch", "type_resource", "with_type_resources"]

#: A node declaring ``pollux_gpu_type_<type>`` (its GPU count) has GPUs of ``<type>``.
TYPE_RESOURCE_PREFIX = "pollux_gpu_type_"
#: Ray's own resource on a node with a known accelerator: ``accelerator_type:A100`` = 1.
ACCELERATOR_PREFIX = "accelerator_type:"
#: What one replica asks of ``accelerator_type:<X>`` (Ray declares 1 per node): a token amount
#: that only restricts placement to nodes of that type (as Ray's own ``accelerator_type=`` does).
ACCELERATOR_SHARE = 0.001


def gpu_type_of(resources: Mapping[str, float]) -> str | None:
    """The GPU type a node's resources declare (see the module docstring), or None if untyped.

    Several ``pollux_gpu_type_*`` resources on one node are a configuration error that would make
    its type ambiguous; the name that sorts first wins, deterministically.
    """
    for prefix in (TYPE_RESOURCE_PREFIX, ACCELERATOR_PREFIX):
        found = sorted(k[len(prefix):] for k, v in resources.items()
                       if k.startswith(prefix) and len(k) > len(prefix) and float(v) > 0)
        if found:
            return found[0]
    return None


def cluster_of(nodes: Sequence[NodeInfo]) -> Cluster:
    """The scheduler's cluster over ``nodes``: typed if any node has a type, else untyped as before."""
    names = tuple(n.name for n in nodes)
    gpus = tuple(n.gpus for n in nodes)
    if not any(n.gpu_type for n in nodes):
        return Cluster(names, gpus)
    return Cluster(names, gpus, tuple(n.gpu_type or DEFAULT_GPU_TYPE for n in nodes))


def node_types(cluster: Cluster) -> dict[str, str]:
    """``{node: GPU type}`` of a typed cluster; empty for an untyped one."""
    return dict(zip(cluster.nodes, cluster.types, strict=True)) if cluster.types else {}


def job_gpu_types(allocation: Mapping[str, int], types: Mapping[str, str]) -> list[str]:
    """The GPU types of the nodes an allocation holds GPUs on, sorted, without repeats; nodes whose
    type is unknown (untyped, or gone) are left out, so an untyped cluster gives ``[]``."""
    return sorted({types[n] for n, g in allocation.items() if int(g) > 0 and n in types})


def type_resource(node: NodeInfo, gpus_per_replica: float) -> dict[str, float]:
    """What a replica asks of the node's type resource so that only a node of that type can host it:
    ``{pollux_gpu_type_<t>: its GPUs}`` or ``{accelerator_type:<t>: 0.001}``; ``{}`` for an untyped
    node or one whose type no resource declares (a backend that knows types otherwise)."""
    if not node.gpu_type:
        return {}
    ours = TYPE_RESOURCE_PREFIX + node.gpu_type
    if ours in node.resources:
        return {ours: float(max(gpus_per_replica, 1.0))}
    ray = ACCELERATOR_PREFIX + node.gpu_type
    if ray in node.resources:
        return {ray: ACCELERATOR_SHARE}
    return {}


def with_type_resources(launches: Sequence[ReplicaLaunch],
                        nodes: Mapping[str, NodeInfo]) -> list[ReplicaLaunch]:
    """The launches, each also asking for its node's type resource (:func:`type_resource`) and
    telling the replica its GPU type (``POLLUX_GPU_TYPE``, which the agent reports in its hints)."""
    out = []
    for s in launches:
        node = nodes.get(s.node)
        extra = type_resource(node, float(s.resources.get("GPU", 1.0))) if node is not None else {}
        env = {**s.env, ENV_GPU_TYPE: node.gpu_type} if node is not None and node.gpu_type else s.env
        out.append(replace(s, resources={**s.resources, **extra}, env=env) if extra or env is not s.env
                   else s)
    return out


def type_mismatch(placement: Mapping[str, int], nodes: Mapping[str, NodeInfo],
                  cluster: Cluster) -> str | None:
    """Why ``placement`` must not launch now: a node whose type differs from the one it had in
    ``cluster`` (the round that allocated it), or None. Untyped clusters never mismatch."""
    expected = node_types(cluster)
    if not expected:
        return None
    for name in sorted(placement):
        info = nodes.get(name)
        want = expected.get(name)
        have = (info.gpu_type or DEFAULT_GPU_TYPE) if info is not None else None
        if want is not None and have is not None and have != want:
            return f"node {name} has GPU type {have}, but the allocation was made for type {want}"
    return None
