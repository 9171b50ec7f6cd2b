"""The host process of the embedded local Ray cluster (SPEC §9).

A Ray cluster dies with the process that owns it, so the embedded cluster is owned by this small
process and not by the service: a crash of the service leaves the cluster and the running replicas
alone. ``python -m pollux.cluster.rayhost --info FILE --nodes N --gpus-per-node G`` starts N virtual
nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``; the first is the head), each declaring G GPU slots
and a resource ``pollux-node-node-<i>`` that names it, writes ``{"address", "pid", "nodes",
"gpus_per_node"}`` to FILE (atomically) once every node is up, and then waits. SIGTERM or SIGINT shut
the cluster down (every actor and replica process on it with it) and remove FILE. SIGUSR1 removes
a worker node, as if that machine were lost (for tests of node loss; the head stays).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from pollux.cluster.backend import NODE_RESOURCE_PREFIX, ray_env

#: Object store per virtual node: the service moves no data through Ray, so keep it small.
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pollux.cluster.rayhost", description=__doc__)
    p.add_argument("--info", required=True, type=Path, help="where to write the cluster's address (JSON)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=2)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        p.error("--nodes and --gpus-per-node must be at least 1")
    os.environ.update(ray_env())
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    lose = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: lose.set())
    started = time.perf_counter()

    def node_args(i: int) -> dict:
        return {"num_cpus": 0, "num_gpus": args.gpus_per_node,
                "resources": {f"{NODE_RESOURCE_PREFIX}node-{i}": 1},
                "object_store_memory": OBJECT_STORE_BYTES}

    cluster = Cluster(initialize_head=True, head_node_args={**node_args(0), "include_dashboard": False})
    try:
        for i in range(1, args.nodes):
            cluster.add_node(**node_args(i))
        cluster.wait_for_nodes()
        write_json_atomic(args.info, {"address": cluster.address, "pid": os.getpid(), "nodes": args.nodes,
                                      "gpus_per_node": args.gpus_per_node})
        print(f"pollux rayhost: {args.nodes} node(s) x {args.gpus_per_node} GPU slot(s) at {cluster.address} "
              f"in {time.perf_counter() - started:.1f} s", flush=True)
        workers = list(cluster.worker_nodes)
        while not stop.wait(0.2):
            if lose.is_set():
                lose.clear()
                if workers:
                    node = workers.pop()
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
