"""The Ray backend of the live scheduler (SPEC §9): nodes, and replica processes placed on them.

One implementation of :class:`pollux.cluster.backends.api.Backend` (the protocol, its records and
errors live there and are re-exported here).

Each replica is one *detached*, named Ray actor pinned to its node (node affinity, holding the
replica's resources, one GPU by default), which spawns the training script as a child process with
the agent's environment and its output in a log file. Detached actors outlive the service's Ray
driver, so a crash of the service process leaves training running; a restarted service finds the
actors again by name (``<job>/<restart>/<rank>`` in the ``pollux`` namespace) and adopts them.

Nothing here blocks the caller on a replica: creating actors, asking for a rendezvous port, starting
processes and signalling them return at once; the answers are Ray object references that the caller
checks with :meth:`RayBackend.ready` (``ray.wait`` with no timeout, all references at once). Each
actor answers :meth:`RayBackend.exit_futures` when its process tree is gone, so the control loop
learns of every exit from one local ``ray.wait`` per tick, not from a round trip per replica.

A replica's processes never outlive it:

* the actor process is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so whatever the replica
  starts and leaves behind (a shell's ``sleep &``, data-loader workers, a daemonised helper) is
  re-parented to the actor rather than to init;
* the replica runs in its own session (signals go to its process group *and* to every descendant of
  the actor, so a child that called ``setsid`` is reached too) and asks the kernel to SIGKILL it if
  the actor dies (``PR_SET_PDEATHSIG``);
* when the replica's main process exits or is killed, the actor SIGKILLs its process group and every
  remaining descendant and reaps them, and only then reports the exit code.

With ``ReplicaLaunch.user`` set (the service runs as root, replicas as an unprivileged user), the
process runs with that user's uid, primary gid and no supplementary groups, and ``HOME``/``USER``/
``LOGNAME`` of that user. In every case the replica's environment carries nothing of the service's
secrets: Ray's variables (``RAY_*``, its auth token included), the service's own ``POLLUX_*``
variables (the admin token, if one was exported) and any variable whose name says token, secret,
password, credential or key are removed before the job's ``POLLUX_*`` variables are added.

Nodes are named by a custom resource ``pollux-node-<name>`` when they declare one (the embedded
cluster does: ``node-0``, ``node-1``, ... or, typed, ``t4-0``, ``a100-0``, ...), otherwise by their
address and the start of their Ray id. A node's GPU type is read from its resources
(:mod:`pollux.cluster.backends.gputypes`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pollux import contract as ct
from pollux import raylink
from pollux.cluster.backends.api import (
    NAMESPACE,
    NodeInfo,
    ReplicaExit,
    ReplicaHandle,
    ReplicaLaunch,
    actor_name,
    parse_actor_name,
)
from pollux.cluster.backends.gputypes import gpu_type_of
from pollux.cluster.backends.processes import descendants, kill_tree, signal_all

logger = logging.getLogger("pollux.cluster")

__all__ = ["NAMESPACE", "NODE_RESOURCE_PREFIX", "NodeInfo", "RayBackend", "ReplicaExit", "ReplicaHandle",
           "ReplicaLaunch", "actor_name", "parse_actor_name",
           "replica_environment"]

#: A node declaring the custom resource ``pollux-node-<name>`` is called ``<name>``.
NODE_RESOURCE_PREFIX = ct.NODE_RESOURCE_PREFIX
#: Inherited variables whose names match this never reach a replica (service secrets).
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(^|_)(API_?)?KEY($|_)|AUTH", re.IGNORECASE)
#: Inherited variables that describe the service's own user, dropped when a replica runs as another.
USER_VARIABLES = ("HOME", "USER", "LOGNAME", "MAIL", "SHELL", "SUDO_USER", "SUDO_UID", "SUDO_GID",
                  "SUDO_COMMAND", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME")
#: Threads of a replica actor: a blocking ``wait_exit`` must not hold up ``signal`` or ``poll``.
ACTOR_CONCURRENCY = 4
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def replica_environment(inherited: Mapping[str, str], job_env: Mapping[str, str],
                        user: Any = None) -> dict[str, str]:
    """The environment of a replica: ``inherited`` without the service's secrets, then ``job_env``.

    ``user`` (a ``pwd.struct_passwd``) replaces the service user's identity variables by its own.
    """
    env = {k: v for k, v in inherited.items()
           if not k.startswith(("RAY_", "POLLUX_")) and not SECRET_NAME.search(k)}
    if user is not None:
        for key in USER_VARIABLES:
            env.pop(key, None)
        env.update({"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name})
    env.update(job_env)
    return env


# ------------------------------------------------------------------------------- the actor


class _ReplicaActor:
    """Body of the per-replica Ray actor (made remote lazily, so importing this module needs no Ray)."""

    def __init__(self) -> None:
        import ctypes
        self.proc: Any = None
        self.exit_code: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._libc = ctypes.CDLL(None, use_errno=True)
        # Orphaned descendants of the replica re-parent to this process, which kills and reaps them.
        self._libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def node_port(self) -> tuple[str, int]:
        """An address of this node and a TCP port free on it (the rendezvous of rank 0)."""
        import socket

        import ray
        addr = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            return addr, int(s.getsockname()[1])

    def start(self, command: list[str], cwd: str | None, env: dict[str, str], log_path: str,
              user: str | None = None) -> dict[str, Any]:
        """Start the replica's process: ``{"pid": n}``, or ``{"error": why}`` if it cannot start."""
        import pwd
        import subprocess

        with self._lock:
            if self.proc is not None:
                return {"pid": int(self.proc.pid)}
            kwargs: dict[str, Any] = {}
            account = None
            try:
                if user is not None:
                    account = pwd.getpwnam(user)
                    if account.pw_uid != os.geteuid():
                        kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
                full_env = replica_environment(os.environ, env, account)
                libc = self._libc

                def die_with_actor() -> None:   # runs in the child between fork and exec
                    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

                os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
                with open(log_path, "ab", buffering=0) as log:
                    self.proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=log,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 start_new_session=True, preexec_fn=die_with_actor, **kwargs)
            except KeyError:
                return {"error": f"no such user {user!r} on this node"}
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                who = f" as user {user!r}" if user else ""
                return {"error": f"cannot start {command[0]!r}{who}: {exc}"}
            threading.Thread(target=self._watch, name="replica-watch", daemon=True).start()
            return {"pid": int(self.proc.pid)}

    def _watch(self) -> None:
        code = self.proc.wait()
        try:
            kill_tree(self.proc.pid)
        finally:
            self.exit_code = int(code)
            self._done.set()

    def wait_exit(self) -> int:
        """Block until the replica's process has exited and its whole tree is gone; its exit code."""
        self._done.wait()
        return int(self.exit_code)  # type: ignore[arg-type]

    def poll(self) -> tuple[int | None, int | None]:
        """``(pid, exit code or None while running)``."""
        if self.proc is None:
            return None, None
        return int(self.proc.pid), (self.exit_code if self._done.is_set() else None)

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the replica's process group and descendants; False if it has exited."""
        if self.proc is None or self._done.is_set():
            return False
        signal_all(self.proc.pid, descendants(os.getpid()), signum)
        return True


# ------------------------------------------------------------------------------- the backend


class RayBackend:
    """Connects to a Ray cluster as a driver and manages replica actors on it."""

    def __init__(self, address: str, *, namespace: str = NAMESPACE) -> None:
        ray = raylink.connect(address, namespace=namespace)
        self._ray = ray
        self.address = address
        self.namespace = namespace
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(_ReplicaActor)

    def shutdown(self) -> None:
        """Disconnect the driver (detached actors keep running)."""
        if self._ray.is_initialized():
            self._ray.shutdown()

    # -- nodes

    def nodes(self) -> list[NodeInfo]:
        """Alive nodes with at least one GPU slot, by name, each with its GPU type if its resources
        declare one (``pollux_gpu_type_<t>``, else Ray's ``accelerator_type:<X>``).

        A node's name is its ``pollux-node-<name>`` resource, else ``<address>-<last 8 characters of
        its Ray node id>``: the end of the id, because the nodes Ray's fake autoscaling provider
        starts share the id's beginning (``ffffffff…0001``), where real ids are random throughout."""
        out = []
        for n in self._ray.nodes():
            if not n.get("Alive"):
                continue
            res = {str(k): float(v) for k, v in n.get("Resources", {}).items()}
            gpus = int(res.get("GPU", 0))
            names = [k[len(NODE_RESOURCE_PREFIX):] for k in res if k.startswith(NODE_RESOURCE_PREFIX)]
            name = names[0] if names else f"{n['NodeManagerAddress']}-{n['NodeID'][-8:]}"
            if gpus > 0:
                out.append(NodeInfo(name=name, node_id=n["NodeID"], address=n["NodeManagerAddress"],
                                    gpus=gpus, resources=res, gpu_type=gpu_type_of(res)))
        return sorted(out, key=lambda x: x.name)

    # -- replicas

    def _options(self, name: str, node: NodeInfo, resources: Mapping[str, float]) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        res = dict(resources)
        opts: dict[str, Any] = {
            "name": name, "lifetime": "detached", "namespace": self.namespace,
            "num_gpus": float(res.pop("GPU", 0.0)), "num_cpus": float(res.pop("CPU", 0.0)),
            "max_concurrency": ACTOR_CONCURRENCY,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        }
        if "memory" in res:
            opts["memory"] = float(res.pop("memory"))
        if res:
            opts["resources"] = res
        return opts

    def create_actors(self, job_id: str, restart: int, launches: Sequence[ReplicaLaunch],
                      nodes: Sequence[NodeInfo] | None = None) -> list[ReplicaHandle]:
        """Create the replicas' actors (not yet their processes; Ray places them in the background).

        Raises KeyError for a node not in ``nodes`` (default: the alive nodes, asked of Ray).
        """
        by_name = {n.name: n for n in (self.nodes() if nodes is None else nodes)}
        handles = []
        try:
            for spec in launches:
                node = by_name.get(spec.node)
                if node is None:
                    raise KeyError(f"node {spec.node!r} is not an alive node of the Ray cluster")
                actor = self._actor_cls.options(**self._options(actor_name(job_id, restart, spec.rank), node,
                                                                spec.resources)).remote()
                handles.append(ReplicaHandle(job_id, restart, spec.rank, spec.node, actor))
        except BaseException:
            self.release(handles)
            raise
        return handles

    def rendezvous_async(self, handle: ReplicaHandle) -> Any:
        """A reference to ``(address, free port)`` on the node of ``handle`` (rank 0); it resolves
        once the actor has been placed and started."""
        return handle.actor.node_port.remote()

    def start_async(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch]) -> list[Any]:
        """References to each replica's start result: ``{"pid": n}`` or ``{"error": why}``."""
        return [h.actor.start.remote(s.command, s.cwd, s.env, s.log_path, s.user)
                for h, s in zip(handles, launches, strict=True)]

    def exit_futures(self, handles: Sequence[ReplicaHandle]) -> list[Any]:
        """References that resolve to each replica's exit code once its process tree is gone (an
        error if the actor or its node died)."""
        return [h.actor.wait_exit.remote() for h in handles]

    def ready(self, refs: Sequence[Any], timeout_s: float = 0.0) -> set[Any]:
        """Which of ``refs`` have resolved (value or error), waiting at most ``timeout_s``."""
        if not refs:
            return set()
        done, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s, fetch_local=False)
        return set(done)

    def result(self, ref: Any, timeout_s: float = 10.0) -> Any:
        """The value of a resolved reference (raises what the remote call raised)."""
        return self._ray.get(ref, timeout=timeout_s)

    def exit_status(self, ref: Any) -> ReplicaExit:
        """How the replica of an exit future ended; a dead or unreachable actor (its node lost) is
        ``ReplicaExit(-9, lost=True)``."""
        try:
            return ReplicaExit(int(self._ray.get(ref, timeout=10.0)))
        except Exception as exc:  # the actor (or its node) died
            logger.warning("replica actor unreachable (%s): counted as killed", type(exc).__name__)
            return ReplicaExit(-int(signal.SIGKILL), lost=True)

    def exit_code(self, ref: Any) -> int:
        """The exit code an exit future resolved to; -9 for a dead or unreachable actor."""
        return self.exit_status(ref).code

    def start(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch],
              timeout_s: float) -> None:
        """Start every replica's process and wait for it; fills ``handle.pid`` (raises on a failure)."""
        results = self._ray.get(self.start_async(handles, launches), timeout=timeout_s)
        for h, res in zip(handles, results, strict=True):
            if "error" in res:
                raise RuntimeError(res["error"])
            h.pid = int(res["pid"])

    def poll(self, handles: Sequence[ReplicaHandle], timeout_s: float = 10.0) -> list[int | None]:
        """Exit codes (None while running), one batched wait. A dead or unreachable actor counts as -9."""
        refs = [h.actor.poll.remote() for h in handles]
        self.ready(refs, timeout_s)
        codes: list[int | None] = []
        for h, ref in zip(handles, refs, strict=True):
            try:
                pid, code = self._ray.get(ref, timeout=0.1)
                if h.pid is None and pid is not None:
                    h.pid = int(pid)
                codes.append(code)
            except Exception as exc:  # the actor (or its node) died
                logger.warning("replica %s of job %s: actor unreachable (%s)", h.rank, h.job_id,
                               type(exc).__name__)
                codes.append(-int(signal.SIGKILL))
        return codes

    def signal(self, handles: Sequence[ReplicaHandle], signum: int, timeout_s: float | None = None) -> None:
        """Signal the replicas' process trees; waits for the answers only if ``timeout_s`` is given."""
        refs = [ref for _, ref in self._send(handles, signum)]
        if timeout_s is not None:
            self.ready(refs, timeout_s)

    @staticmethod
    def _send(handles: Sequence[ReplicaHandle], signum: int) -> list[tuple[ReplicaHandle, Any]]:
        """Ask each replica's actor to signal its process tree: (handle, answer ref) of each actor
        still there (an actor already gone is skipped)."""
        sent = []
        for h in handles:
            try:
                sent.append((h, h.actor.signal.remote(int(signum))))
            except Exception:  # already gone
                pass
        return sent

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

    def kill_by_names(self, names: Sequence[str], grace_s: float = 5.0) -> None:
        """Stop orphaned replicas, all at once: SIGTERM their processes, wait up to ``grace_s`` for
        them to exit, kill the actors."""
        handles = []
        for name in names:
            try:
                actor = self._ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                continue
            handles.append(ReplicaHandle("?", 0, 0, "?", actor))
        if not handles:
            return
        deadline = time.monotonic() + grace_s
        sent = self._send(handles, signal.SIGTERM)
        self.ready([ref for _, ref in sent], grace_s)
        # Wait only for the actors that had a process to signal: one whose launch was cut short before
        # its process started never exits on its own (a restarted service waited out the grace).
        running = [h for h, ref in sent if self._signalled(ref)]
        waits = [h.actor.wait_exit.remote() for h in running]
        self.ready(waits, max(deadline - time.monotonic(), 0.0))
        self.signal(handles, signal.SIGKILL, timeout_s=2.0)
        self.release(handles)

    def _signalled(self, ref: Any) -> bool:
        """Whether an actor's ``signal`` call reached a running process (False if it failed)."""
        try:
            return bool(self._ray.get(ref, timeout=0.1))
        except Exception:
            return False

    def kill_by_name(self, name: str, grace_s: float = 5.0) -> None:
        """Stop one orphaned replica (see :meth:`kill_by_names`)."""
        self.kill_by_names([name], grace_s)
