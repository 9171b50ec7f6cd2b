"""The service's control loop (SPEC §9): scheduling rounds, and making the cluster match the store.

The store holds the *desired* state: each job's lifecycle state and its allocation ``{node: GPUs}``,
written by the scheduling round every ``interval_s`` (and cleared by a cancel). The controller owns
the *actual* state: for each job at most one launch in flight
(:class:`~pollux.cluster.backends.launcher.Launch`) or one :class:`Group` of replica processes (one
restart of the job) running on Ray. Every tick (``tick_s``) it reads the active jobs once, and
compares, job by job:

* no group and GPUs allocated → a launch begins: the actors are created on the allocated nodes
  (restart number = the job's restart count) and the tick moves on; later ticks poll rank 0's
  rendezvous port, then every replica's start, without waiting; all started → running. A job
  cancelled or re-allocated meanwhile is released at once (what had started is stopped). A launch
  waits, counting nothing, while runs still stopping hold what it needs on its nodes;
* a group whose placement differs from the allocation (or a job preempted to zero GPUs) → SIGTERM
  to every replica, state → rescaling; once all have exited (the agent checkpoints and exits 143),
  or after ``stop_grace_s`` with SIGKILL, the group is gone and the job restarts on its new
  placement (or waits as pending). A *cancelled* job needs no checkpoint: its replicas get SIGTERM
  and, after ``cancel_grace_s`` (2 s), SIGKILL;
* every replica exited 0 → succeeded;
* a replica exited with another code while not asked to stop → the others are stopped and the job
  restarts from its last checkpoint; after ``max_retries`` failed runs it fails with the reason.
* a launch that fails (no replica formed, a resource no node has enough of, an actor that cannot be
  created or placed within ``launch_timeout_s``, a process that cannot be started, e.g. an entrypoint
  that is not executable) counts as a failed run: the job goes back to pending, and after
  ``max_retries`` failures it fails with the reason.

After each failure the job waits ``retry_backoff_s * 2**(failures-1)`` (at most ``max_backoff_s``).
Exits come from one reference per replica resolving when its process tree is gone, all checked by
one local ``ray.wait`` per tick: a tick where nothing changes makes no round trip to any actor. What
the exits mean for the job is read by :mod:`pollux.cluster.control.exits`.

A replica the controller asked to stop counts as preempted whatever its exit status. Every start,
exit and transition is written to the store as it happens, so a restarted service can reconcile:
:meth:`Controller.recover` adopts the replicas of each active job's current restart that are still
alive on Ray, and stops every other actor of the service's namespace (orphans).

A replica *lost* with its node (the backend reports ``ReplicaExit(lost=True)``) counts one failure,
and its node gets no new launch — it leaves the next round — until the backend drops it or
``node_hold_s`` passes: relaunching there before the backend notices the node is dead would fail
again and count a second failure for one loss.

Seams: any :class:`~pollux.cluster.backends.api.Backend`; injected ``clock`` (records) and
``monotonic`` (deadlines); every state change through ``JobStore.transition`` (with what it counts,
one transaction); a job follows a new allocation through its kind's
:class:`~pollux.cluster.control.runners.Runner`, which sees this loop only as a
:class:`~pollux.cluster.control.runners.RunControl`. What a restarted service finds on the cluster
is sorted out by :mod:`pollux.cluster.control.recovery`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pollux.cluster.backends import gputypes, launcher
from pollux.cluster.backends.api import Backend, NodeInfo
from pollux.cluster.backends.launcher import Launch, replica_command
from pollux.cluster.control.exits import KILL_WAIT_S, Exits
from pollux.cluster.control.fleet import FleetScaler
from pollux.cluster.control.launches import Launches
from pollux.cluster.control.records import DEFAULT_KIND, ControllerConfig, Group
from pollux.cluster.control.recovery import recover_runs
from pollux.cluster.control.round_gate import RoundGate
from pollux.cluster.control.runners import Runner, default_runners
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.control.service_accounting import held_before_round, unaccounted
from pollux.cluster.state.lifecycle import ACTIVE_STATES, JobState
from pollux.cluster.state.store import JobRecord, JobStore
from pollux.policy.base import Cluster

logger = logging.getLogger("pollux.cluster")

#: Seconds between looks at the nodes while an autoscaled fleet has nodes coming or going.
FLEET_CHECK_S = 2.0

__all__ = ["Controller", "ControllerConfig", "Group", "replica_command"]


class Controller:
    """Makes the Ray cluster run what the store says; see the module docstring."""

    def __init__(self, store: JobStore, backend: Backend, scheduler: Scheduler, config: ControllerConfig,
                 *, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 runners: Mapping[str, Runner] | None = None, round_gate: RoundGate | None = None,
                 fleet: FleetScaler | None = None) -> None:
        self.store = store
        self.backend = backend
        self.scheduler = scheduler
        self.config = config
        self.clock = clock
        self.monotonic = monotonic
        self.runners: dict[str, Runner] = {**default_runners(), **(runners or {})}
        self.groups: dict[str, Group] = {}
        self.launches = Launches(self)
        self.exits = Exits(self)
        self.not_before: dict[str, float] = {}
        self.nodes: list[NodeInfo] = []
        #: The schedulable nodes as a policy sees them, from the last :meth:`refresh_nodes`.
        self.cluster = Cluster((), ())
        #: Nodes whose replicas were lost → when (monotonic); no launch there meanwhile.
        self.held_nodes: dict[str, float] = {}
        self._next_round = 0.0
        self.rounds = 0
        #: Held while a round decides and writes: the web view and /metrics wait for it.
        self.round_gate = RoundGate() if round_gate is None else round_gate
        #: Sizes the cluster after each round when the service autoscales (None: a fixed cluster).
        self.fleet = fleet
        #: Every alive GPU node, draining and leaving ones included (``nodes`` leaves those out).
        self.alive: list[str] = []
        self._next_fleet_check = 0.0
        self.lock = threading.Lock()
        if config.run_as is not None:
            launcher.prepare_run_as(Path(config.state_dir), config.run_as)

    # ------------------------------------------------------------------ nodes and rounds

    def refresh_nodes(self) -> Cluster:
        """Ask the backend for the alive nodes and leave out the held ones: the next round's cluster."""
        nodes = self.backend.nodes()
        names = {n.name for n in nodes}
        mono = self.monotonic()
        for name, since in list(self.held_nodes.items()):
            if name not in names or mono - since > self.config.node_hold_s:
                del self.held_nodes[name]   # gone (it comes back fresh) or alive all along: usable
        nodes = [n for n in nodes if n.name not in self.held_nodes]
        self.alive = [n.name for n in nodes]
        lost = {n.name for n in self.nodes} - set(self.alive)
        if self.fleet is not None:
            lost -= self.fleet.leaving | self.fleet.draining   # let go on purpose
            offered = set(self.fleet.offered(self.alive))
            nodes = [n for n in nodes if n.name in offered]
        if lost:
            logger.warning("lost node(s) %s: their GPUs leave the next round", sorted(lost))
        self.nodes = nodes
        self.cluster = gputypes.cluster_of(nodes)   # typed if the backend reports GPU types
        return self.cluster

    def hold_node(self, node: str) -> None:
        """No launch on ``node`` until the backend drops it or ``node_hold_s`` passes; a round soon."""
        if node not in self.held_nodes:
            logger.warning("node %s lost a replica: no launch there until it is gone or %g s pass", node,
                           self.config.node_hold_s)
        self.held_nodes[node] = self.monotonic()
        self.request_round()

    def request_round(self) -> None:
        """Run a scheduling round at the next tick (after a submission, a finish or a failure)."""
        self._next_round = 0.0

    def run_round(self, now: float) -> None:
        cluster = self.refresh_nodes()
        if cluster.num_nodes == 0:
            if self.fleet is None:
                logger.warning("no alive node with GPUs; skipping the scheduling round")
            self.scale(now)
            return
        with self.round_gate.round():
            result = self.scheduler.decide(now, cluster)
            self.rounds += 1
            # One write for the whole round: the policy's state and every changed allocation.
            written = self.store.apply_round(result.policy, result.policy_state, result.changed, now=now,
                                             outlook=result.outlook.values(), duration_s=result.duration_s,
                                             jobs=result.num_jobs, objective=result.objective)
        for jid in written:
            logger.info("round %d: job %s -> %s", self.rounds, jid, result.changed[jid] or "no GPUs")
        if result.changed:
            logger.info("round %d (%s): %d job(s), %d changed, %.3f s", self.rounds, result.policy,
                        result.num_jobs, len(result.changed), result.duration_s)
        self.scale(now)

    # ------------------------------------------------------------------ autoscaling

    def busy_nodes(self) -> dict[str, int]:
        """GPUs in use or about to be on each node: running and launching replicas, and the stored
        allocations (what the next launches will use). A node is empty only if it has none."""
        busy: dict[str, int] = {}
        placements = [g.placement for g in self.groups.values()]
        placements += [x.placement for x in self.launching.values()]
        placements += [j.allocation for j in self.store.list_jobs(ACTIVE_STATES)]
        for placement in placements:
            for node, gpus in placement.items():
                busy[node] = busy.get(node, 0) + max(int(gpus), 0)
        return busy

    def follow_fleet(self) -> None:
        """Between rounds, while nodes come and go (every ``FLEET_CHECK_S``): a round as soon as a
        node arrives, and drained nodes let go as soon as they are empty."""
        assert self.fleet is not None
        mono = self.monotonic()
        if mono < self._next_fleet_check:
            return
        self._next_fleet_check = mono + FLEET_CHECK_S
        before = set(self.alive)
        self.refresh_nodes()
        if set(self.alive) - before:
            self.request_round()
        self.fleet.release_empty(self.alive, self.busy_nodes())

    def scale(self, now: float) -> None:
        """After a round: the autoscaler's decision; a round at once if it drained a node with jobs."""
        if self.fleet is None:
            return
        draining = set(self.fleet.draining)
        total = self.fleet.config.max_nodes * self.fleet.config.gpus_per_node
        entry = self.fleet.after_round(self.scheduler.views(now, total), self.alive, self.busy_nodes(), now)
        if set(entry.draining) - draining:
            self.request_round()   # move the drained nodes' jobs now, not a round interval later

    def account(self, group: Group, now: float) -> None:
        """Credit the GPU-seconds the group held since it was last credited to its job's service
        (:mod:`.service_accounting`; before a round, all groups at once)."""
        seconds = unaccounted(group, now)
        if seconds > 0:
            self.store.add_service(group.job_id, seconds)

    # ------------------------------------------------------------------ what runners may ask (RunControl)

    @property
    def resize_timeout_s(self) -> float:
        return self.config.resize_timeout_s

    def mark_rescaling(self, job: JobRecord, now: float) -> None:
        if job.state == JobState.RUNNING:
            self.store.transition(job.id, JobState.RESCALING, reason="re-allocated", now=now)

    def allocation_version(self, job_id: str) -> tuple[int, dict[str, int], int]:
        return self.store.allocation_version(job_id)

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        with self.lock:
            active = {j.id: j for j in self.store.list_jobs(ACTIVE_STATES)}
            touched = set(self.launching)     # their records changed: look at them again next tick
            self.launches.advance_all(active, now)
            self.exits.collect()
            for jid in sorted(set(active) | set(self.groups)):
                if jid in touched or jid in self.launching:
                    continue
                try:
                    self._reconcile(active.get(jid) or self.store.get_job(jid), now)
                except Exception:
                    logger.exception("job %s: reconciliation failed", jid)
            if now >= self._next_round:
                self._next_round = now + self.config.interval_s
                mono = self.monotonic()
                self.not_before = {k: t for k, t in self.not_before.items() if t > mono}
                self.launches.forget_waiting(active)
                self.store.add_services(held_before_round(self.groups.values(), now))
                self.run_round(now)
            elif self.fleet is not None and self.fleet.unsettled:
                self.follow_fleet()

    def _reconcile(self, job: JobRecord, now: float) -> None:
        group = self.groups.get(job.id)
        desired = {n: int(g) for n, g in job.allocation.items() if int(g) > 0}
        if group is not None:
            if not group.stopping:
                if job.terminal:
                    self.request_stop(group, f"job {job.state}", self.grace(job))
                elif group.placement != desired:
                    self.runner(job).apply(self, group, job, desired, now)
            elif job.terminal and not group.killed:
                # Cancelled (or failed) while stopping for a rescale: no checkpoint is needed now.
                cut = self.monotonic() + self.grace(job)
                group.stop_deadline = min(group.stop_deadline or cut, cut)
            self.exits.poll(group, job, now)
            return
        if job.terminal:
            return
        if not desired:
            if job.state in ACTIVE_STATES:
                self.store.transition(job.id, JobState.PENDING, reason="no GPUs allocated", now=now)
            return
        if self.monotonic() >= self.not_before.get(job.id, 0.0):
            self.launches.begin(job, desired, now)

    def runner(self, job: JobRecord) -> Runner:
        """The runner of the job's kind (``restart`` or ``elastic``; see
        :mod:`pollux.cluster.control.runners`)."""
        return self.runners.get(job.spec.kind) or self.runners[DEFAULT_KIND]

    def grace(self, job: JobRecord) -> float:
        """How long the job's replicas get to exit when stopped: short for a cancelled job."""
        return self.config.cancel_grace_s if job.state == JobState.CANCELLED else self.config.stop_grace_s

    @property
    def launching(self) -> dict[str, Launch]:
        """The launches in flight by job (:class:`~pollux.cluster.control.launches.Launches`)."""
        return self.launches.in_flight

    def back_off(self, job_id: str, failures: int) -> float:
        """No launch of the job for ``retry_backoff_s * 2**(failures-1)`` (at most ``max_backoff_s``);
        returns that delay."""
        delay = launcher.backoff_s(failures, self.config.retry_backoff_s, self.config.max_backoff_s)
        self.not_before[job_id] = self.monotonic() + delay
        return delay

    # ------------------------------------------------------------------ stopping a run

    def request_stop(self, group: Group, reason: str, grace_s: float | None = None) -> None:
        """Ask a run's replicas to exit: SIGTERM (SIGKILL after ``grace_s``), or SIGKILL at once for 0."""
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        self.account(group, self.clock())
        group.stop_reason = reason
        group.stop_deadline = self.monotonic() + grace
        group.stop_requested_at = self.clock()
        live = [h for h in group.handles if h.rank not in group.exits]
        self.backend.signal(live, signal.SIGKILL if grace <= 0 else signal.SIGTERM)
        group.killed = grace <= 0
        if group.killed:
            group.stop_deadline = self.monotonic() + KILL_WAIT_S
        logger.info("job %s: stopping restart %d (%s)", group.job_id, group.restart, reason)

    # ------------------------------------------------------------------ recovery and shutdown

    def recover(self) -> dict[str, int]:
        """After a (re)start: adopt the live replicas of active jobs, stop orphans. Returns counts."""
        self.refresh_nodes()
        recovered = recover_runs(self.store, self.backend, self.clock)
        self.groups.update(recovered.groups)
        for job_id in recovered.rescaling:
            self.request_stop(self.groups[job_id], "re-allocated")
        self.request_round()
        return {"adopted": len(recovered.groups), "orphans": recovered.orphans}

    def shutdown(self, grace_s: float | None = None) -> None:
        """Preempt every running job (SIGTERM, checkpoint, exit) and leave it pending for the next start."""
        self.scheduler.close()            # its policy process, if large rounds started one
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        with self.lock:
            for x in list(self.launching.values()):
                ready = self.backend.ready(x.starts, 5.0) if x.starts is not None else set()
                if x.starts is not None and ready == set(x.starts):
                    self.launches.advance(x, self.store.get_job(x.job_id), ready, self.monotonic(),
                                          self.clock())
                else:   # its processes, if any, have not reported: kill them with their actors
                    self.launching.pop(x.job_id)
                    self.backend.signal(x.handles, signal.SIGKILL, timeout_s=2.0)
                    self.backend.release(x.handles)
            for g in list(self.groups.values()):
                if not g.stopping:
                    self.request_stop(g, "service stopped")
                g.stop_deadline = min(g.stop_deadline or 0.0, self.monotonic() + grace)
            deadline = time.monotonic() + grace + 15.0   # real time: bounds the wait whatever the clock
            while self.groups and time.monotonic() < deadline:
                self.exits.collect(0.2)
                for g in list(self.groups.values()):
                    self.exits.poll(g, self.store.get_job(g.job_id), self.clock())
            for jid in list(self.groups):
                self.exits.end(self.groups[jid])
            for job in self.store.list_jobs(ACTIVE_STATES):
                self.store.transition(job.id, JobState.PENDING, reason="service stopped", now=self.clock(),
                                      expect=ACTIVE_STATES)

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                logger.exception("control loop tick failed")
            stop.wait(max(self.config.tick_s - (time.monotonic() - started), 0.0))
