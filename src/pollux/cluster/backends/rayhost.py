"""The host process of the embedded local Ray cluster (SPEC §9).

A Ray cluster dies with the process that owns it, so the embedded cluster is owned by this small
process and not by the service: a crash of the service leaves the cluster and the running replicas
alone. ``python -m pollux.cluster.backends.rayhost --info FILE --nodes N --gpus-per-node G`` starts
N virtual nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``; the first is the head), each declaring
G GPU slots and a resource ``pollux-node-node-<i>`` that names it, writes ``{"address", "pid",
"nodes", "gpus_per_node"}`` to FILE (atomically) once every node is up, and then waits. With
``--cluster t4:2x2,a100:1x2`` (:func:`pollux.policy.clusterspec.parse_cluster`) it starts typed
nodes instead: ``t4-0``, ``t4-1`` and ``a100-0`` here, each also declaring
``pollux_gpu_type_<type>`` = its GPU slots (:mod:`pollux.cluster.backends.gputypes`), and FILE also
holds ``"cluster"``, the string. SIGTERM or SIGINT shut the cluster down (every actor and replica
process on it with it) and remove FILE. SIGUSR1 removes a worker node, as if that machine were lost
(for tests of node loss; the head stays).

With ``--wanted FILE`` (a service that autoscales, :mod:`pollux.cluster.backends.embedded_nodes`)
the head has no GPU slots and the worker nodes are the ones FILE lists, each of ``--gpus-per-node``
slots: the host reads FILE whenever it changes, adds the nodes it lists and does not have, and
removes the ones it has and FILE no longer lists (``--nodes`` is then ignored). FILE is the
service's to write; a FILE that does not parse is logged and changes nothing.

``python -m pollux.cluster.backends.rayhost --probe ADDRESS`` asks the GCS of a running cluster for
its nodes and prints ``{"nodes": N, "alive": M}`` (exit 0), or the error (exit 1): the health check
of ``pollux server status``, run in a process of its own so that a GCS that does not answer cannot
hang the caller, and so that the caller's process never holds a Ray client of another cluster. Both
modes use Ray's token authentication when the environment enables it (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN_PATH``), as :mod:`pollux.cluster.server` does for the embedded cluster.

:func:`cluster_processes` finds every live process of a state folder's embedded cluster (by the
token path in its environment, or by the Ray host's session), and :func:`sweep_cluster` kills
what a Ray host killed with SIGKILL left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pollux.cluster.backends.embedded_nodes import read_wanted
from pollux.cluster.backends.gputypes import TYPE_RESOURCE_PREFIX
from pollux.cluster.backends.processes import pid_alive, reap, session_of
from pollux.cluster.backends.ray_backend import NODE_RESOURCE_PREFIX
from pollux.cluster.state.folder import RAY_TOKEN
from pollux.policy.clusterspec import parse_cluster
from pollux.raylink import LOOPBACK_ENV

#: Object store per virtual node: the service moves no data through Ray, so keep it small.
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def write_json_atomic(path: Path, data: dict) -> None:
    """Replace ``path`` by ``data`` as JSON in one step, readable by the owner only (0600)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data))
    os.replace(tmp, path)


def gcs_listening(address: str, timeout_s: float = 2.0) -> str | None:
    """None if something accepts TCP connections at ``address`` (host:port), else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return None
    except ValueError:
        return f"{address!r} is not host:port"
    except OSError as exc:
        return f"the Ray GCS at {address} does not answer ({exc.strerror or exc})"


def probe(address: str, env: dict[str, str] | None = None, timeout_s: float = 20.0) -> dict:
    """Health of the Ray cluster at ``address``: ``{"healthy": bool, "error"?: str, "nodes"?: int}``.

    A refused connection is answered at once; otherwise the GCS is asked for its nodes by
    ``python -m pollux.cluster.backends.rayhost --probe`` in a child process with ``env`` (the embedded
    cluster's token), killed after ``timeout_s``.
    """
    problem = gcs_listening(address)
    if problem:
        return {"healthy": False, "error": problem}
    try:
        out = subprocess.run([sys.executable, "-m", "pollux.cluster.backends.rayhost", "--probe", address],
                             env={**os.environ, **LOOPBACK_ENV, **(env or {})}, capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"healthy": False, "error": f"the Ray GCS at {address} did not answer within {timeout_s:g} s"}
    lines = out.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else {}
    except ValueError:
        data = {}
    if out.returncode == 0 and "nodes" in data:
        alive = int(data.get("alive", 0))
        return {"healthy": alive > 0, "nodes": data["nodes"], "alive_nodes": alive,
                **({} if alive > 0 else {"error": "no alive Ray node"})}
    error = data.get("error") or (out.stderr.strip().splitlines() or ["no answer"])[-1]
    return {"healthy": False, "error": f"the Ray GCS at {address}: {error}"}


def cluster_processes(state_dir: Path, rayhost_pid: int | None = None) -> list[int]:
    """PIDs of the live processes of ``state_dir``'s embedded Ray cluster: those whose environment
    names the folder's Ray token file (the Ray host, GCS, raylets, workers, the service), and, if
    ``rayhost_pid`` is given, the Ray processes of the Ray host's session (Ray starts its agents with
    an environment of their own; they outlive a Ray host killed with SIGKILL)."""
    marker = f"RAY_AUTH_TOKEN_PATH={Path(state_dir).resolve() / RAY_TOKEN}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                out.append(pid)
            elif rayhost_pid and session_of(pid) == int(rayhost_pid) \
                    and b"ray" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return [p for p in out if pid_alive(p)]


def sweep_cluster(state: Path, rayhost_pid: int | None = None) -> int:
    """SIGKILL whatever is left of the folder's embedded cluster; returns how many processes."""
    pids = cluster_processes(state, rayhost_pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        for p in pids:
            reap(p)
        time.sleep(0.05)
    return len(pids)


def _probe_main(address: str, timeout_s: float = 5.0) -> int:
    os.environ.update(LOOPBACK_ENV)
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # no stubs for Ray's internals

        nodes = GcsClient(address=address).get_all_node_info(timeout=timeout_s)
        alive = sum(1 for n in nodes.values() if int(getattr(n, "state", 1)) == 0)
        print(json.dumps({"nodes": len(nodes), "alive": alive}))
        return 0
    except Exception as exc:  # any failure of the GCS call is the answer
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}))
        return 1


def node_specs(nodes: int, gpus_per_node: int, cluster: str | None) -> list[tuple[str, int, str | None]]:
    """``(name, GPU slots, GPU type or None)`` of every virtual node: ``nodes`` untyped nodes
    ``node-<i>`` of ``gpus_per_node`` slots, or the typed nodes ``cluster`` describes (ValueError
    naming ``--cluster`` if it does not parse)."""
    if cluster is None:
        return [(f"node-{i}", gpus_per_node, None) for i in range(nodes)]
    c = parse_cluster(cluster, where="--cluster")
    return list(zip(c.nodes, c.gpus, c.node_types, strict=True))


def node_args(name: str, gpus: int, gpu_type: str | None) -> dict:
    """Arguments of ``ray.cluster_utils.Cluster.add_node`` for one virtual node."""
    resources = {f"{NODE_RESOURCE_PREFIX}{name}": 1.0}
    if gpu_type is not None:
        resources[f"{TYPE_RESOURCE_PREFIX}{gpu_type}"] = float(gpus)
    return {"num_cpus": 0, "num_gpus": gpus, "resources": resources,
            "object_store_memory": OBJECT_STORE_BYTES}


class WantedNodes:
    """Makes the cluster's worker nodes the ones a wanted-nodes file lists (``--wanted``)."""

    def __init__(self, cluster: Any, path: Path, gpus_per_node: int) -> None:
        self.cluster = cluster
        self.path = path
        self.gpus_per_node = gpus_per_node
        self.nodes: dict[str, Any] = {}
        self._seen: tuple[int, int] | None = None

    def follow(self) -> None:
        """Read the file if it changed and add or remove nodes to match it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return
        self._seen = stamp
        try:
            wanted = read_wanted(self.path) or []
        except ValueError as exc:
            print(f"pollux rayhost: {exc}; keeping the nodes as they are", flush=True)
            return
        for name in [n for n in self.nodes if n not in wanted]:
            self.cluster.remove_node(self.nodes.pop(name), allow_graceful=True)
            print(f"pollux rayhost: removed node {name}", flush=True)
        for name in [n for n in wanted if n not in self.nodes]:
            self.nodes[name] = self.cluster.add_node(**node_args(name, self.gpus_per_node, None))
            print(f"pollux rayhost: added node {name}", flush=True)

    def forget(self, node: Any) -> None:
        """The node was removed by other means (SIGUSR1): add it again only if the file changes."""
        self.nodes = {n: v for n, v in self.nodes.items() if v is not node}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pollux.cluster.backends.rayhost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--info", type=Path, help="where to write the cluster's address (JSON)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--cluster", metavar="SPEC", help="typed nodes, e.g. t4:2x2,a100:1x2 (replaces --nodes "
                                                      "and --gpus-per-node)")
    p.add_argument("--probe", metavar="ADDRESS", help="only check the health of the cluster at ADDRESS")
    p.add_argument("--wanted", type=Path, metavar="FILE",
                   help="autoscaling: the worker nodes are the ones FILE lists (a head without GPUs)")
    args = p.parse_args(argv)
    if args.probe:
        return _probe_main(args.probe)
    if args.info is None:
        p.error("--info is required")
    if args.nodes < 1 or args.gpus_per_node < 1:
        p.error("--nodes and --gpus-per-node must be at least 1")
    if args.wanted is not None and args.cluster is not None:
        p.error("--wanted takes untyped nodes of --gpus-per-node slots: leave --cluster out")
    try:
        specs = node_specs(args.nodes, args.gpus_per_node, args.cluster)
    except ValueError as exc:
        p.error(str(exc))
    if args.wanted is not None:
        specs = [("head", 0, None)]
    os.environ.update(LOOPBACK_ENV)
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    lose = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: lose.set())
    started = time.perf_counter()

    head = {**node_args(*specs[0]), "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for spec in specs[1:]:
            cluster.add_node(**node_args(*spec))
        cluster.wait_for_nodes()
        info = {"address": cluster.address, "pid": os.getpid(), "nodes": len(specs),
                "gpus_per_node": args.gpus_per_node if args.cluster is None else None}
        what = f"{args.nodes} node(s) x {args.gpus_per_node} GPU slot(s)"
        if args.cluster is not None:
            info["cluster"] = args.cluster
            what = f"{len(specs)} typed node(s) ({args.cluster})"
        if args.wanted is not None:
            info["nodes"] = 0
            info["wanted"] = str(args.wanted)
            what = (f"a head without GPUs; worker nodes of {args.gpus_per_node} GPU slot(s) "
                    f"as {args.wanted} lists")
        write_json_atomic(args.info, info)
        print(f"pollux rayhost: {what} at {cluster.address} in {time.perf_counter() - started:.1f} s",
              flush=True)
        workers = list(cluster.worker_nodes)
        follower = None if args.wanted is None else WantedNodes(cluster, args.wanted, args.gpus_per_node)
        while not stop.wait(0.2):
            if follower is not None:
                follower.follow()
                workers = list(follower.nodes.values())
            if lose.is_set():
                lose.clear()
                if workers:
                    node = workers.pop()
                    if follower is not None:
                        follower.forget(node)
                    cluster.remove_node(node, allow_graceful=False)
                    print(f"pollux rayhost: removed a worker node ({len(workers) + 1} left)", flush=True)
    finally:
        cluster.shutdown()
        try:
            args.info.unlink()
        except FileNotFoundError:
            pass
        print("pollux rayhost: cluster shut down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
