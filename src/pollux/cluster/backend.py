"""The Ray backend of the live scheduler (SPEC §9): nodes, and replica processes placed on them.

Each replica is one *detached*, named Ray actor pinned to its node (node affinity, holding the
replica's resources, one GPU by default), which spawns the training script as a child process with
the agent's environment and its output in a log file. Detached actors outlive the service's Ray
driver, so a crash of the service process leaves training running; a restarted service finds the
actors again by name (``<job>/<restart>/<rank>`` in the ``pollux`` namespace) and adopts them.

The child runs in its own session (so signals reach the whole process group) and asks the kernel to
SIGKILL it if the actor's process dies (``PR_SET_PDEATHSIG``), so stopping the Ray cluster never
leaves a replica behind.

Nodes are named by a custom resource ``pollux-node-<name>`` when they declare one (the embedded
cluster does: ``node-0``, ``node-1``, ...), otherwise by their address and the start of their Ray id.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("pollux.cluster")

__all__ = ["NAMESPACE", "NODE_RESOURCE_PREFIX", "NodeInfo", "RayBackend", "ReplicaHandle",
           "ReplicaLaunch", "actor_name", "parse_actor_name", "ray_env"]

#: The Ray namespace of every actor the service creates.
NAMESPACE = "pollux"
#: A node declaring the custom resource ``pollux-node-<name>`` is called ``<name>``.
NODE_RESOURCE_PREFIX = "pollux-node-"


def ray_env() -> dict[str, str]:
    """Environment every process that starts or joins a local Ray cluster needs (loopback, no stats)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def actor_name(job_id: str, restart: int, rank: int) -> str:
    return f"{job_id}/{int(restart)}/{int(rank)}"


def parse_actor_name(name: str) -> tuple[str, int, int] | None:
    """``(job, restart, rank)`` from an actor name made by :func:`actor_name`, else None."""
    parts = name.rsplit("/", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node: its Pollux name, Ray id, address and GPU slots."""

    name: str
    node_id: str
    address: str
    gpus: int


@dataclass(frozen=True)
class ReplicaLaunch:
    """How to start one replica: command, working directory, environment, log file, resources."""

    rank: int
    node: str
    command: list[str]
    cwd: str | None
    env: dict[str, str]
    log_path: str
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})


@dataclass
class ReplicaHandle:
    """A started replica: its actor, node and the PID of the training process."""

    job_id: str
    restart: int
    rank: int
    node: str
    actor: Any
    pid: int | None = None


class _ReplicaActor:
    """Body of the per-replica Ray actor (made remote lazily, so importing this module needs no Ray)."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.exit_code: int | None = None

    def node_port(self) -> tuple[str, int]:
        """An address of this node and a TCP port free on it (the rendezvous of rank 0)."""
        import socket

        import ray
        addr = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            return addr, int(s.getsockname()[1])

    def start(self, command: list[str], cwd: str | None, env: dict[str, str], log_path: str) -> int:
        import ctypes
        import subprocess

        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        full_env.update(env)
        libc = ctypes.CDLL(None, use_errno=True)

        def die_with_actor() -> None:   # runs in the child between fork and exec
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        with open(log_path, "ab", buffering=0) as log:
            self.proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_actor)
        return int(self.proc.pid)

    def poll(self) -> tuple[int | None, int | None]:
        """``(pid, exit code or None while running)``."""
        if self.proc is None:
            return None, None
        code = self.proc.poll()
        return int(self.proc.pid), code

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the replica's process group; False if it has exited."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            return False
        return True


class RayBackend:
    """Connects to a Ray cluster as a driver and manages replica actors on it."""

    def __init__(self, address: str, *, namespace: str = NAMESPACE) -> None:
        os.environ.update(ray_env())
        import ray
        self._ray = ray
        self.address = address
        self.namespace = namespace
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, logging_level=logging.WARNING,
                     log_to_driver=False, include_dashboard=False)
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(_ReplicaActor)

    def shutdown(self) -> None:
        """Disconnect the driver (detached actors keep running)."""
        if self._ray.is_initialized():
            self._ray.shutdown()

    # -- nodes

    def nodes(self) -> list[NodeInfo]:
        """Alive nodes with at least one GPU slot, by name."""
        out = []
        for n in self._ray.nodes():
            if not n.get("Alive"):
                continue
            res = n.get("Resources", {})
            gpus = int(res.get("GPU", 0))
            names = [k[len(NODE_RESOURCE_PREFIX):] for k in res if k.startswith(NODE_RESOURCE_PREFIX)]
            name = names[0] if names else f"{n['NodeManagerAddress']}-{n['NodeID'][:8]}"
            if gpus > 0:
                out.append(NodeInfo(name=name, node_id=n["NodeID"], address=n["NodeManagerAddress"],
                                    gpus=gpus))
        return sorted(out, key=lambda x: x.name)

    # -- replicas

    def _options(self, name: str, node: NodeInfo, resources: Mapping[str, float]) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        res = dict(resources)
        opts: dict[str, Any] = {
            "name": name, "lifetime": "detached", "namespace": self.namespace,
            "num_gpus": float(res.pop("GPU", 0.0)), "num_cpus": float(res.pop("CPU", 0.0)),
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        }
        if res:
            opts["resources"] = res
        return opts

    def create_actors(self, job_id: str, restart: int,
                      launches: Sequence[ReplicaLaunch]) -> list[ReplicaHandle]:
        """Create the replicas' actors (not yet their processes); raises KeyError for an unknown node."""
        by_name = {n.name: n for n in self.nodes()}
        handles = []
        for spec in launches:
            node = by_name.get(spec.node)
            if node is None:
                raise KeyError(f"node {spec.node!r} is not an alive node of the Ray cluster")
            actor = self._actor_cls.options(**self._options(actor_name(job_id, restart, spec.rank), node,
                                                            spec.resources)).remote()
            handles.append(ReplicaHandle(job_id, restart, spec.rank, spec.node, actor))
        return handles

    def rendezvous(self, handle: ReplicaHandle, timeout_s: float) -> tuple[str, int]:
        """Address and a free port on the node of ``handle`` (rank 0)."""
        return tuple(self._ray.get(handle.actor.node_port.remote(), timeout=timeout_s))  # type: ignore[return-value]

    def start(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch],
              timeout_s: float) -> None:
        """Start every replica's process; fills ``handle.pid``."""
        refs = [h.actor.start.remote(s.command, s.cwd, s.env, s.log_path)
                for h, s in zip(handles, launches, strict=True)]
        pids = self._ray.get(refs, timeout=timeout_s)
        for h, pid in zip(handles, pids, strict=True):
            h.pid = int(pid)

    def poll(self, handles: Sequence[ReplicaHandle], timeout_s: float = 10.0) -> list[int | None]:
        """Exit codes (None while running). A dead or unreachable actor counts as exit code -9."""
        refs = [h.actor.poll.remote() for h in handles]
        codes: list[int | None] = []
        for h, ref in zip(handles, refs, strict=True):
            try:
                pid, code = self._ray.get(ref, timeout=timeout_s)
                if h.pid is None and pid is not None:
                    h.pid = int(pid)
                codes.append(code)
            except Exception as exc:  # the actor (or its node) died
                logger.warning("replica %s of job %s: actor unreachable (%s)", h.rank, h.job_id,
                               type(exc).__name__)
                codes.append(-int(signal.SIGKILL))
        return codes

    def signal(self, handles: Sequence[ReplicaHandle], signum: int, timeout_s: float = 10.0) -> None:
        refs = [h.actor.signal.remote(int(signum)) for h in handles]
        for ref in refs:
            try:
                self._ray.get(ref, timeout=timeout_s)
            except Exception:  # already gone
                pass

    def release(self, handles: Sequence[ReplicaHandle]) -> None:
        """Kill the actors (their processes, if still alive, die with them)."""
        for h in handles:
            try:
                self._ray.kill(h.actor, no_restart=True)
            except Exception:
                pass

    def find(self, job_id: str, restart: int, ranks: Sequence[int],
             nodes: Sequence[str]) -> list[ReplicaHandle]:
        """Handles of existing actors of one restart of a job (missing ranks are left out)."""
        out = []
        for rank, node in zip(ranks, nodes, strict=True):
            try:
                actor = self._ray.get_actor(actor_name(job_id, restart, rank), namespace=self.namespace)
            except ValueError:
                continue
            out.append(ReplicaHandle(job_id, restart, rank, node, actor))
        return out

    def actor_names(self) -> list[str]:
        """Names of every live actor in the namespace."""
        names = self._ray.util.list_named_actors(all_namespaces=True)
        out = []
        for entry in names:
            if isinstance(entry, dict):
                if entry.get("namespace") == self.namespace:
                    out.append(entry["name"])
            else:
                out.append(str(entry))
        return out

    def kill_by_name(self, name: str, grace_s: float = 5.0) -> None:
        """Stop an orphaned replica: SIGTERM its process, wait up to ``grace_s``, kill the actor."""
        try:
            actor = self._ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return
        handle = ReplicaHandle("?", 0, 0, "?", actor)
        self.signal([handle], signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.poll([handle])[0] is not None:
                break
            time.sleep(0.2)
        self.release([handle])
