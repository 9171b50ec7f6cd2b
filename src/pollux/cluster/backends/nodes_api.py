"""Where a cluster's nodes come from when it scales: a small protocol and its error.

A :class:`NodeProvider` is the service's handle on whatever can add and remove machines: the
embedded Ray host's virtual nodes (:mod:`pollux.cluster.backends.embedded_nodes`) or Ray's own
autoscaler, which KubeRay and ``ray up`` clusters use
(:mod:`pollux.cluster.backends.ray_autoscaler_nodes`). The service decides *how many* nodes to hold
(:mod:`pollux.cluster.control.fleet`, with a rule of :mod:`pollux.policy.autoscale`) and *which*
alive nodes may go; the provider only carries that out. Alive nodes are the ones the
:class:`~pollux.cluster.backends.api.Backend` reports, by the same names.

Nothing here may lose work: the service names a node in neither ``keep`` nor anywhere else only once
no replica runs there, and a provider that cannot pick which node goes (Ray's autoscaler) must only
remove idle ones, as Ray's autoscaler does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["NodeProvider", "ProviderError"]


class ProviderError(RuntimeError):
    """The provider could not carry out a request (a file it cannot write, an SDK call that failed)."""


@runtime_checkable
class NodeProvider(Protocol):
    """What the service asks of a source of nodes; ``kind`` names it in ``pollux nodes``."""

    kind: str
    gpus_per_node: int

    def hold(self, keep: Sequence[str], new: int, *, alive: Sequence[str] = ()) -> None:
        """Hold the alive nodes named in ``keep`` plus ``new`` nodes that are not alive yet (asked
        for now or earlier: a provider keeps what it already asked for before asking for more), and
        let every other node go. ``alive`` names every alive node: those outside ``keep`` are empty
        (the caller moved their jobs), and a provider that names its nodes tells by it which of the
        nodes it asked for are still on their way."""
        ...

    def pending(self, alive: Sequence[str]) -> int:
        """How many nodes asked for are not among ``alive`` yet. ``alive`` is every alive node,
        those being let go included: a node still leaving is not one on its way."""
        ...

    def close(self) -> None:
        """Let go of anything the provider holds open (it asks for nothing more)."""
        ...
