"""Nodes from Ray's own autoscaler: the service sets a floor, Ray adds nodes and removes idle ones.

On a Ray cluster that runs Ray's autoscaler (KubeRay, ``ray up``), the service does not start or
stop machines itself. :class:`RayAutoscalerNodes` asks through Ray's public SDK,
``ray.autoscaler.sdk.request_resources(bundles=...)``, for one bundle of ``{"GPU": gpus_per_node}``
per node the service holds, and leaves the rest to Ray:

* **The request is a floor the autoscaler keeps.** Ray launches nodes until the bundles fit the
  cluster's *total* resources (not its free ones: a node whose GPUs are all in use still counts), and
  while the request stands it does not remove the nodes the bundles are packed onto. The request
  stays until the next call replaces it, so it survives the service's own restarts.
* **Only idle nodes go.** Ray's autoscaler removes a worker node only when the request does not need
  it *and* it has been idle (no task, actor or placement-group resources held) for the cluster's
  ``idle_timeout_minutes``. So a node the service drained and emptied goes once the floor drops
  below it, and a node that still runs a replica never goes, whatever the floor says.
* **Ray chooses which idle node goes, not the service.** The request names no node: it is packed
  onto the most recently used nodes first, and any other idle node may be the one removed. The
  names in ``keep`` therefore only count; an idle node the service meant to keep may go in place of
  an idle one it let go. That loses nothing (both are empty) and the count comes out right, but
  the service must not wait for a particular node it let go to disappear.

A bundle fits any node with the GPUs, the head too: the cluster's head should have none, or the
floor counts it as a node. Ray never launches beyond the node type's ``max_workers``: bundles past it
stay :meth:`~RayAutoscalerNodes.pending`.

Withdrawing: a request of zero bundles replaces the previous one, which is how Ray's own KubeRay
scale-down scripts clear a floor (``request_resources(num_cpus=0)``; an empty ``bundles`` list makes
exactly the same empty request). The SDK is called only when the count changes, because the
service holds after every round; the first :meth:`~RayAutoscalerNodes.hold` always calls it, so a
floor left by an earlier service process is replaced rather than trusted.

The SDK writes into the connected cluster, so the process must be a Ray driver of that cluster
already (the service's :class:`~pollux.cluster.backends.ray_backend.RayBackend` is).

:func:`fake_cluster_config` gives the arguments of ``ray.cluster_utils.AutoscalingCluster`` for a
small cluster of such GPU nodes on one machine (Ray's ``fake_multinode`` provider), for tests and
docs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pollux.cluster.backends.nodes_api import ProviderError

__all__ = ["FAKE_NODE_TYPE", "OBJECT_STORE_BYTES", "RayAutoscalerNodes", "Request", "fake_cluster_config"]

#: What :class:`RayAutoscalerNodes` calls: ``request(bundles=[...])``, as
#: ``ray.autoscaler.sdk.request_resources`` takes it.
Request = Callable[..., Any]

#: The worker node type of :func:`fake_cluster_config`.
FAKE_NODE_TYPE = "gpu-node"
#: Object store per fake node: nothing moves data through Ray here (as the embedded cluster's
#: Ray host keeps it small too).
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def _sdk_request(**kwargs: Any) -> Any:
    """``ray.autoscaler.sdk.request_resources``, imported when first needed: the module itself must
    import without Ray (the service chooses its provider before it knows Ray is there)."""
    from ray.autoscaler.sdk import request_resources

    return request_resources(**kwargs)


class RayAutoscalerNodes:
    """:class:`~pollux.cluster.backends.nodes_api.NodeProvider` on Ray's autoscaler (see above).

    ``request`` stands in for ``ray.autoscaler.sdk.request_resources`` (tests record the calls)."""

    kind = "ray-autoscaler"

    def __init__(self, gpus_per_node: int, *, request: Request | None = None) -> None:
        if int(gpus_per_node) < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {gpus_per_node}")
        self.gpus_per_node = int(gpus_per_node)
        self._request: Request = request if request is not None else _sdk_request
        #: Bundles asked for by the last call that went through; None before the first one.
        self._asked: int | None = None

    @property
    def asked(self) -> int:
        """How many nodes the standing request holds (0 before any)."""
        return self._asked or 0

    def hold(self, keep: Sequence[str], new: int, *, alive: Sequence[str] = ()) -> None:
        """Ask for ``len(keep) + new`` nodes (see the module docstring: the names only count).

        ``alive`` is accepted for the callers that pass it and not needed: Ray knows its nodes."""
        count = len(keep) + max(int(new), 0)
        if count == self._asked:
            return
        bundles = [{"GPU": self.gpus_per_node} for _ in range(count)]
        try:
            self._request(bundles=bundles)
        except Exception as exc:
            what = f"{count} x {{'GPU': {self.gpus_per_node}}}" if count else "none (withdraw)"
            raise ProviderError(f"ray.autoscaler.sdk.request_resources(bundles={what}) failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        self._asked = count

    def pending(self, alive: Sequence[str]) -> int:
        """Nodes asked for beyond the ``alive`` ones: Ray names none of them, so only a count."""
        return max(0, self.asked - len(alive))

    def close(self) -> None:
        """Withdraws nothing: the nodes stay as they are when the service stops, because they hold
        the running jobs' replicas (detached actors) and a restarted service adopts those jobs; it
        then sets its own floor with its first :meth:`hold`."""


def fake_cluster_config(max_nodes: int, gpus_per_node: int, idle_timeout_minutes: float) -> dict[str, Any]:
    """Keyword arguments of ``ray.cluster_utils.AutoscalingCluster`` for up to ``max_nodes`` fake
    GPU nodes of ``gpus_per_node`` GPUs each on this machine (Ray's ``fake_multinode`` provider).

    The head has no GPUs and no CPUs, so every GPU is a worker node's and the autoscaler must launch
    nodes for the bundles. The workers need no CPUs either: the fake provider starts each one's
    raylet with the node type's ``CPU`` (0 when absent), and a replica actor asks for none. Every
    node's object store is :data:`OBJECT_STORE_BYTES` (the provider and ``AutoscalingCluster`` both
    take ``object_store_memory`` from the resources). The rest (``idle_timeout_minutes``,
    ``max_workers``) is merged into the autoscaling config as it is.
    """
    if int(max_nodes) < 1 or int(gpus_per_node) < 1:
        raise ValueError(f"max_nodes and gpus_per_node must be >= 1, got {max_nodes}, {gpus_per_node}")
    if idle_timeout_minutes < 0:
        raise ValueError(f"idle_timeout_minutes: must be >= 0, got {idle_timeout_minutes}")
    worker = {"resources": {"CPU": 0, "GPU": int(gpus_per_node), "object_store_memory": OBJECT_STORE_BYTES},
              "node_config": {}, "min_workers": 0, "max_workers": int(max_nodes)}
    return {"head_resources": {"CPU": 0, "GPU": 0, "object_store_memory": OBJECT_STORE_BYTES},
            "worker_node_types": {FAKE_NODE_TYPE: worker},
            "idle_timeout_minutes": float(idle_timeout_minutes),
            "max_workers": int(max_nodes)}
