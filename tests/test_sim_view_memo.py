"""A simulated job's view is reused while the job has not changed (pollux.sim.job.SimJob.view)."""

from __future__ import annotations

import pytest

from pollux.policy.registry import make_policy
from pollux.sim.engine import SimConfig, simulate
from pollux.sim.job import SimJob
from pollux.sim.workload import WorkloadJob
from sim_memo_case import memo_case


def _queued_case() -> tuple[dict, list[WorkloadJob], SimConfig]:
    """Twelve jobs on one 4-GPU node: most of them queue for many rounds, a few run and move."""
    case = memo_case()
    jobs = [WorkloadJob(f"q{i}", 45.0 * i, "cifar10" if i % 3 else "ncf", 1 + (i % 2),
                        128 if i % 3 else 256) for i in range(12)]
    return case.profiles, jobs, SimConfig(num_nodes=1, gpus_per_node=4, bootstrap_s=60.0)


#: Pollux with a small search: the views it is given, not its search, are under test here.
OPTIONS = {"pollux": {"population": 16, "generations": 8}}


@pytest.mark.parametrize("policy", ["pollux", "sia", "tiresias", "optimus"])
def test_every_reused_view_is_the_view_built_afresh(monkeypatch, policy):
    profiles, jobs, config = _queued_case()
    reused = 0
    memoised = SimJob.view

    def checked(self, now, cluster):
        nonlocal reused
        before = self._view_memo
        got = memoised(self, now, cluster)
        fresh = self._build_view(now - self.spec.submit_time, cluster)
        assert got == fresh, f"{self.name} at t={now}"
        if before is not None and self._view_memo is before:
            reused += 1
        return got

    monkeypatch.setattr(SimJob, "view", checked)
    simulate(jobs, profiles, make_policy(policy, **OPTIONS.get(policy, {})), config)
    assert reused > 0            # the case does queue jobs: the memo was used


@pytest.mark.parametrize("policy", ["sia"])
def test_a_simulation_is_the_same_without_the_view_memo(monkeypatch, policy):
    profiles, jobs, config = _queued_case()
    with_memo = simulate(jobs, profiles, make_policy(policy, **OPTIONS.get(policy, {})), config)
    monkeypatch.setattr(SimJob, "view",
                        lambda self, now, cluster: self._build_view(now - self.spec.submit_time, cluster))
    without = simulate(jobs, profiles, make_policy(policy, **OPTIONS.get(policy, {})), config)
    assert [(r.name, r.completion, r.restarts, r.gpu_hours, r.batch_sizes) for r in with_memo.jobs] == \
        [(r.name, r.completion, r.restarts, r.gpu_hours, r.batch_sizes) for r in without.jobs]
    assert with_memo.rounds == without.rounds
