"""The service's control loop (SPEC §9): scheduling rounds, and making the cluster match the store.

The store holds the *desired* state: each job's lifecycle state and its allocation ``{node: GPUs}``,
written by the scheduling round every ``interval_s`` (and cleared by a cancel). The controller owns
the *actual* state: for each job at most one :class:`Group` of replica processes (one restart of the
job) running on Ray. Every tick (``tick_s``) it compares the two, job by job:

* no group and GPUs allocated → launch the replicas on the allocated nodes (restart number = the
  job's restart count), state → running;
* a group whose placement differs from the allocation (or a job cancelled or preempted to zero GPUs)
  → SIGTERM to every replica, state → rescaling; once all have exited (the agent checkpoints and exits
  143), or after ``stop_grace_s`` with SIGKILL, the group is gone and the job restarts on its new
  placement (or waits as pending);
* every replica exited 0 → succeeded;
* a replica exited with another code while not asked to stop → the others are stopped and the job
  restarts from its last checkpoint; after ``max_retries`` failed runs it fails with the reason.

A replica the controller asked to stop counts as preempted whatever its exit status. Every start,
exit and transition is written to the store as it happens, so a restarted service can reconcile:
:meth:`Controller.recover` adopts the replicas of each active job's current restart that are still
alive on Ray, and stops every other actor of the service's namespace (orphans).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pollux.cluster.backend import (
    NodeInfo,
    RayBackend,
    ReplicaHandle,
    ReplicaLaunch,
    parse_actor_name,
)
from pollux.cluster.scheduler import Scheduler
from pollux.cluster.store import ACTIVE_STATES, JobRecord, JobSpec, JobStore
from pollux.hints import PREEMPTED_EXIT_CODE
from pollux.policy.base import Cluster

logger = logging.getLogger("pollux.cluster")

__all__ = ["Controller", "ControllerConfig", "Group", "replica_command"]


@dataclass(frozen=True)
class ControllerConfig:
    """Timing and retry settings of the control loop, and where replicas write."""

    state_dir: Path
    scheduler_url: str | None = None
    interval_s: float = 60.0
    tick_s: float = 0.5
    stop_grace_s: float = 60.0
    launch_timeout_s: float = 120.0
    max_retries: int = 3
    python: str = sys.executable

    @property
    def log_dir(self) -> Path:
        return Path(self.state_dir) / "logs"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.state_dir) / "checkpoints"


@dataclass
class Group:
    """The replica processes of one run (restart) of a job, as the controller tracks them."""

    job_id: str
    restart: int
    placement: dict[str, int]
    handles: list[ReplicaHandle]
    started: float
    exits: dict[int, int] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_deadline: float | None = None
    stop_requested_at: float | None = None
    killed: bool = False
    accounted: float | None = None     # until when its GPU time was added to the job's service

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None


def replica_command(spec: JobSpec, python: str) -> list[str]:
    """The command of a replica: ``python script args...`` for a ``.py`` entrypoint, else as given."""
    if spec.entrypoint.endswith(".py"):
        return [python, spec.entrypoint, *spec.args]
    return [spec.entrypoint, *spec.args]


def _placement_of(ranks_nodes: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in ranks_nodes:
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def _ranks(placement: dict[str, int]) -> list[str]:
    """Node of each rank: ranks fill the nodes in name order (rank 0 on the first node)."""
    return [node for node, gpus in sorted(placement.items()) for _ in range(int(gpus))]


class Controller:
    """Makes the Ray cluster run what the store says; see the module docstring."""

    def __init__(self, store: JobStore, backend: RayBackend, scheduler: Scheduler,
                 config: ControllerConfig) -> None:
        self.store = store
        self.backend = backend
        self.scheduler = scheduler
        self.config = config
        self.groups: dict[str, Group] = {}
        self.nodes: list[NodeInfo] = []
        self._next_round = 0.0
        self.rounds = 0
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ nodes and rounds

    def refresh_nodes(self) -> Cluster:
        nodes = self.backend.nodes()
        lost = {n.name for n in self.nodes} - {n.name for n in nodes}
        if lost:
            logger.warning("lost node(s) %s: their GPUs leave the next round", sorted(lost))
        self.nodes = nodes
        cluster = Cluster(tuple(n.name for n in nodes), tuple(n.gpus for n in nodes))
        self.scheduler.cluster = cluster
        return cluster

    def request_round(self) -> None:
        """Run a scheduling round at the next tick (after a submission, a finish or a failure)."""
        self._next_round = 0.0

    def run_round(self, now: float) -> None:
        cluster = self.refresh_nodes()
        if cluster.num_nodes == 0:
            logger.warning("no alive node with GPUs; skipping the scheduling round")
            return
        result = self.scheduler.run_round(now)
        self.rounds += 1
        for jid, row in result.changed.items():
            job = self.store.get_job(jid)
            if job.terminal:
                continue
            if row and job.state == "pending":
                self.store.transition(jid, "starting", reason="allocated", now=now)
            self.store.set_allocation(jid, row, now=now)
            logger.info("round %d: job %s -> %s", self.rounds, jid, row or "no GPUs")
        if result.changed:
            logger.info("round %d (%s): %d job(s), %d changed, %.3f s", self.rounds, result.policy,
                        result.num_jobs, len(result.changed), result.duration_s)

    def _account(self, group: Group, now: float) -> None:
        """Add the GPU-seconds the group held since it was last accounted to its job's service.

        Done before every round (the policies read attained service) and when the group is asked
        to stop, not every tick, so the store is not written twice a second per running job.
        """
        start = group.accounted if group.accounted is not None else group.started
        group.accounted = max(now, start)
        if now > start:
            self.store.add_service(group.job_id, (now - start) * sum(group.placement.values()))

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            if now >= self._next_round:
                self._next_round = now + self.config.interval_s
                for g in self.groups.values():
                    if not g.stopping:
                        self._account(g, now)
                self.run_round(now)
            active = {j.id: j for j in self.store.list_jobs(ACTIVE_STATES)}
            for jid in sorted(set(active) | set(self.groups)):
                job = active.get(jid) or self.store.get_job(jid)
                try:
                    self._reconcile(job, now)
                except Exception:
                    logger.exception("job %s: reconciliation failed", jid)

    def _reconcile(self, job: JobRecord, now: float) -> None:
        group = self.groups.get(job.id)
        desired = {n: int(g) for n, g in job.allocation.items() if int(g) > 0}
        if group is not None:
            if not group.stopping:
                if job.terminal:
                    self._request_stop(group, f"job {job.state}")
                elif group.placement != desired:
                    self._request_stop(group, "re-allocated" if desired else "preempted")
                    if job.state == "running":
                        self.store.transition(job.id, "rescaling", reason="re-allocated", now=now)
            self._poll(group, job, now)
            return
        if job.terminal:
            return
        if not desired:
            if job.state in ("starting", "running", "rescaling"):
                self.store.transition(job.id, "pending", reason="no GPUs allocated", now=now)
            return
        self._launch(job, desired, now)

    # ------------------------------------------------------------------ launching

    def _launch(self, job: JobRecord, placement: dict[str, int], now: float) -> None:
        alive = {n.name for n in self.nodes}
        if not set(placement) <= alive:
            self.request_round()
            return
        restart = job.restarts
        ranks = _ranks(placement)
        node_order = list(dict.fromkeys(ranks))
        spec = job.spec
        log_root = self.config.log_dir / job.id / f"restart-{restart}"
        base_env = {
            "POLLUX_JOB_ID": job.id, "POLLUX_NUM_REPLICAS": str(len(ranks)),
            "POLLUX_NUM_NODES": str(len(node_order)), "POLLUX_RESTARTS": str(restart),
            "POLLUX_CHECKPOINT_DIR": str(self.config.checkpoint_dir / job.id),
            "POLLUX_JOB_TOKEN": job.token, "PYTHONUNBUFFERED": "1",
        }
        if self.config.scheduler_url:
            base_env["POLLUX_SCHEDULER_URL"] = self.config.scheduler_url
        command = replica_command(spec, self.config.python)
        resources = dict(spec.resources)
        launches = [ReplicaLaunch(rank=r, node=n, command=command, cwd=spec.working_dir,
                                  env={**base_env, "POLLUX_RANK": str(r),
                                       "POLLUX_NODE_RANK": str(node_order.index(n))},
                                  log_path=str(log_root / f"rank-{r}.log"), resources=resources)
                    for r, n in enumerate(ranks)]
        handles: list[ReplicaHandle] = []
        try:
            handles = self.backend.create_actors(job.id, restart, launches)
            addr, port = self.backend.rendezvous(handles[0], self.config.launch_timeout_s)
            for spec_ in launches:
                spec_.env.update({"POLLUX_MASTER_ADDR": addr, "POLLUX_MASTER_PORT": str(port)})
            self.backend.start(handles, launches, self.config.launch_timeout_s)
        except Exception as exc:
            logger.error("job %s: launch of restart %d failed: %s", job.id, restart, exc)
            self.backend.release(handles)
            self.store.add_restart(job.id)
            if job.state == "starting":
                self.store.transition(job.id, "pending", reason=f"launch failed: {exc}", now=now)
            self.request_round()
            return
        t = time.time()
        for h, spec_ in zip(handles, launches, strict=True):
            self.store.record_replica(job.id, restart, h.rank, h.node, h.pid, spec_.log_path, now=t)
        self.groups[job.id] = Group(job.id, restart, dict(placement), handles, started=t)
        if job.state in ("starting", "rescaling"):
            self.store.transition(job.id, "running", reason=f"restart {restart} on {placement}", now=t)
        logger.info("job %s: restart %d started, %d replica(s) on %s", job.id, restart, len(handles),
                    placement)

    # ------------------------------------------------------------------ stopping and exits

    def _request_stop(self, group: Group, reason: str) -> None:
        self._account(group, time.time())
        group.stop_reason = reason
        group.stop_deadline = time.monotonic() + self.config.stop_grace_s
        group.stop_requested_at = time.time()
        live = [h for h in group.handles if h.rank not in group.exits]
        self.backend.signal(live, signal.SIGTERM)
        logger.info("job %s: stopping restart %d (%s)", group.job_id, group.restart, reason)

    def _poll(self, group: Group, job: JobRecord, now: float) -> None:
        live = [h for h in group.handles if h.rank not in group.exits]
        if live:
            for h, code in zip(live, self.backend.poll(live), strict=True):
                if code is not None:
                    group.exits[h.rank] = int(code)
                    self.store.set_replica_exit(job.id, group.restart, h.rank, int(code), now=time.time())
        running = [h for h in group.handles if h.rank not in group.exits]
        if group.stopping:
            if running and group.stop_deadline is not None and time.monotonic() > group.stop_deadline \
                    and not group.killed:
                logger.warning("job %s: %d replica(s) did not exit within %.0f s; killing", job.id,
                               len(running), self.config.stop_grace_s)
                self.backend.signal(running, signal.SIGKILL)
                group.killed = True
                group.stop_deadline = time.monotonic() + 10.0
            elif running and group.killed and group.stop_deadline is not None \
                    and time.monotonic() > group.stop_deadline:
                running = []   # unreachable: release the actors regardless
            if not running:
                self._finish_stop(group, job, now)
            return
        failed = {r: c for r, c in group.exits.items() if c != 0}
        if not running and not failed:
            self._account(group, now)
            self._end(group)
            self.store.transition(job.id, "succeeded", reason="all replicas exited 0", now=now)
            logger.info("job %s: succeeded", job.id)
            self.request_round()
            return
        if failed:
            rank, code = min(failed.items())
            if code == PREEMPTED_EXIT_CODE:
                self._request_stop(group, f"replica {rank} preempted itself (exit {code})")
                return
            failures = self.store.add_failure(job.id)
            reason = f"replica {rank} on {group.handles[rank].node} exited with code {code}"
            if failures > self.config.max_retries:
                self._request_stop(group, reason)
                group.stop_reason = "failed: " + reason
                self.store.transition(job.id, "failed", reason=f"{reason} (failure {failures}, "
                                      f"retries exhausted)", now=now)
                logger.error("job %s: failed: %s", job.id, reason)
            else:
                logger.warning("job %s: %s; restarting from the last checkpoint (failure %d of at most %d)",
                               job.id, reason, failures, self.config.max_retries)
                self._request_stop(group, "failure: " + reason)

    def _finish_stop(self, group: Group, job: JobRecord, now: float) -> None:
        self._end(group)
        job = self.store.get_job(job.id)
        if job.terminal:
            return
        self.store.add_restart(job.id)
        if not job.allocation and job.state in ("running", "rescaling"):
            self.store.transition(job.id, "pending", reason=group.stop_reason, now=now)
        self.request_round()

    def _end(self, group: Group) -> None:
        self.backend.release(group.handles)
        self.groups.pop(group.job_id, None)

    # ------------------------------------------------------------------ recovery and shutdown

    def recover(self) -> dict[str, int]:
        """After a (re)start: adopt the live replicas of active jobs, stop orphans. Returns counts."""
        self.refresh_nodes()
        names = set(self.backend.actor_names())
        adopted = orphans = 0
        keep: set[str] = set()
        for job in self.store.list_jobs(ACTIVE_STATES):
            reps = [r for r in self.store.replicas(job.id, job.restarts)]
            if not reps:
                continue
            live = self.backend.find(job.id, job.restarts, [r.rank for r in reps], [r.node for r in reps])
            if len(live) == len(reps):
                for h, r in zip(live, reps, strict=True):
                    h.pid = r.pid
                # The previous life of the service accounted this run's GPU time up to some point
                # before it died; count from now rather than twice.
                group = Group(job.id, job.restarts, _placement_of([r.node for r in reps]), live,
                              started=min(r.start_time for r in reps), accounted=time.time())
                for r in reps:
                    if r.exit_code is not None:
                        group.exits[r.rank] = int(r.exit_code)
                self.groups[job.id] = group
                keep |= {f"{job.id}/{job.restarts}/{r.rank}" for r in reps}
                adopted += 1
                if job.state == "rescaling":
                    self._request_stop(group, "re-allocated")
                logger.info("job %s: adopted restart %d (%d replica(s))", job.id, job.restarts, len(live))
            else:
                # Part of the run is gone: stop the rest; the job restarts from its checkpoint.
                self.backend.release(live)
                for r in reps:
                    if r.exit_code is None:
                        self.store.set_replica_exit(job.id, r.restart, r.rank, -int(signal.SIGKILL))
                self.store.add_restart(job.id)
                logger.warning("job %s: restart %d lost %d of %d replica(s) while the service was down",
                               job.id, job.restarts, len(reps) - len(live), len(reps))
        for name in sorted(names - keep):
            parsed = parse_actor_name(name)
            logger.warning("stopping orphaned replica actor %s", name)
            self.backend.kill_by_name(name)
            if parsed is not None:
                try:
                    self.store.set_replica_exit(parsed[0], parsed[1], parsed[2], -int(signal.SIGTERM))
                except KeyError:
                    pass
            orphans += 1
        self.request_round()
        return {"adopted": adopted, "orphans": orphans}

    def shutdown(self, grace_s: float | None = None) -> None:
        """Preempt every running job (SIGTERM, checkpoint, exit) and leave it pending for the next start."""
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        with self.lock:
            for g in list(self.groups.values()):
                if not g.stopping:
                    self._request_stop(g, "service stopped")
                g.stop_deadline = min(g.stop_deadline or 0.0, time.monotonic() + grace)
            deadline = time.monotonic() + grace + 15.0
            while self.groups and time.monotonic() < deadline:
                for g in list(self.groups.values()):
                    self._poll(g, self.store.get_job(g.job_id), time.time())
                time.sleep(0.2)
            for jid in list(self.groups):
                self._end(self.groups[jid])
            for job in self.store.list_jobs(ACTIVE_STATES):
                self.store.transition(job.id, "pending", reason="service stopped")

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                logger.exception("control loop tick failed")
            stop.wait(max(self.config.tick_s - (time.monotonic() - started), 0.0))

