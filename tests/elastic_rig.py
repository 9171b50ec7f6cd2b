"""A service with a scripted policy over the in-memory fake backend, for elastic jobs' tests: the
production store, scheduler and controller, a clock the test moves, allocations the test writes."""

from __future__ import annotations

from fake_backend import FakeBackend, FakeClock
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.records import JobRecord
from pollux.cluster.state.store import JobStore

ADMIN = "admin-token-for-tests"
NODES = {"node-0": 2, "node-1": 2, "node-2": 2}


class PlanPolicy:
    """Answers the allocation in ``plan``."""

    name = "plan"

    def __init__(self) -> None:
        self.plan: dict[str, dict[str, int]] = {}

    def decide(self, jobs, cluster, *args, **kwargs):
        ids = {v.id for v in jobs}
        return {j: dict(a) for j, a in self.plan.items() if j in ids and a}, None


class Rig:
    def __init__(self, tmp_path, resize_timeout_s: float = 10.0) -> None:
        self.clock = FakeClock()
        self.backend = FakeBackend(dict(NODES))
        self.backend.address = "127.0.0.1:6379"      # what RayBackend exposes
        self.store = JobStore(tmp_path / "jobs.db")
        self.policy = PlanPolicy()
        sched = Scheduler(self.store, policy_name="fifo")
        sched.policy = self.policy   # type: ignore[assignment]
        config = ControllerConfig(state_dir=tmp_path, interval_s=3600.0, launch_timeout_s=20.0,
                                  resize_timeout_s=resize_timeout_s)
        self.controller = Controller(self.store, self.backend, sched, config, clock=self.clock,
                                     monotonic=self.clock)

    def submit(self, job_id: str, plan: dict[str, int], kind: str = "elastic") -> JobRecord:
        job = self.store.submit({"entrypoint": "litz.py", "init_batch_size": 8, "kind": kind}, job_id=job_id,
                                now=self.clock())
        self.allocate(job_id, plan)
        return job

    def allocate(self, job_id: str, plan: dict[str, int]) -> None:
        self.policy.plan[job_id] = plan
        self.controller.request_round()

    def tick(self, n: int = 1, dt: float = 0.5) -> None:
        for _ in range(n):
            self.clock.advance(dt)
            self.controller.tick()

    def ack(self, job_id: str) -> None:
        version, _, _ = self.store.allocation_version(job_id)
        assert self.store.ack_allocation(job_id, version, now=self.clock())
