"""Every transition of the job lifecycle (docs/cluster.md) through the production path — the
scheduling round (:meth:`Scheduler.decide` via :meth:`Controller.run_round`) and the control loop —
against the in-memory fake backend and a fake clock: no Ray, no process, the whole file in ~1 s.
"""

from __future__ import annotations

import itertools
import signal

import pytest

from fake_backend import FakeBackend, FakeClock
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.service import release_jobs
from pollux.cluster.state.lifecycle import (
    JOB_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    check_transition,
)
from pollux.cluster.state.store import JobStore
from pollux.contract import ENV_JOB_ID, ENV_MASTER_PORT, ENV_NUM_REPLICAS, ENV_RANK, ENV_RESTARTS

S = JobState


class ScriptedPolicy:
    """A policy answering the allocation the test sets in ``plan`` (for jobs the round sees)."""

    name = "scripted"

    def __init__(self) -> None:
        self.plan: dict[str, dict[str, int]] = {}

    def decide(self, jobs, *args, **kwargs):
        ids = {v.id for v in jobs}
        return {j: dict(a) for j, a in self.plan.items() if j in ids and a}, None


class Rig:
    """A store, the fake backend, a fake clock and a controller over them."""

    def __init__(self, tmp_path, nodes=None, policy: str | None = None, **config) -> None:
        self.tmp = tmp_path
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.clock = FakeClock()
        self.backend = FakeBackend(nodes)
        self.store = JobStore(tmp_path / "jobs.db")
        settings = {"interval_s": 3600.0, "stop_grace_s": 30.0, "launch_timeout_s": 20.0, "max_retries": 2,
                    "retry_backoff_s": 1.0, "max_backoff_s": 4.0, "node_hold_s": 120.0, **config}
        self.config = ControllerConfig(state_dir=tmp_path, **settings)
        self.scripted = ScriptedPolicy()
        self.policy = policy
        self.controller = self.new_controller()

    def new_controller(self) -> Controller:
        sched = Scheduler(self.store, policy_name=self.policy or "fifo")
        if self.policy is None:
            sched.policy = self.scripted   # type: ignore[assignment]
        return Controller(self.store, self.backend, sched, self.config, clock=self.clock,
                          monotonic=self.clock)

    def submit(self, job_id: str, plan: dict[str, int] | None = None, **spec) -> str:
        body = {"entrypoint": "train.py", "init_batch_size": 8, **spec}
        self.store.submit(body, job_id=job_id, now=self.clock())
        if plan is not None:
            self.scripted.plan[job_id] = plan
        self.controller.request_round()
        return job_id

    def tick(self, n: int = 1, dt: float = 0.5) -> None:
        for _ in range(n):
            self.clock.advance(dt)
            self.controller.tick()

    def until(self, cond, what: str, limit: int = 200, dt: float = 0.5) -> None:
        for _ in range(limit):
            if cond():
                return
            self.tick(dt=dt)
        jobs = [(j.id, j.state, j.failure_reason) for j in self.store.list_jobs()]
        raise AssertionError(f"never {what}: {jobs}")

    def job(self, job_id: str):
        return self.store.get_job(job_id)

    def state(self, job_id: str) -> str:
        return self.store.get_job(job_id).state

    def path(self, job_id: str) -> list[str]:
        return [t.to_state for t in self.store.transitions(job_id)]

    def running(self, job_id: str) -> None:
        """Tick until the job runs a run that is not stopping (a failed run restarts in "running")."""
        def live() -> bool:
            group = self.controller.groups.get(job_id)
            return self.state(job_id) == S.RUNNING and group is not None and not group.stopping
        self.until(live, f"{job_id} running")


@pytest.fixture
def rig(tmp_path):
    made = []

    def make(**kw) -> Rig:
        r = Rig(tmp_path / f"rig{len(made)}", **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.store.close()


# ------------------------------------------------------------------------------------------- the table


def test_transition_table_is_the_one_rule_for_store_and_every_pair_is_checked(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    for old, new in itertools.product(JOB_STATES, JOB_STATES):
        legal = JobState(new) in TRANSITIONS[JobState(old)]
        if legal:
            assert check_transition("j", old, new) == new
        else:
            with pytest.raises(IllegalTransition, match=f"from '{old}' to '{new}'"):
                check_transition("j", old, new)
    assert all(not TRANSITIONS[s] for s in TERMINAL_STATES)
    with pytest.raises(ValueError, match="unknown job state"):
        check_transition("j", "pending", "exploded")
    # The store applies the same table, and a refused move writes nothing (failure count included).
    store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id="a")
    with pytest.raises(IllegalTransition):
        store.transition("a", S.RUNNING, failure=True, restart=True)
    job = store.get_job("a")
    assert (job.state, job.failures, job.restarts) == ("pending", 0, 0)
    job = store.transition("a", S.STARTING, allocation={"n": 2}, reason="allocated")
    assert (job.state, job.allocation) == ("starting", {"n": 2})
    job = store.transition("a", S.PENDING, failure=True, restart=True, reason="launch failed")
    assert (job.state, job.failures, job.restarts, job.allocation) == ("pending", 1, 1, {})
    # ``expect``: a move decided on a stale state writes nothing.
    store.transition("a", S.CANCELLED)
    assert store.transition("a", S.STARTING, expect=("pending",), allocation={"n": 1}).state == "cancelled"
    assert store.get_job("a").allocation == {}
    store.close()


# ------------------------------------------------------------------------------------- launch and finish


def test_launch_pending_starting_running_succeeded(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2})
    r.submit("a", {"node-0": 2, "node-1": 1})
    r.tick()
    assert r.state("a") == S.STARTING and r.job("a").allocation == {"node-0": 2, "node-1": 1}
    r.running("a")
    (launches,) = r.backend.requested("a")
    assert [(s.rank, s.node) for s in launches] == [(0, "node-0"), (1, "node-0"), (2, "node-1")]
    env = launches[2].env
    assert env[ENV_JOB_ID] == "a" and env[ENV_RANK] == "2" and env[ENV_NUM_REPLICAS] == "3"
    assert env[ENV_RESTARTS] == "0" and env[ENV_MASTER_PORT] == "29500"
    reps = r.store.replicas("a", 0)
    assert [x.pid for x in reps] == [x.pid for x in r.backend.of("a")] and all(x.pid for x in reps)
    assert r.path("a") == ["pending", "starting", "running"]
    t_run = r.store.transitions("a")[-1].time
    assert t_run == r.clock() or t_run < r.clock()   # records carry the injected clock's time
    r.backend.exit("a", code=0)
    r.tick()
    job = r.job("a")
    assert job.state == S.SUCCEEDED and job.allocation == {} and job.failures == 0 and job.restarts == 0
    assert r.path("a")[-1] == "succeeded" and not r.backend.of("a")
    assert [x.exit_code for x in r.store.replicas("a", 0)] == [0, 0, 0]
    assert job.attained_service >= 0.0


def test_launch_never_blocks_on_another_job_still_holding_its_gpus(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.ignore_term.add("a")
    r.scripted.plan = {"b": {"node-0": 2}}   # a is preempted for b
    r.submit("b")
    r.tick(2)
    assert r.state("a") in (S.RESCALING, S.PENDING) and r.backend.requested("b") == []
    r.clock.advance(31.0)                     # stop grace over: SIGKILL
    r.running("b")
    assert r.job("b").failures == 0 and r.job("a").failures == 0
    assert r.state("a") == S.PENDING



def test_a_starting_job_whose_gpus_are_taken_back_goes_pending(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.ignore_term.add("a")
    r.scripted.plan = {"b": {"node-0": 2}}
    r.submit("b")
    r.tick(2)
    assert r.state("b") == S.STARTING and r.backend.requested("b") == []   # waits for a's GPUs
    r.scripted.plan = {}
    r.controller.request_round()
    r.tick(2)
    assert r.state("b") == S.PENDING and r.store.transitions("b")[-1].reason == "no GPUs allocated"
    assert r.path("b") == ["pending", "starting", "pending"] and r.job("b").restarts == 0


def test_a_failed_run_whose_gpus_are_taken_back_goes_pending_from_running(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.exit("a", rank=0, code=1)
    r.scripted.plan = {}
    r.controller.request_round()
    r.tick(2)
    job = r.job("a")
    assert job.state == S.PENDING and (job.failures, job.restarts) == (1, 1) and job.allocation == {}
    assert r.path("a") == ["pending", "starting", "running", "pending"]
    assert r.store.transitions("a")[-1].reason == "failure: replica 0 on node-0 exited with code 1"


# ------------------------------------------------------------------------------------------- rescaling


def test_rescale_by_preemption_running_rescaling_running(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2})
    r.submit("a", {"node-0": 1})
    r.running("a")
    r.scripted.plan["a"] = {"node-0": 2, "node-1": 2}
    r.controller.request_round()
    r.tick(2)   # the round ends a tick; the next one acts on it
    assert r.state("a") == S.RESCALING
    assert [sig for _, sig in r.backend.signals] == [signal.SIGTERM]   # the agent checkpoints, exits 143
    r.running("a")
    job = r.job("a")
    assert (job.restarts, job.failures) == (1, 0)
    assert r.path("a") == ["pending", "starting", "running", "rescaling", "running"]
    assert r.store.replicas("a", 0)[0].exit_code == 143
    new = r.backend.requested("a")[-1]
    assert len(new) == 4 and all(s.env[ENV_RESTARTS] == "1" for s in new)


def test_preempted_to_zero_goes_pending_then_resumes(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.scripted.plan["a"] = {}
    r.controller.request_round()
    r.until(lambda: r.state("a") == S.PENDING, "pending")
    assert r.path("a") == ["pending", "starting", "running", "rescaling", "pending"]
    assert r.job("a").restarts == 1 and r.job("a").failures == 0 and r.job("a").allocation == {}
    r.scripted.plan["a"] = {"node-0": 1}
    r.controller.request_round()
    r.running("a")
    assert r.job("a").restarts == 1


def test_replica_that_preempts_itself_restarts_without_a_failure(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.exit("a", rank=1, code=143)
    r.tick()
    assert r.backend.of("a")[0].signals == [signal.SIGTERM]
    r.until(lambda: r.job("a").restarts == 1 and r.state("a") == S.RUNNING, "relaunched")
    assert r.job("a").failures == 0


# --------------------------------------------------------------------------------------------- failures


def test_run_failures_restart_with_backoff_then_fail_with_the_reason(rig):
    r = rig(nodes={"node-0": 2}, max_retries=2)
    r.submit("a", {"node-0": 2})
    for k in (1, 2):
        r.running("a")
        r.backend.exit("a", rank=1, code=3)
        r.tick(dt=0.0)
        assert r.job("a").failures == k and r.backend.of("a")[0].signals == [signal.SIGTERM]
        r.tick(dt=0.0)   # the others exited 143; restart counted; the backoff holds the relaunch
        assert r.job("a").restarts == k and not r.backend.of("a")
        r.tick(3, dt=0.0)
        assert not r.backend.of("a"), "relaunched before its backoff"
    r.running("a")
    r.backend.exit("a", rank=0, code=1)
    r.tick()
    job = r.job("a")
    assert job.state == S.FAILED and job.failures == 3
    assert job.failure_reason == "replica 0 on node-0 exited with code 1 (failure 3, retries exhausted)"
    assert r.backend.of("a")[1].signals == [signal.SIGTERM]
    r.tick(dt=3.0)   # cancel_grace_s (2 s) over: SIGKILL, released
    assert not r.backend.of("a") and r.job("a").state == S.FAILED


@pytest.mark.parametrize("how, reason", [
    ("start", "launch of restart 0 failed: replica 0 on node-0: cannot start 'train.sh': [Errno 13]"),
    ("create", "launch of restart 0 failed: BackendError: no actor for you"),
    ("place", "launch of restart 0 failed: replica 0 on node-0 was not placed within 20 s"),
    ("shape", "launch of restart 0 failed: the allocation {'node-0': 1} forms no replica"),
])
def test_launch_failures_count_back_to_pending_then_fail(rig, how, reason):
    from pollux.cluster.backends.api import BackendError
    r = rig(nodes={"node-0": 2}, max_retries=1)
    spec = {"resources": {"GPU": 2}} if how == "shape" else {}
    r.submit("a", {"node-0": 1} if how == "shape" else {"node-0": 2}, **spec)
    if how == "start":
        r.backend.start_error["a"] = "cannot start 'train.sh': [Errno 13] Permission denied"
    elif how == "create":
        r.backend.create_error["a"] = BackendError("no actor for you")
    elif how == "place":
        r.backend.unplaceable.add("a")
    r.until(lambda: r.job("a").failures == 1, "one failure", dt=1.0)
    job = r.job("a")
    assert job.state in (S.PENDING, S.STARTING)
    first = next(t for t in r.store.transitions("a") if t.reason and "launch of" in t.reason)
    assert first.to_state == "pending" and first.reason.startswith(reason)
    r.until(lambda: r.job("a").terminal, "failed", dt=1.0)
    job = r.job("a")
    assert job.state == S.FAILED and job.failures == 2
    assert job.failure_reason.split(" failed: ", 1)[1].startswith(reason.split(" failed: ", 1)[1])
    assert job.failure_reason.endswith("(failure 2, retries exhausted)")
    assert not r.backend.replicas, "a failed launch left replicas behind"
    if how == "shape":
        assert r.backend.launched == []   # nothing was ever asked of the backend


# ------------------------------------------------------------------------ the GPU bug of issue 11, item 3


def test_replicas_of_several_gpus_never_request_more_than_the_policy_granted(rig):
    """``resources`` is per replica and the allocation is in GPU slots: a job asking {"GPU": 2}
    on 3 slots forms one replica of 2 GPUs, on 4 slots two — never one replica per slot."""
    r = rig(nodes={"node-0": 4, "node-1": 4})
    r.submit("a", {"node-0": 4, "node-1": 3}, resources={"GPU": 2, "CPU": 1})
    r.running("a")
    (launches,) = r.backend.requested("a")
    asked: dict[str, float] = {}
    for s in launches:
        asked[s.node] = asked.get(s.node, 0.0) + s.resources["GPU"]
    granted = r.job("a").allocation
    assert asked == {"node-0": 4.0, "node-1": 2.0}
    assert all(asked[n] <= granted[n] for n in asked)
    assert [s.env[ENV_NUM_REPLICAS] for s in launches] == ["3"] * 3


def test_real_policy_grants_cover_what_multi_gpu_replicas_request(rig):
    r = rig(nodes={"node-0": 4, "node-1": 4}, policy="pollux")
    r.submit("a", resources={"GPU": 2})
    r.submit("b", resources={"GPU": 3})
    r.submit("c")
    r.until(lambda: all(r.state(j) == S.RUNNING for j in "abc"), "all running")
    for jid in "abc":
        granted = r.job(jid).allocation
        for launches in r.backend.requested(jid):
            asked: dict[str, float] = {}
            for s in launches:
                asked[s.node] = asked.get(s.node, 0.0) + s.resources.get("GPU", 1.0)
            assert all(asked[n] <= granted.get(n, 0) for n in asked), (jid, asked, granted)
    assert r.job("a").failures == r.job("b").failures == 0


# ----------------------------------------------------------------------------------------- node loss


def test_node_loss_counts_one_failure_and_never_relaunches_on_the_lost_node(rig):
    """Bug: the lost node stayed in the controller's nodes until the backend dropped it, so the job
    was relaunched there at once, that launch failed too, and one loss counted two failures."""
    r = rig(nodes={"node-0": 2, "node-1": 2, "node-2": 2}, policy="fifo", max_retries=5)
    r.submit("a", min_replicas=4)
    r.running("a")
    lost = sorted(r.job("a").allocation)[-1]
    n_launches = len(r.backend.launched)
    r.backend.lose_node(lost)   # Ray still lists it for a while
    r.until(lambda: r.job("a").restarts >= 1 and "a" in r.controller.groups
            and not r.controller.groups["a"].stopping, "relaunched", limit=400)
    job = r.job("a")
    assert job.failures == 1, [t.reason for t in r.store.transitions("a")]
    assert lost not in job.allocation
    assert all(s.node != lost for _, _, ls in r.backend.launched[n_launches:] for s in ls)
    # The backend drops the node, and a node of that name that joins again is usable at once.
    r.backend.drop_node(lost)
    r.controller.request_round()
    r.tick()
    assert lost not in r.controller.cluster.nodes
    r.backend.add_node(lost, 2)
    r.controller.request_round()
    r.tick()
    assert lost in r.controller.cluster.nodes


def test_a_held_node_that_the_backend_keeps_listing_returns_after_node_hold_s(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2}, node_hold_s=10.0)
    r.submit("a", {"node-1": 2})
    r.running("a")
    r.backend.lose_node("node-1")
    r.backend.down.discard("node-1")   # only the replica's actor died; the node is fine
    r.scripted.plan["a"] = {"node-0": 2}
    r.until(lambda: r.state("a") == S.RUNNING and r.job("a").restarts == 1, "moved")
    assert "node-1" not in r.controller.cluster.nodes
    r.clock.advance(11.0)
    r.controller.request_round()
    r.tick()
    assert "node-1" in r.controller.cluster.nodes


# ------------------------------------------------------------------------------------- cancel and stop


def test_cancel_running_pending_and_launching_jobs(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2})
    r.submit("run", {"node-0": 2})
    r.running("run")
    r.backend.ignore_term.add("run")
    r.store.transition("run", S.CANCELLED, reason="cancelled by user")   # what the API's cancel does
    r.tick(dt=0.1)
    assert r.backend.of("run")[0].signals == [signal.SIGTERM]
    r.tick(dt=2.5)   # cancel_grace_s over: SIGKILL
    assert r.backend.of("run")[0].signals == [signal.SIGTERM, signal.SIGKILL]
    r.tick()         # the exits reported: released
    assert not r.backend.of("run") and r.state("run") == S.CANCELLED

    r.submit("wait")   # no GPUs planned: stays pending
    r.tick()
    r.store.transition("wait", S.CANCELLED)
    r.tick()
    assert r.backend.requested("wait") == [] and r.path("wait") == ["pending", "cancelled"]

    r.backend.unplaceable.add("mid")
    r.submit("mid", {"node-1": 2})
    r.until(lambda: "mid" in r.controller.launching, "launching")
    r.store.transition("mid", S.CANCELLED)
    r.tick()
    assert "mid" not in r.controller.launching and not r.backend.of("mid")
    assert r.job("mid").failures == 0 and r.state("mid") == S.CANCELLED


def test_round_does_not_resurrect_a_job_cancelled_meanwhile(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    original = r.controller.scheduler.decide

    def cancel_during_round(now, cluster):
        result = original(now, cluster)
        r.store.transition("a", S.CANCELLED)
        return result

    r.controller.scheduler.decide = cancel_during_round   # type: ignore[method-assign]
    r.tick()
    job = r.job("a")
    assert job.state == S.CANCELLED and job.allocation == {} and r.path("a") == ["pending", "cancelled"]


def test_graceful_stop_leaves_running_jobs_pending(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.controller.shutdown(grace_s=5)
    job = r.job("a")
    assert job.state == S.PENDING and job.allocation == {} and job.failures == 0
    assert r.store.transitions("a")[-1].reason == "service stopped"
    assert not r.backend.replicas and [x.exit_code for x in r.store.replicas("a", 0)] == [143, 143]


def test_ray_lost_releases_active_jobs_with_one_restart_each(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    assert release_jobs(r.store, "GCS gone") == 1
    job = r.job("a")
    assert job.state == S.PENDING and job.restarts == 1
    assert [x.exit_code for x in r.store.replicas("a", 0)] == [-9, -9]


# ------------------------------------------------------------------------------- service restarts


def test_restarted_service_adopts_live_runs_and_stops_orphans(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2})
    r.submit("a", {"node-0": 2})
    r.submit("b", {"node-1": 2})
    r.running("a")
    r.running("b")
    # The service dies. Meanwhile a replica of b is lost, and an actor of nobody's run appears.
    r.backend.lose_node("node-1")
    r.backend.down.discard("node-1")
    r.backend.create_actors("ghost", 0, r.backend.requested("a")[0][:1])
    r.controller = r.new_controller()
    counts = r.controller.recover()
    assert counts == {"adopted": 1, "orphans": 1}
    assert r.backend.orphans_killed == ["ghost/0/0"]
    assert set(r.controller.groups) == {"a"}
    b = r.job("b")
    assert b.restarts == 1 and b.failures == 0
    assert all(x.exit_code is not None for x in r.store.replicas("b", 0))
    r.until(lambda: r.state("b") == S.RUNNING and r.backend.of("b"), "b relaunched")
    r.backend.exit("a", code=0)   # the adopted run finishes normally
    r.tick()
    assert r.state("a") == S.SUCCEEDED and r.job("a").restarts == 0


def test_a_run_that_exited_while_the_service_was_down_is_adopted_with_its_exit(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.exit("a", code=0)
    r.controller = r.new_controller()
    assert r.controller.recover() == {"adopted": 1, "orphans": 0}
    r.tick()
    assert r.state("a") == S.SUCCEEDED


def test_a_restarted_service_finishes_a_rescale_it_had_begun(rig):
    r = rig(nodes={"node-0": 2})
    r.submit("a", {"node-0": 2})
    r.running("a")
    r.backend.ignore_term.add("a")
    r.scripted.plan["a"] = {"node-0": 1}
    r.controller.request_round()
    r.tick(2)
    assert r.state("a") == S.RESCALING
    r.backend.ignore_term.clear()
    r.controller = r.new_controller()
    r.controller.recover()
    r.running("a")
    assert r.job("a").restarts == 1 and len(r.backend.requested("a")[-1]) == 1


def test_the_fake_and_ray_backends_implement_the_protocol():
    from pollux.cluster.backends.api import Backend
    from pollux.cluster.backends.ray_backend import RayBackend
    assert isinstance(FakeBackend(), Backend)
    methods = [m for m in vars(Backend) if not m.startswith("_") and callable(getattr(Backend, m))]
    assert len(methods) >= 12
    assert [m for m in methods if not callable(getattr(RayBackend, m, None))] == []


def test_rescaling_jobs_can_be_cancelled_fast_or_fail_their_relaunch(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2}, max_retries=0)
    r.submit("a", {"node-0": 1})
    r.submit("b", {"node-1": 1})
    r.running("a")
    r.running("b")
    r.backend.ignore_term.add("a")
    r.scripted.plan.update(a={"node-0": 2}, b={"node-1": 2})
    r.backend.start_error["b"] = "cannot start 'train.py': gone"
    r.controller.request_round()
    r.tick(2)
    assert r.state("a") == r.state("b") == S.RESCALING
    r.store.transition("a", S.CANCELLED, reason="cancelled by user")
    r.until(lambda: r.job("b").terminal, "b's relaunch to fail")
    assert r.path("a")[-2:] == ["rescaling", "cancelled"]
    assert r.path("b")[-2:] == ["rescaling", "failed"]
    assert r.job("b").failure_reason.startswith("launch of restart 1 failed: replica 0 on node-1: cannot")
    # Bug: a job cancelled while it stopped for a rescale kept the 30 s preemption grace; a cancel
    # needs no checkpoint, so its replicas are killed after cancel_grace_s (2 s).
    r.tick(dt=2.5)
    r.tick(dt=0.0)
    assert not r.backend.replicas


def test_balance_mode_reaches_every_replica_env_only_when_not_off(rig):
    from pollux.contract import ENV_BALANCE

    r = rig(nodes={"node-0": 2, "node-1": 2})
    r.submit("lb", {"node-0": 1, "node-1": 1}, balance="cpu")
    r.submit("eq", {"node-0": 1, "node-1": 1})
    r.running("lb")
    r.running("eq")
    (balanced,) = r.backend.requested("lb")
    assert [s.env.get(ENV_BALANCE) for s in balanced] == ["cpu", "cpu"]
    (plain,) = r.backend.requested("eq")
    assert all(ENV_BALANCE not in s.env for s in plain)
