"""The Litz master of an elastic service job (`pollux.litz.service.ServiceMaster`) against the real
service: the production store, API (HTTP on loopback) and controller over the in-memory fake backend,
with a fake run in place of the Ray runtime. It follows each new allocation in place, acknowledges
it only once moved, waits for a node Ray does not show yet, reports hints the service accepts, and
stops on preemption — and the controller takes each acknowledged placement as the run's own, with
no restart. No Ray: the whole file runs in seconds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from api_helpers import serve_on_loopback
from elastic_rig import ADMIN, Rig
from pollux import contract as ct
from pollux.cluster.api.app import create_app
from pollux.litz.service import ServiceMaster
from pollux.litz.service_link import ServiceLink


@dataclass
class FakeSummary:
    tasks_completed: int

    def to_dict(self) -> dict[str, Any]:
        return {"tasks_completed": self.tasks_completed}


@dataclass
class FakeRun:
    """A run that completes one task per status read; a move takes three status reads."""

    node_ids: list[str]
    resizes: list[list[str]] = field(default_factory=list)
    stopped_with_checkpoint: bool | None = None
    tasks: int = 0
    moving: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def num_workers(self) -> int:
        return len(self.node_ids)

    def run(self) -> FakeSummary:
        assert self.done.wait(60), "the master never stopped the run"
        return FakeSummary(self.tasks)

    def status(self) -> dict[str, Any]:
        self.tasks += 1
        self.moving = max(self.moving - 1, 0)
        return {"tasks_completed": self.tasks, "workers": len(self.node_ids), "resizing": self.moving > 0}

    def resize(self, num_workers: int | None = None, num_shards: int | None = None,
               node_ids: list[str] | None = None) -> None:
        assert node_ids is not None
        self.resizes.append(list(node_ids))
        self.node_ids = list(node_ids)
        self.moving = 3

    def stop(self, checkpoint: bool = False) -> None:
        self.stopped_with_checkpoint = checkpoint
        self.done.set()


class FakeNodes:
    """The service's node names → the ids Litz places by; a test adds a node Ray shows late."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = dict(ids)

    def node_ids(self) -> dict[str, str]:
        return dict(self.ids)


class CheckedLink(ServiceLink):
    """The master's link as the service's launch sets it up (the job id and token of its env), which
    also records, at each acknowledgement, whether the run was still moving its workers."""

    def __init__(self, rig: Rig, url: str, job_id: str, runs: list[FakeRun]) -> None:
        (launches,) = rig.backend.requested(job_id)
        env = launches[0].env
        super().__init__(url, env[ct.ENV_JOB_ID], env[ct.ENV_JOB_TOKEN])
        self.runs = runs
        self.acked_while_moving: list[int] = []

    def ack(self, version: int):
        if self.runs and self.runs[-1].moving > 0:
            self.acked_while_moving.append(version)
        return super().ack(version)


def _until(check, what: str, rig: Rig | None = None, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if rig is not None:
            rig.tick()
        time.sleep(0.02)


@pytest.fixture
def served(tmp_path):
    rig = Rig(tmp_path)
    with serve_on_loopback(create_app(rig.store, ADMIN)) as url:
        yield rig, url
    rig.store.close()


def test_the_master_follows_allocations_in_place_and_the_service_takes_them(served):
    rig, url = served
    rig.submit("litz", {"node-0": 2})
    rig.tick(4)
    assert rig.store.get_job("litz").state == "running"
    group = rig.controller.groups["litz"]
    runs: list[FakeRun] = []

    def make_run(node_ids: list[str]) -> FakeRun:
        runs.append(FakeRun(node_ids))
        return runs[-1]

    nodes = FakeNodes({"node-0": "ray-0", "node-1": "ray-1"})     # node-2 not seen by Ray yet
    link = CheckedLink(rig, url, "litz", runs)
    master = ServiceMaster(link, nodes, make_run, num_executors=8,
                           checkpoint=True, poll_s=0.02, hints_every_s=0.0)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(master.run()), daemon=True)
    thread.start()
    try:
        _until(lambda: bool(runs), "the run to start")
        assert runs[0].node_ids == ["ray-0", "ray-0"]               # one worker per allocated GPU
        _until(lambda: rig.store.allocation_version("litz")[2] >= 1, "the first acknowledgement")
        _until(lambda: rig.store.get_hints("litz") is not None, "hints")
        hints = rig.store.get_hints("litz")
        assert hints["init_batch_size"] == 8 and hints["max_batch_size"] == 8

        # Grow: the master moves its workers, acknowledges, and the controller adopts the placement.
        rig.allocate("litz", {"node-0": 2, "node-1": 2})
        _until(lambda: group.placement == {"node-0": 2, "node-1": 2}, "the grown placement", rig)
        assert runs[0].resizes[-1] == ["ray-0", "ray-0", "ray-1", "ray-1"]

        # A node Ray does not show yet: no move and no acknowledgement until it does.
        rig.allocate("litz", {"node-2": 2})
        rig.tick(3)
        time.sleep(0.2)
        version, _, applied = rig.store.allocation_version("litz")
        assert applied < version and len(runs[0].resizes) == 1
        assert group.placement == {"node-0": 2, "node-1": 2} and group.resize_target == {"node-2": 2}
        nodes.ids["node-2"] = "ray-2"
        _until(lambda: group.placement == {"node-2": 2}, "the move to the late node", rig)
        assert runs[0].resizes[-1] == ["ray-2", "ray-2"]

        job_now = rig.store.get_job("litz")
        assert job_now.state == "running" and job_now.restarts == 0 and not rig.backend.signals
        assert len(runs) == 1 and len(rig.backend.requested("litz")) == 1    # one master, never relaunched
        assert link.acked_while_moving == []            # each version acknowledged once its move was done
    finally:
        master.preempt()
        thread.join(10)
    assert not thread.is_alive()
    assert runs[0].stopped_with_checkpoint is True and result["preempted"] is True
    assert [r["version"] for r in result["resizes_applied"]] == [version - 1, version]


def test_a_master_preempted_before_its_run_starts_stops_it_at_once(served):
    rig, url = served
    rig.submit("litz", {"node-0": 1})
    rig.tick(4)
    made: list[FakeRun] = []

    def make_run(node_ids: list[str]) -> FakeRun:
        made.append(FakeRun(node_ids))
        return made[-1]

    master = ServiceMaster(CheckedLink(rig, url, "litz", made), FakeNodes({"node-0": "ray-0"}), make_run,
                           num_executors=4, checkpoint=False, poll_s=0.02)
    master.preempt()                                  # SIGTERM came while the master was starting
    out = master.run()
    assert made[0].stopped_with_checkpoint is False and out["preempted"] is True
    assert out["resizes_applied"] == []
