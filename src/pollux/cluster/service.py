"""The scheduler service process (SPEC §9): REST API + scheduling loop + Ray backend, in one process.

``python -m pollux.cluster.service --state-dir DIR --ray-address ADDR`` (normally started by
``pollux server start``, which also starts the embedded Ray cluster) opens the job store
``DIR/jobs.db``, connects to Ray as a driver, adopts the replicas still running from a previous life
of the service (:meth:`Controller.recover`), serves the API on 127.0.0.1, and runs the control loop
in a thread. When it is listening it writes ``DIR/service.json`` ``{"url", "pid"}``.

SIGTERM (or SIGINT) is a graceful stop: the API closes, every running job is preempted (SIGTERM,
checkpoint, exit 143) and left pending for the next start. A crash (SIGKILL) leaves the replicas
running; the next start adopts them.

State directory layout::

    DIR/admin-token        the admin bearer token (mode 0600)
    DIR/jobs.db            the job store (SQLite)
    DIR/service.json       where the API listens, and the service's PID (while it runs)
    DIR/logs/<job>/restart-<R>/rank-<K>.log
    DIR/checkpoints/<job>/ the agent's checkpoints (POLLUX_CHECKPOINT_DIR)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pollux.cluster.controller import Controller, ControllerConfig
from pollux.cluster.rayhost import write_json_atomic
from pollux.cluster.scheduler import Scheduler
from pollux.cluster.store import JobStore
from pollux.policy.base import Cluster

logger = logging.getLogger("pollux.cluster")

#: Live policies (Optimus+Oracle needs an oracle and stays in the simulator).
LIVE_POLICIES = ("pollux", "tiresias", "fifo")


def read_token(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path}: the admin token file is empty")
    return token


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pollux.cluster.service", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--ray-address", required=True, help="GCS address of the Ray cluster (host:port)")
    p.add_argument("--host", default="127.0.0.1", help="address the API binds (default loopback)")
    p.add_argument("--port", type=int, default=0, help="API port (default: any free port)")
    p.add_argument("--policy", choices=LIVE_POLICIES, default="pollux")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between scheduling rounds")
    p.add_argument("--tick", type=float, default=0.5, help="seconds between checks of the replicas")
    p.add_argument("--stop-grace", type=float, default=60.0,
                   help="seconds a replica has to checkpoint and exit after SIGTERM before SIGKILL")
    p.add_argument("--max-retries", type=int, default=3, help="failed runs a job may restart after")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="interpreter for .py entrypoints")
    args = p.parse_args(argv)
    for name in ("interval", "tick", "stop_grace"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0")
    if args.max_retries < 0:
        p.error("--max-retries: must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvicorn

    from pollux.cluster.api import create_app
    from pollux.cluster.backend import RayBackend

    state = args.state_dir.resolve()
    token = read_token(state / "admin-token")
    store = JobStore(state / "jobs.db")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    url = f"http://{args.host}:{sock.getsockname()[1]}"

    started = time.perf_counter()
    backend = RayBackend(args.ray_address)
    scheduler = Scheduler(store, Cluster((), ()), policy_name=args.policy, interval_s=args.interval,
                          seed=args.seed)
    config = ControllerConfig(state_dir=state, scheduler_url=url, interval_s=args.interval, tick_s=args.tick,
                              stop_grace_s=args.stop_grace, max_retries=args.max_retries, python=args.python)
    controller = Controller(store, backend, scheduler, config)
    counts = controller.recover()
    logger.info("connected to Ray at %s in %.1f s; %d node(s); adopted %d job(s), stopped %d orphan(s)",
                args.ray_address, time.perf_counter() - started, len(controller.nodes), counts["adopted"],
                counts["orphans"])

    def cluster_info() -> dict[str, Any]:
        return {"nodes": [{"name": n.name, "gpus": n.gpus, "address": n.address} for n in controller.nodes],
                "total_gpus": sum(n.gpus for n in controller.nodes), "policy": scheduler.policy_name,
                "interval_s": args.interval, "rounds": controller.rounds, "ray_address": args.ray_address,
                "running_jobs": len(controller.groups)}

    app = create_app(store, token, log_dir=config.log_dir, on_change=controller.request_round,
                     cluster_info=cluster_info)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    api = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="api", daemon=True)
    api.start()
    deadline = time.monotonic() + 30
    while not server.started and api.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        logger.error("the API did not start")
        return 1
    write_json_atomic(state / "service.json", {"url": url, "pid": os.getpid()})
    logger.info("pollux service: API at %s, policy %s, rounds every %.0f s", url, args.policy, args.interval)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    loop = threading.Thread(target=controller.run, args=(stop,), name="control", daemon=True)
    loop.start()
    while not stop.wait(0.5):
        if not api.is_alive():
            logger.error("the API thread died; stopping")
            stop.set()
    logger.info("stopping: preempting running jobs")
    loop.join(timeout=60)
    controller.shutdown()
    server.should_exit = True
    api.join(timeout=10)
    backend.shutdown()
    store.close()
    try:
        if json.loads((state / "service.json").read_text()).get("pid") == os.getpid():
            (state / "service.json").unlink()
    except (FileNotFoundError, ValueError):
        pass
    logger.info("pollux service stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
