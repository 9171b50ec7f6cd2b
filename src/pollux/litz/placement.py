"""Where a service job's Litz workers go: from the service's node names to the places Litz starts
actors on.

The service names nodes (``node-0``, ...) and every Ray node it runs carries the resource
``pollux-node-<name>`` (:data:`pollux.contract.NODE_RESOURCE_PREFIX`); Litz starts a worker on a
Ray node id. :class:`NodeDirectory` is that lookup, read again for every new allocation (nodes come
and go); :class:`RayNodeDirectory` reads it from Ray, and a unit test passes a dict-backed fake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pollux import contract as ct
from pollux.litz.service_link import Allocation, ServiceError

__all__ = ["NodeDirectory", "RayNodeDirectory", "slot_node_ids"]


class NodeDirectory(Protocol):
    """The alive nodes the service knows, as ``{service node name: id Litz places actors by}``."""

    def node_ids(self) -> Mapping[str, str]: ...


class RayNodeDirectory:
    """The alive Ray nodes that carry a ``pollux-node-<name>`` resource (the caller joined Ray)."""

    def node_ids(self) -> dict[str, str]:
        import ray

        out: dict[str, str] = {}
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            for key in n.get("Resources", {}):
                if key.startswith(ct.NODE_RESOURCE_PREFIX):
                    out[key[len(ct.NODE_RESOURCE_PREFIX):]] = n["NodeID"]
        return out


def slot_node_ids(alloc: Allocation, ids: Mapping[str, str]) -> list[str]:
    """The node id of each allocated GPU (one worker per GPU); ``ServiceError`` naming a node that
    is not in `ids`."""
    missing = sorted({n for n in alloc.slots() if n not in ids})
    if missing:
        raise ServiceError(f"allocation version {alloc.version} names node(s) {missing} that no alive "
                           f"Ray node carries ({ct.NODE_RESOURCE_PREFIX}<name>)")
    return [ids[n] for n in alloc.slots()]
