"""An in-memory :class:`~pollux.cluster.backends.api.Backend` and a settable clock for the controller's
unit tests: cheap, deterministic and scriptable.

Nothing runs: a *replica* is a record. The test scripts what happens to it — it starts (or its start
fails), exits with a code (:meth:`FakeBackend.exit`), is lost with its node
(:meth:`FakeBackend.lose_node`), survives a service restart (a new controller on the same fake) —
and reads back exactly what the controller asked: every launch (:attr:`FakeBackend.launched`, with
each replica's resources), every signal, every release. References resolve as soon as their answer
exists, so one ``tick()`` moves a launch as far as it can go.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pollux.cluster.backends.api import (
    BackendError,
    NodeInfo,
    ReplicaExit,
    ReplicaHandle,
    ReplicaLaunch,
    actor_name,
)
from pollux.cluster.backends.gputypes import TYPE_RESOURCE_PREFIX


class FakeClock:
    """A clock the test moves: ``clock()`` is the time, :meth:`advance` moves it."""

    def __init__(self, t: float = 1_000.0) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += float(dt)


@dataclass(eq=False)
class FakeRef:
    """An answer to come: ``kind`` is rendezvous, start or exit, of the replica ``name``."""

    kind: str
    name: str


@dataclass
class FakeReplica:
    """One replica as the fake holds it."""

    name: str
    job_id: str
    restart: int
    rank: int
    node: str
    launch: ReplicaLaunch
    placed: bool = True
    pid: int | None = None
    exit: int | None = None
    lost: bool = False
    signals: list[int] = field(default_factory=list)


class FakeBackend:
    """Nodes ``{name: GPU slots}`` (typed by ``types``: ``{name: GPU type}``); replicas as records;
    every request recorded. See the module doc.

    A replica is placed only where its resources are free (as Ray does); one that is not stays
    unplaced, so its launch times out. Scripts: ``create_error[job]`` (an exception
    ``create_actors`` raises), ``start_error[job]``
    (the ``{"error": ...}`` every start of the job answers), ``unplaceable`` (jobs whose replicas are
    never placed), ``ignore_term`` (jobs whose replicas ignore SIGTERM), ``term_exit`` (the code a
    replica exits with on SIGTERM: 143, the agent's checkpoint-and-exit).
    """

    def __init__(self, nodes: dict[str, int] | None = None, types: dict[str, str] | None = None) -> None:
        self.listed: dict[str, NodeInfo] = {}
        self.down: set[str] = set()              # lost nodes: nothing is placed there any more
        for name, gpus in (nodes or {"node-0": 2, "node-1": 2}).items():
            self.add_node(name, gpus, gpu_type=(types or {}).get(name))
        self.replicas: dict[str, FakeReplica] = {}   # live (not released) replicas by name
        self.launched: list[tuple[str, int, list[ReplicaLaunch]]] = []
        self.signals: list[tuple[str, int]] = []
        self.released: list[str] = []
        self.orphans_killed: list[str] = []
        self.create_error: dict[str, Exception] = {}
        self.start_error: dict[str, str] = {}
        self.unplaceable: set[str] = set()
        self.ignore_term: set[str] = set()
        self.term_exit = 143
        self._pids = itertools.count(10_000)

    # -- the script's side

    def add_node(self, name: str, gpus: int, gpu_type: str | None = None, **resources: float) -> None:
        """List a node; ``gpu_type`` declares ``pollux_gpu_type_<type>`` = its GPUs, as the embedded
        Ray cluster's typed nodes do, so a replica asking for another type is never placed there."""
        res = {"GPU": float(gpus), "CPU": 8.0, **resources}
        if gpu_type is not None:
            res[f"{TYPE_RESOURCE_PREFIX}{gpu_type}"] = float(gpus)
        self.listed[name] = NodeInfo(name=name, node_id=f"id-{name}", address="127.0.0.1", gpus=gpus,
                                     resources=res, gpu_type=gpu_type)
        self.down.discard(name)

    def lose_node(self, name: str) -> None:
        """The node dies: its replicas are lost (exit -9, lost), nothing more is placed there; the
        backend still lists it (as Ray does until its health checks time out)."""
        self.down.add(name)
        for r in self.replicas.values():
            if r.node == name and r.exit is None:
                r.exit, r.lost = -int(signal.SIGKILL), True

    def drop_node(self, name: str) -> None:
        """The backend notices the death: the node is no longer listed."""
        self.listed.pop(name, None)

    def of(self, job_id: str) -> list[FakeReplica]:
        """The job's live replicas, by restart and rank."""
        mine = [r for r in self.replicas.values() if r.job_id == job_id]
        return sorted(mine, key=lambda r: (r.restart, r.rank))

    def exit(self, job_id: str, rank: int | None = None, code: int = 0) -> None:
        """Replica ``rank`` (default: every one) of the job's live run exits with ``code``."""
        for r in self.of(job_id):
            if (rank is None or r.rank == rank) and r.exit is None and r.pid is not None:
                r.exit = int(code)

    def requested(self, job_id: str) -> list[list[ReplicaLaunch]]:
        """Every launch the controller asked for the job, oldest first."""
        return [launches for jid, _, launches in self.launched if jid == job_id]

    # -- the Backend protocol

    def nodes(self) -> list[NodeInfo]:
        return sorted(self.listed.values(), key=lambda n: n.name)

    def create_actors(self, job_id: str, restart: int, launches: Sequence[ReplicaLaunch],
                      nodes: Sequence[NodeInfo] | None = None) -> list[ReplicaHandle]:
        known = {n.name for n in (self.nodes() if nodes is None else nodes)}
        self.launched.append((job_id, restart, list(launches)))
        if job_id in self.create_error:
            raise self.create_error[job_id]
        handles = []
        for s in launches:
            if s.node not in known:
                self.release(handles)
                raise BackendError(f"node {s.node!r} is not an alive node")
            name = actor_name(job_id, restart, s.rank)
            placed = s.node not in self.down and job_id not in self.unplaceable and self._fits(s)
            self.replicas[name] = FakeReplica(name, job_id, restart, s.rank, s.node, s, placed=placed)
            handles.append(ReplicaHandle(job_id, restart, s.rank, s.node, name))
        return handles

    def _fits(self, s: ReplicaLaunch) -> bool:
        """Whether the node has the replica's resources free (as Ray places an actor only then)."""
        total = self.listed[s.node].resources
        for key, amount in s.resources.items():
            used = sum(r.launch.resources.get(key, 0.0) for r in self.replicas.values()
                       if r.node == s.node and r.placed and r.exit is None)
            if used + amount > total.get(key, 0.0) + 1e-9:
                return False
        return True

    def rendezvous_async(self, handle: ReplicaHandle) -> Any:
        return FakeRef("rendezvous", handle.actor)

    def start_async(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch]) -> list[Any]:
        return [FakeRef("start", h.actor) for h in handles]

    def exit_futures(self, handles: Sequence[ReplicaHandle]) -> list[Any]:
        return [FakeRef("exit", h.actor) for h in handles]

    def _resolved(self, ref: FakeRef) -> bool:
        r = self.replicas.get(ref.name)
        if r is None:
            return True   # released: its answers are errors
        if ref.kind == "exit":
            return r.exit is not None
        return r.placed or r.lost

    def ready(self, refs: Sequence[Any], timeout_s: float = 0.0) -> set[Any]:
        return {ref for ref in refs if self._resolved(ref)}

    def result(self, ref: Any, timeout_s: float = 10.0) -> Any:
        r = self.replicas.get(ref.name)
        if r is None or r.lost or not r.placed:
            raise RuntimeError(f"actor {ref.name} died")
        if ref.kind == "rendezvous":
            return "127.0.0.1", 29_500
        if r.job_id in self.start_error:
            return {"error": self.start_error[r.job_id]}
        if r.pid is None:
            r.pid = next(self._pids)
        return {"pid": r.pid}

    def exit_status(self, ref: Any) -> ReplicaExit:
        r = self.replicas.get(ref.name)
        if r is None or r.exit is None:
            return ReplicaExit(-int(signal.SIGKILL), lost=True)
        return ReplicaExit(r.exit, lost=r.lost)

    def signal(self, handles: Sequence[ReplicaHandle], signum: int, timeout_s: float | None = None) -> None:
        for h in handles:
            r = self.replicas.get(h.actor)
            if r is None or r.pid is None or r.exit is not None:
                continue
            r.signals.append(int(signum))
            self.signals.append((r.name, int(signum)))
            if signum == signal.SIGKILL:
                r.exit = -int(signal.SIGKILL)
            elif signum == signal.SIGTERM and r.job_id not in self.ignore_term:
                r.exit = self.term_exit

    def release(self, handles: Sequence[ReplicaHandle]) -> None:
        for h in handles:
            if self.replicas.pop(h.actor, None) is not None:
                self.released.append(h.actor)

    def find(self, job_id: str, restart: int, ranks: Sequence[int],
             nodes: Sequence[str]) -> list[ReplicaHandle]:
        out = []
        for rank, node in zip(ranks, nodes, strict=True):
            name = actor_name(job_id, restart, rank)
            r = self.replicas.get(name)
            if r is not None and not r.lost:
                out.append(ReplicaHandle(job_id, restart, rank, node, name))
        return out

    def actor_names(self) -> list[str]:
        return sorted(n for n, r in self.replicas.items() if not r.lost)

    def kill_by_names(self, names: Sequence[str], grace_s: float = 5.0) -> None:
        for name in names:
            if self.replicas.pop(name, None) is not None:
                self.orphans_killed.append(name)
