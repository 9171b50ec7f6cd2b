"""The simulator's cloud (issue 36): nodes asked for arrive after the provisioning delay, are billed
from the ask to the give-back, are drained before they go (their jobs moved first), and a one-job
run on the goodput rule grows its cluster over training while Or et al.'s grows early."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pollux.policy.autoscale import Fleet, ScaleDecision, make_autoscaler
from pollux.policy.registry import make_policy
from pollux.sim.engine import SimConfig, simulate
from pollux.sim.fleet import CloudConfig, CloudFleet
from pollux.sim.profiles import load_profiles
from pollux.sim.workload import WorkloadJob

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux-osdi21" / "traces"


class Scripted:
    """An autoscaler answering the targets the test sets, and noting what it was shown."""

    name = "scripted"

    def __init__(self, *targets: int) -> None:
        self.targets = list(targets)
        self.seen: list[Fleet] = []

    def decide(self, jobs, fleet, state, now):
        self.seen.append(fleet)
        return ScaleDecision(self.targets.pop(0), "scripted"), {}


def test_nodes_arrive_after_the_delay_and_are_billed_from_the_ask():
    rule = Scripted(3, 3, 3)
    fleet = CloudFleet(CloudConfig(min_nodes=1, max_nodes=4, provision_delay_s=120.0), rule)
    assert fleet.offered(0.0).nodes == ("node-0",)
    fleet.after_round([], np.zeros(4, dtype=np.int64), 0.0)      # asks for two more at t = 0
    assert fleet.offered(60.0).nodes == ("node-0",)              # not here yet
    fleet.after_round([], np.zeros(4, dtype=np.int64), 60.0)
    assert fleet.offered(120.0).nodes == ("node-0", "node-1", "node-2")
    fleet.after_round([], np.zeros(4, dtype=np.int64), 120.0)
    assert [(f.ready, f.pending) for f in rule.seen] == [(1, 0), (1, 2), (3, 0)]
    assert fleet.report.node_seconds == pytest.approx(3 * 120.0)    # three nodes from 0 to 120 s
    assert fleet.report.held == [3, 3, 3] and fleet.report.ready == [1, 1, 3]
    fleet.finish(180.0)
    assert fleet.report.node_hours == pytest.approx(3 * 180.0 / 3600.0)


def test_a_node_goes_only_once_its_jobs_are_moved_off():
    rule = Scripted(1, 1, 2)
    fleet = CloudFleet(CloudConfig(min_nodes=1, max_nodes=3, initial_nodes=3, provision_delay_s=0.0), rule)
    fleet.offered(0.0)
    fleet.after_round([], np.array([4, 0, 2]), 0.0)       # shrink to 1: the two least used go
    # node-1 held nothing and is given back now; node-2 still holds a job: drained, not gone.
    assert fleet.status == ["ready", "absent", "draining"]
    assert fleet.offered(60.0).nodes == ("node-0",)       # the policy no longer sees node-2
    fleet.after_round([], np.array([4, 0, 2]), 60.0)      # its job has not moved yet: it stays
    assert fleet.status == ["ready", "absent", "draining"]
    fleet.after_round([], np.array([4, 0, 0]), 120.0)     # moved off: node-2 goes; then grow to 2
    assert fleet.status == ["ready", "pending", "absent"]  # asked for now, here at the next round
    assert fleet.offered(120.0).nodes == ("node-0", "node-1")
    # Billed: three nodes 0 s, two for 0–120 s (node-0 and the drained node-2).
    assert fleet.report.node_seconds == pytest.approx(2 * 120.0)


def test_growing_takes_back_a_drained_node_before_asking_for_a_new_one():
    rule = Scripted(1, 2)
    fleet = CloudFleet(CloudConfig(min_nodes=1, max_nodes=3, initial_nodes=2), rule)
    fleet.offered(0.0)
    fleet.after_round([], np.array([4, 1, 0]), 0.0)
    assert fleet.status == ["ready", "draining", "absent"]
    fleet.after_round([], np.array([4, 1, 0]), 60.0)
    assert fleet.status == ["ready", "ready", "absent"]


def test_bad_cloud_settings_are_refused():
    with pytest.raises(ValueError, match="MIN <= MAX"):
        CloudConfig(min_nodes=3, max_nodes=2)
    with pytest.raises(ValueError, match="provision_delay_s"):
        CloudConfig(provision_delay_s=-1)
    with pytest.raises(ValueError, match="initial_nodes"):
        CloudConfig(min_nodes=1, max_nodes=4, initial_nodes=5)


@pytest.fixture(scope="module")
def cifar10():
    if not TRACES.is_dir():
        pytest.skip(f"no profiles at {TRACES}")
    return load_profiles(TRACES, ["cifar10"])


def run(profiles, rule: str, per_gpu: bool = False) -> tuple:
    fleet = CloudFleet(CloudConfig(min_nodes=1, max_nodes=8, provision_delay_s=120.0), make_autoscaler(rule))
    result = simulate([WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)], profiles, make_policy("pollux"),
                      SimConfig(batch_per_gpu=per_gpu, max_replicas=32), "one-cifar10", fleet=fleet)
    return result, fleet


def test_one_job_grows_over_training_on_goodput_and_early_on_throughput(cifar10):
    good, good_fleet = run(cifar10, "goodput")
    thru, thru_fleet = run(cifar10, "throughput", per_gpu=True)
    for result, fleet in ((good, good_fleet), (thru, thru_fleet)):
        line = result.timeline
        assert result.jobs[0].completion is not None                   # the job finished
        assert all(0 <= r <= h <= 8 for r, h in zip(line["nodes_ready"], line["nodes_held"], strict=True))
        assert all(g <= 4 * r for g, r in zip(line["allocated_gpus"], line["nodes_ready"], strict=True))
        assert fleet.status == ["absent"] * 8                          # everything given back
        assert fleet.report.node_hours > 0
    ready = good.timeline["nodes_ready"]
    assert ready == sorted(ready), "one job's goodput cluster only grows"
    half = len(thru.timeline["nodes_ready"]) // 2
    assert max(thru.timeline["nodes_ready"][:half]) >= max(ready[:len(ready) // 2])
    again, again_fleet = run(cifar10, "goodput")
    assert again_fleet.report.node_seconds == good_fleet.report.node_seconds   # same seed, same run
    assert again.timeline == good.timeline


def test_an_empty_queue_gives_nodes_back_at_once(cifar10):
    """Between two jobs hours apart the cloud holds its minimum: nodes asked for before the queue
    emptied arrive and go, none is billed through the gap."""
    cloud = CloudConfig(min_nodes=1, max_nodes=8, provision_delay_s=120.0)
    fleet = CloudFleet(cloud, make_autoscaler("goodput"))
    jobs = [WorkloadJob("first", 0.0, "cifar10", 1, 128),
            WorkloadJob("second", 12 * 3600.0, "cifar10", 1, 128)]
    result = simulate(jobs, cifar10, make_policy("pollux"), SimConfig(max_replicas=32), "gap", fleet=fleet)
    first_done = result.jobs[0].completion
    assert first_done is not None and first_done < 12 * 3600.0
    gap = [held for t, held in zip(fleet.report.time, fleet.report.held, strict=True)
           if first_done + 60.0 < t < 12 * 3600.0]
    assert gap and set(gap) == {1}
    assert max(fleet.report.held) > 1                  # it had grown while the first job ran
