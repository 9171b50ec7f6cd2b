"""The scheduler service process (SPEC §9): REST API + scheduling loop + Ray backend, in one process.

``python -m pollux.cluster.service --state-dir DIR --ray-address ADDR`` (normally started by
``pollux server start``, which also starts the embedded Ray cluster) opens the job store
``DIR/jobs.db``, connects to Ray as a driver, adopts the replicas still running from a previous life
of the service (:meth:`Controller.recover`), serves the API on 127.0.0.1, and runs the control loop
in a thread. When it is listening it writes ``DIR/service.json`` ``{"url", "pid"}``.

SIGTERM (or SIGINT) is a graceful stop: the API closes, every running job is preempted (SIGTERM,
checkpoint, exit 143) and left pending for the next start. A crash (SIGKILL) leaves the replicas
running; the next start adopts them.

Before it touches Ray or the store, the service takes ``DIR/service.lock`` (an exclusive ``flock``
held for its whole life): a second service on the same folder refuses to run (exit 1). It then
refuses a damaged or emptied job store (:func:`pollux.cluster.state.folder.check_store`, exit 1).

``--run-as USER`` (the service must run as root) runs every replica as that unprivileged user; the
state folder is then closed to it but for its own checkpoint folder. A service running as root
without ``--run-as`` logs a warning: its jobs run as root and can read the admin token.

The service watches its Ray cluster: every second the embedded Ray host's PID (``--rayhost-pid``),
and every ``--ray-check`` seconds a cheap call to the GCS. When the host is gone, or the GCS has not
answered three checks in a row, it logs ``Ray host lost (<why>); stopping``, marks the jobs that were
running as pending (their replicas died with the cluster; the next start relaunches them from their
checkpoints), and exits with status 3 (:data:`EXIT_RAY_LOST`).

State directory layout::

    DIR/admin-token        the admin bearer token (mode 0600)
    DIR/jobs.db            the job store (SQLite)
    DIR/state.json         written once the folder has a store: a missing or empty store is refused
    DIR/service.json       where the API listens, and the service's PID (while it runs)
    DIR/service.lock       held by the running service
    DIR/logs/<job>/restart-<R>/rank-<K>.log
    DIR/checkpoints/<job>/ the agent's checkpoints (POLLUX_CHECKPOINT_DIR)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pollux.cluster.api.listener import api_socket
from pollux.cluster.backends.nodes_api import NodeProvider, ProviderError
from pollux.cluster.backends.rayhost import write_json_atomic
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.fleet import (
    FLEET_RECORD,
    AutoscaleConfig,
    FleetScaler,
    parse_bounds,
    parse_options,
)
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.folder import (
    SERVICE_LOCK,
    FolderLock,
    LockedError,
    StoreError,
    check_run_as,
    check_store,
    mark_store,
    secure_state_dir,
)
from pollux.cluster.state.lifecycle import ACTIVE_STATES, JobState
from pollux.cluster.state.store import JobStore
from pollux.contract import LOG_FORMAT
from pollux.policy.autoscale import autoscaler_names, make_autoscaler
from pollux.policy.registry import policy_names

logger = logging.getLogger("pollux.cluster")

#: Live policies (Optimus+Oracle needs an oracle and stays in the simulator).
LIVE_POLICIES = policy_names(live=True)
#: Exit status of a service that stopped because its Ray cluster was lost.
EXIT_RAY_LOST = 3


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
    p.add_argument("--run-as", metavar="USER", help="run replicas as this OS user (the service must run "
                                                    "as root)")
    p.add_argument("--rayhost-pid", type=int, metavar="PID",
                   help="PID of the embedded cluster's Ray host: the service stops when it dies")
    p.add_argument("--ray-check", type=float, default=5.0, metavar="S",
                   help="seconds between health checks of the Ray GCS (default 5)")
    p.add_argument("--autoscale", metavar="MIN:MAX",
                   help="size the cluster between MIN and MAX nodes with an autoscaling rule")
    p.add_argument("--autoscale-rule", default="goodput", choices=autoscaler_names(),
                   help="the rule that sizes the cluster (default goodput)")
    p.add_argument("--autoscale-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the rule (e.g. cooldown_s=300); may be repeated")
    p.add_argument("--nodes-wanted", type=Path, metavar="FILE",
                   help="autoscale the embedded cluster: the Ray host follows the nodes FILE lists "
                        "(without it, Ray's own autoscaler is asked through its SDK)")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                   help="GPUs of each node the autoscaler adds (required with --autoscale)")
    p.add_argument("--provision-delay", type=float, default=0.0, metavar="S",
                   help="seconds a new node takes to come, as the rule is told (default 0)")
    args = p.parse_args(argv)
    if args.autoscale is not None:
        try:
            args.bounds = parse_bounds(args.autoscale)
            args.rule_options = parse_options(args.autoscale_option, "--autoscale-option")
        except ValueError as exc:
            p.error(str(exc))
        if args.gpus_per_node is None or args.gpus_per_node < 1:
            p.error("--autoscale needs --gpus-per-node G >= 1 (the GPUs of each node it adds)")
        if not args.provision_delay >= 0:
            p.error("--provision-delay: must be >= 0")
    for name in ("interval", "tick", "stop_grace", "ray_check"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0")
    if args.max_retries < 0:
        p.error("--max-retries: must be >= 0")
    return args


class RayWatch:
    """Notices the loss of the Ray cluster (see the module docstring); :meth:`check` says why, or None."""

    def __init__(self, address: str, host_pid: int | None, every_s: float, *, strikes: int = 3,
                 timeout_s: float = 3.0) -> None:
        from pollux.cluster.backends.processes import pid_alive

        self.address = address
        self.host_pid = host_pid
        self.every_s = every_s
        self.strikes = strikes
        self.timeout_s = timeout_s
        self.failures = 0
        self._alive = pid_alive
        self._next = time.monotonic() + every_s
        self.client: Any = None
        try:   # one client made while the GCS answers: a new one would wait ~40 s for a dead GCS
            from ray._raylet import GcsClient  # type: ignore[attr-defined]  # no stubs for Ray's internals
            self.client = GcsClient(address=address)
        except Exception as exc:
            logger.warning("no health checks of the Ray GCS at %s (%s); watching the host PID only",
                           address, exc)

    def check(self, now: float) -> str | None:
        if self.host_pid is not None and not self._alive(self.host_pid):
            return f"the Ray host process (PID {self.host_pid}) is gone"
        if self.client is None or now < self._next:
            return None
        self._next = now + self.every_s
        try:
            self.client.internal_kv_get(b"pollux-health", namespace=None, timeout=self.timeout_s)
        except Exception as exc:
            self.failures += 1
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning("the Ray GCS at %s did not answer (%d of %d): %s", self.address, self.failures,
                           self.strikes, why)
            if self.failures >= self.strikes:
                return f"the Ray GCS at {self.address} did not answer {self.failures} checks in a row: {why}"
            return None
        self.failures = 0
        return None


def make_fleet(args: argparse.Namespace, state: Path) -> FleetScaler | None:
    """The autoscaler ``--autoscale`` asks for (None without it): the embedded Ray host's nodes with
    ``--nodes-wanted``, else Ray's own autoscaler; raises ValueError for bad rule options."""
    if args.autoscale is None:
        return None
    low, high = args.bounds
    config = AutoscaleConfig(min_nodes=low, max_nodes=high, gpus_per_node=args.gpus_per_node,
                             rule=args.autoscale_rule, options=args.rule_options,
                             provision_delay_s=args.provision_delay)
    try:
        rule = make_autoscaler(config.rule, **dict(config.options))
    except TypeError as exc:   # an option the rule does not take
        raise ValueError(f"--autoscale-option: the {config.rule} rule: {exc}") from None
    provider: NodeProvider
    if args.nodes_wanted is not None:
        from pollux.cluster.backends.embedded_nodes import EmbeddedNodes

        provider = EmbeddedNodes(args.nodes_wanted, args.gpus_per_node)
    else:
        from pollux.cluster.backends.ray_autoscaler_nodes import RayAutoscalerNodes

        provider = RayAutoscalerNodes(args.gpus_per_node)
    logger.info("autoscaling %d..%d node(s) of %d GPU(s) with the %s rule through the %s provider", low,
                high, args.gpus_per_node, config.rule, provider.kind)
    return FleetScaler(provider, rule, config, record=state / FLEET_RECORD)


def release_jobs(store: JobStore, reason: str) -> int:
    """After the Ray cluster is lost: every active job's replicas are gone, so record their exit
    (-9), count a restart of the job and leave it pending for the next start. Returns how many."""
    n = 0
    for job in store.list_jobs(ACTIVE_STATES):
        try:
            reps = store.replicas(job.id, job.restarts)
            for r in reps:
                if r.exit_code is None:
                    store.set_replica_exit(job.id, r.restart, r.rank, -int(signal.SIGKILL))
            store.transition(job.id, JobState.PENDING, reason=f"Ray cluster lost: {reason}",
                             restart=bool(reps))   # one transaction: the restart with the move
            n += 1
        except (KeyError, ValueError) as exc:    # changed under us (cancelled meanwhile)
            logger.warning("job %s: not released: %s", job.id, exc)
    return n


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    os.umask(0o077)                          # whatever the service writes is its user's alone
    state = args.state_dir.resolve()
    lock = FolderLock(state / SERVICE_LOCK)
    try:
        lock.acquire(timeout_s=2.0)
    except LockedError as exc:
        logger.error("another Pollux service%s already runs from %s; this one does not start",
                     f" (PID {exc.pid})" if exc.pid else "", state)
        return 1
    except OSError as exc:
        logger.error("%s: cannot take the service lock: %s", state / SERVICE_LOCK, exc.strerror or exc)
        return 1
    try:
        return _serve(args, state)
    finally:
        lock.release()


def _serve(args: argparse.Namespace, state: Path) -> int:
    import uvicorn

    from pollux.cluster.api.app import create_app
    from pollux.cluster.backends.ray_backend import RayBackend

    try:
        check_run_as(args.run_as)
        check_store(state)
        token = read_token(state / "admin-token")
    except (ValueError, StoreError) as exc:
        logger.error("%s", exc)
        return 1
    except OSError as exc:
        logger.error("%s: %s", getattr(exc, "filename", None) or state, exc.strerror or exc)
        return 1
    if os.geteuid() == 0 and not args.run_as:
        logger.warning("the service runs as root and so will every replica: a job can read the admin "
                       "token and the job store; start it with --run-as USER to run replicas as an "
                       "unprivileged user")
    store = JobStore(state / "jobs.db")
    mark_store(state)
    secure_state_dir(state, args.run_as)
    try:
        sock = api_socket(args.host, args.port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", args.host, args.port, exc.strerror or exc)
        store.close()
        return 1
    url = f"http://{args.host}:{sock.getsockname()[1]}"

    started = time.perf_counter()
    try:
        backend = RayBackend(args.ray_address)
    except Exception as exc:
        logger.error("cannot connect to the Ray cluster at %s: %s", args.ray_address, exc)
        store.close()
        return 1
    watch = RayWatch(args.ray_address, args.rayhost_pid, args.ray_check)
    scheduler = Scheduler(store, policy_name=args.policy, interval_s=args.interval,
                          seed=args.seed)
    config = ControllerConfig(state_dir=state, scheduler_url=url, interval_s=args.interval, tick_s=args.tick,
                              stop_grace_s=args.stop_grace, max_retries=args.max_retries, python=args.python,
                              run_as=args.run_as)
    try:
        fleet = make_fleet(args, state)
        controller = Controller(store, backend, scheduler, config, fleet=fleet)
    except (ValueError, ProviderError) as exc:
        logger.error("%s", exc)
        return 1
    counts = controller.recover()
    logger.info("connected to Ray at %s in %.1f s; %d node(s); adopted %d job(s), stopped %d orphan(s)",
                args.ray_address, time.perf_counter() - started, len(controller.nodes), counts["adopted"],
                counts["orphans"])

    seen_types: dict[str, str] = {}   # every typed node seen: a job's history names nodes gone since

    def node_types() -> dict[str, str]:
        seen_types.update({n.name: n.gpu_type for n in list(controller.nodes) if n.gpu_type})
        return dict(seen_types)

    def cluster_info() -> dict[str, Any]:
        return {"nodes": [{"name": n.name, "gpus": n.gpus, "address": n.address, "gpu_type": n.gpu_type}
                          for n in controller.nodes],
                "total_gpus": sum(n.gpus for n in controller.nodes), "policy": scheduler.policy_name,
                "interval_s": args.interval, "rounds": controller.rounds, "ray_address": args.ray_address,
                "running_jobs": len(controller.groups), "run_as": args.run_as,
                "fleet": fleet_status()}

    def fleet_status() -> dict[str, Any] | None:
        return None if controller.fleet is None else controller.fleet.status(list(controller.alive))

    app = create_app(store, token, log_dir=config.log_dir, on_change=controller.request_round,
                     cluster_info=cluster_info, node_types=node_types,
                     node_resources=lambda: [dict(n.resources) for n in controller.nodes],
                     state_dir=config.state_dir, wait_for_round=controller.round_gate.wait_quiet)
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
    logger.info("pollux service: API at %s, policy %s, rounds every %.0f s%s", url, args.policy,
                args.interval, f", replicas run as {args.run_as}" if args.run_as else "")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    loop = threading.Thread(target=controller.run, args=(stop,), name="control", daemon=True)
    loop.start()
    lost: str | None = None
    while not stop.wait(0.5 if args.rayhost_pid else 1.0):
        if not api.is_alive():
            logger.error("the API thread died; stopping")
            stop.set()
        lost = watch.check(time.monotonic())
        if lost:
            logger.error("Ray host lost (%s); stopping", lost)
            stop.set()
    if lost:
        return _stop_after_ray_loss(state, store, server, api, loop, lost)
    logger.info("stopping: preempting running jobs")
    loop.join(timeout=60)
    controller.shutdown()
    server.should_exit = True
    api.join(timeout=10)
    backend.shutdown()
    store.close()
    _forget_service_json(state)
    logger.info("pollux service stopped")
    return 0


def _forget_service_json(state: Path) -> None:
    try:
        if json.loads((state / "service.json").read_text()).get("pid") == os.getpid():
            (state / "service.json").unlink()
    except (FileNotFoundError, ValueError):
        pass


def _stop_after_ray_loss(state: Path, store: JobStore, server: Any, api: threading.Thread,
                         loop: threading.Thread, reason: str) -> int:
    """Stop without Ray: no preemption is possible (the replicas died with the cluster). The control
    loop may be stuck in a call to the dead cluster: it gets a moment, not more (the process ends
    with ``os._exit``, which takes it down)."""
    server.should_exit = True
    loop.join(timeout=2)
    api.join(timeout=5)
    n = release_jobs(store, reason)
    store.close()
    _forget_service_json(state)
    logger.error("pollux service stopped: its Ray cluster was lost (%s); %d running job(s) left pending "
                 "for the next `pollux server start`", reason, n)
    logging.shutdown()
    # Ray's exit handlers would wait for the dead GCS: leave at once, the store is closed.
    os._exit(EXIT_RAY_LOST)


if __name__ == "__main__":
    sys.exit(main())
