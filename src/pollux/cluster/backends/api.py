"""The seam between the control loop and whatever runs replicas: a small protocol, its records, errors.

:class:`Backend` is everything :class:`~pollux.cluster.control.controller.Controller` asks of a cluster: the
alive nodes, creating one named replica per rank on a node, asking rank 0 for a rendezvous, starting
the processes, learning of exits, signalling, releasing, and finding replicas again by name after a
service restart. Nothing in it blocks on a replica: calls that need an answer return an opaque
*reference* (``Ref``) that :meth:`Backend.ready` reports resolved, without waiting, and
:meth:`Backend.result` / :meth:`Backend.exit_status` read. So a backend may be Ray
(:class:`pollux.cluster.backends.ray_backend.RayBackend`, references are Ray object refs), a process pool, a
Kubernetes client — or the in-memory fake the controller's unit tests script
(``tests/fake_backend.py``).

Adding a backend: implement these methods (``mypy`` checks a class against :class:`Backend`
structurally), name replicas with :func:`actor_name` so :meth:`Backend.find` and
:meth:`Backend.actor_names` can see them after a restart, and report a replica whose host or
supervisor died as ``ReplicaExit(code, lost=True)``: the controller then keeps new launches off its
node until the backend reports the node gone or :attr:`ControllerConfig.node_hold_s` passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["NAMESPACE", "Backend", "BackendError", "NodeInfo", "ReplicaExit", "ReplicaHandle",
           "ReplicaLaunch", "actor_name", "parse_actor_name"]

#: The namespace (Ray's, or a backend's own notion) of every replica the service creates.
NAMESPACE = "pollux"


def actor_name(job_id: str, restart: int, rank: int) -> str:
    """The name of one replica: ``<job>/<restart>/<rank>``."""
    return f"{job_id}/{int(restart)}/{int(rank)}"


def parse_actor_name(name: str) -> tuple[str, int, int] | None:
    """``(job, restart, rank)`` from a name made by :func:`actor_name`, else None."""
    parts = name.rsplit("/", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


class BackendError(RuntimeError):
    """A backend could not do what was asked (an unknown node, a replica it cannot create)."""


@dataclass(frozen=True)
class NodeInfo:
    """One alive node: its Pollux name, backend id, address, GPU slots and all its resources.

    ``gpu_type`` is the type of its GPUs (``"t4"``, ``"A100"``, ...) when the backend knows it, None
    for an untyped node (see :mod:`pollux.cluster.backends.gputypes`): a cluster of untyped nodes is scheduled
    as one pool, as before GPU types existed.
    """

    name: str
    node_id: str
    address: str
    gpus: int
    resources: dict[str, float] = field(default_factory=dict, hash=False)
    gpu_type: str | None = None


@dataclass(frozen=True)
class ReplicaLaunch:
    """How to start one replica: command, working directory, environment, log file, resources, user.

    ``resources`` are what *one* replica holds on its node (``GPU`` included): the launcher forms
    ``slots // GPU`` replicas from a node's allocated slots, so a run never asks for more GPUs than
    the policy granted.
    """

    rank: int
    node: str
    command: list[str]
    cwd: str | None
    env: dict[str, str]
    log_path: str
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})
    user: str | None = None


@dataclass
class ReplicaHandle:
    """A created replica: its backend object (a Ray actor, ...), node and training process's PID."""

    job_id: str
    restart: int
    rank: int
    node: str
    actor: Any
    pid: int | None = None


@dataclass(frozen=True)
class ReplicaExit:
    """How a replica ended: its exit status, and whether it was *lost* (its actor, supervisor or
    node died, so the status is a stand-in -9 rather than the process's own)."""

    code: int
    lost: bool = False


@runtime_checkable
class Backend(Protocol):
    """What the control loop needs of a cluster; see the module docstring. ``Ref`` is opaque."""

    def nodes(self) -> list[NodeInfo]:
        """Alive nodes with at least one GPU slot, by name."""
        ...

    def create_actors(self, job_id: str, restart: int, launches: Sequence[ReplicaLaunch],
                      nodes: Sequence[NodeInfo] | None = None) -> list[ReplicaHandle]:
        """Create one replica per launch (its process not started yet); raises for an unknown node."""
        ...

    def rendezvous_async(self, handle: ReplicaHandle) -> Any:
        """A reference to ``(address, free port)`` on rank 0's node, resolving once it is placed."""
        ...

    def start_async(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch]) -> list[Any]:
        """References to each replica's start result: ``{"pid": n}`` or ``{"error": why}``."""
        ...

    def exit_futures(self, handles: Sequence[ReplicaHandle]) -> list[Any]:
        """References resolving when each replica's process tree is gone (read with exit_status)."""
        ...

    def ready(self, refs: Sequence[Any], timeout_s: float = 0.0) -> set[Any]:
        """Which of ``refs`` have resolved, waiting at most ``timeout_s``."""
        ...

    def result(self, ref: Any, timeout_s: float = 10.0) -> Any:
        """The value of a resolved reference (raises what the remote call raised)."""
        ...

    def exit_status(self, ref: Any) -> ReplicaExit:
        """How the replica of a resolved exit reference ended."""
        ...

    def signal(self, handles: Sequence[ReplicaHandle], signum: int, timeout_s: float | None = None) -> None:
        """Signal the replicas' process trees (wait for the answers only if ``timeout_s`` is given)."""
        ...

    def release(self, handles: Sequence[ReplicaHandle]) -> None:
        """Drop the replicas (their processes, if still alive, die with them)."""
        ...

    def find(self, job_id: str, restart: int, ranks: Sequence[int],
             nodes: Sequence[str]) -> list[ReplicaHandle]:
        """Handles of the existing replicas of one restart of a job, by name (missing ranks left out)."""
        ...

    def actor_names(self) -> list[str]:
        """Names of every live replica of the service's namespace."""
        ...

    def kill_by_names(self, names: Sequence[str], grace_s: float = 5.0) -> None:
        """Stop replicas known only by name (orphans): SIGTERM, up to ``grace_s``, then kill."""
        ...
