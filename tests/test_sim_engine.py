"""The simulator engine: hand-checked JCTs, determinism, and what a Pollux job shows the policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pollux.goodput import fit_throughput, t_iter
from pollux.policy.base import Cluster, fixed_shape
from pollux.policy.registry import ELASTIC, POLICY_NAMES, make_policy, policy_info
from pollux.sim.engine import ADAPTIVE, SimConfig, SimJob, fixed_batch_config, simulate
from pollux.sim.profiles import load_profile, load_profiles
from pollux.sim.workload import WorkloadJob, read_workload

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux-osdi21"


def toy_profile(root: Path, name: str = "toy"):
    """One GPU type, constant 1 s steps, no noise (sqr = 0 → gain = S): progress is 1 per second at
    batch M0 = 8, and the two epochs end at progress 60 and 120."""
    d = root / name
    d.mkdir(parents=True)
    (d / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,4,1.0,0.0\n1,16,1.0,0.0\n"
        "2,4,1.2,0.2\n2,16,1.2,0.2\n")
    (d / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,3.0,2.0\n")
    (d / "validation-8.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n60,60,0.5,0.0,1.0\n120,120,0.9,0.0,1.0\n")
    return load_profile(d)


def one_gpu() -> SimConfig:
    return SimConfig(num_nodes=1, gpus_per_node=1)


def test_fifo_hand_checked(tmp_path):
    prof = {"toy": toy_profile(tmp_path)}
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8), WorkloadJob("b", 10.0, "toy", 1, 8)]
    res = simulate(jobs, prof, make_policy("fifo"), one_gpu())
    jct = {j.name: j.jct for j in res.jobs}
    # a: starts at t=0, 30 s restart delay, then 120 s of work at 1 progress/s → done at 150.
    # b: waits for the round at t=180, 30 s delay + 120 s → done at 330; JCT = 330 − 10.
    assert jct == {"a": pytest.approx(150.0), "b": pytest.approx(320.0)}
    assert [j.restarts for j in res.jobs] == [0, 0]
    assert res.jobs[0].gpu_hours == pytest.approx(180 / 3600)   # held for 3 whole intervals


def test_tiresias_hand_checked_demotion_and_preemption(tmp_path):
    prof = {"toy": toy_profile(tmp_path)}
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8), WorkloadJob("b", 10.0, "toy", 1, 8)]
    res = simulate(jobs, prof, make_policy("tiresias", threshold_gpu_s=50.0), one_gpu())
    jct = {j.name: j.jct for j in res.jobs}
    # t=0: a starts (delay to 30, progress 30 by 60). t=60: a has 60 GPU·s > 50 → queue 2; b (queue 1)
    # preempts it: delay to 90, progress 30 by 120. t=120: b demoted behind a; a resumes: delay to 150,
    # progress 60 by 180, 120 by 240 → done at 240. t=240: b resumes: delay to 270, done at 360.
    assert jct == {"a": pytest.approx(240.0), "b": pytest.approx(350.0)}
    assert {j.name: j.restarts for j in res.jobs} == {"a": 1, "b": 1}


def test_fixed_batch_config_accumulates():
    assert fixed_batch_config(256, 2, 128, 64) == (256, 64, 1)
    assert fixed_batch_config(256, 1, 128, 1024) == (256, 128, 1)   # s ≥ 1 on one GPU above M0
    assert fixed_batch_config(128, 1, 128, 1024) == (128, 128, 0)
    assert fixed_batch_config(100, 3, 100, 1024) == (102, 34, 0)


def test_same_seed_same_result(tmp_path):
    prof = {"toy": toy_profile(tmp_path)}
    rng = np.random.default_rng(5)
    jobs = [WorkloadJob(f"j{i}", float(t), "toy", 1, 8) for i, t in enumerate(rng.uniform(0, 600, 6))]
    cfg = SimConfig(num_nodes=1, gpus_per_node=2, seed=3)
    a = simulate(jobs, prof, make_policy("pollux"), cfg)
    b = simulate(jobs, prof, make_policy("pollux"), cfg)
    assert [(j.name, j.jct, j.restarts) for j in a.jobs] == [(j.name, j.jct, j.restarts) for j in b.jobs]
    assert a.timeline == b.timeline


def test_infeasible_configuration_moves_an_elastic_job(tmp_path):
    """Pollux may try 3 GPUs, which the toy profile cannot price: the job must not stall forever."""
    prof = {"toy": toy_profile(tmp_path)}
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8)]
    res = simulate(jobs, prof, make_policy("pollux"), SimConfig(num_nodes=1, gpus_per_node=4))
    assert res.jobs[0].jct is not None and res.jobs[0].jct < 3600


def test_rigid_job_on_infeasible_configuration_is_an_error(tmp_path):
    prof = {"toy": toy_profile(tmp_path)}
    with pytest.raises(RuntimeError, match="no step time for placement"):
        simulate([WorkloadJob("a", 0.0, "toy", 3, 24)], prof, make_policy("fifo"),
                 SimConfig(num_nodes=1, gpus_per_node=4))


def test_bad_inputs_are_clear(tmp_path):
    prof = {"toy": toy_profile(tmp_path)}
    with pytest.raises(ValueError, match="no profile for application"):
        simulate([WorkloadJob("a", 0.0, "other", 1, 8)], prof, make_policy("fifo"), one_gpu())
    with pytest.raises(ValueError, match="interference"):
        SimConfig(interference=1.5)
    with pytest.raises(ValueError, match="interval"):
        SimConfig(interval=0)

    class Unregistered:
        name = "nobody"

        def decide(self, jobs, cluster, state, now, rng):
            return {}, {}

    with pytest.raises(ValueError, match="policy: unknown policy 'nobody'"):
        simulate([WorkloadJob("a", 0.0, "toy", 1, 8)], prof, Unregistered(), one_gpu())


class Recording:
    """A registered policy that records the views the simulator builds for it."""

    def __init__(self, name: str) -> None:
        self.inner = make_policy(name)
        self.name = name
        self.views: list = []

    def decide(self, jobs, cluster, state, now, rng):
        self.views.extend(jobs)
        return self.inner.decide(jobs, cluster, state, now, rng)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_views_follow_the_registry_and_the_one_fixed_rule(tmp_path, name):
    """The job kind comes from the registry (an oracle only for elastic jobs), ``fixed`` from
    pollux.policy.base.fixed_shape (the rule the service's job_view uses too), and the current
    allocation arrives once, in the views."""
    prof = {"toy": toy_profile(tmp_path)}
    specs = [WorkloadJob("a", 0.0, "toy", 1, 8), WorkloadJob("b", 10.0, "toy", 1, 16)]
    policy = Recording(name)
    res = simulate(specs, prof, policy, one_gpu())
    assert all(j.jct is not None for j in res.jobs)
    by_name = {s.name: s for s in specs}
    elastic = policy_info(name).job_kind == ELASTIC
    for view in policy.views:
        spec = by_name[view.id]
        assert view.fixed == fixed_shape(spec.num_replicas, spec.batch_size)
        assert (view.oracle is not None) == elastic
    assert any(v.allocation for v in policy.views)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared profiles not found at {SHARED}")
def test_pollux_sees_only_models_fitted_from_configurations_run():
    """The policy's view of a job is a fit of what the job ran (with priors), never the profile."""
    prof = load_profiles(SHARED / "traces", apps=["cifar10"])["cifar10"]
    cluster = Cluster.uniform(4, 4)
    job = SimJob(WorkloadJob("c", 0.0, "cifar10", 1, 128), prof, ADAPTIVE, SimConfig(), 4)
    assert job.view(0.0, cluster).model is None                 # nothing run, nothing reported
    job.apply(np.array([1, 0, 0, 0]), 30.0)
    job.advance(0.0, 60.0, 0.0)
    model = job.view(60.0, cluster).model
    assert model is not None
    ran = list(job.records)
    assert {(n, r) for n, r, _ in ran} == {(1, 1)}
    # The params are exactly a fit of the profile's times at the configurations the job ran.
    keys = np.array(ran, dtype=float)
    step_sync = np.array([prof.step_time([1], m) for _, _, m in ran])
    fit = fit_throughput(keys[:, 0], keys[:, 1], keys[:, 2], step_sync[:, 0],
                         step_sync[:, 0] - step_sync[:, 1])
    grid_n, grid_k, grid_m = np.array([1, 1, 2, 4]), np.array([1, 4, 8, 16]), np.array([32, 64, 128, 256])
    assert np.allclose(t_iter(model.throughput_params, grid_n, grid_k, grid_m, 1),
                       t_iter(fit.params, grid_n, grid_k, grid_m, 1), rtol=1e-3)
    # Seen only on one GPU, the model predicts perfectly linear scaling (the exploration prior),
    # while the true profile shows a much slower 4-node step.
    m = ran[0][2]
    predicted = float(t_iter(model.throughput_params, 4, 16, m, 0))
    true_step, _ = prof.step_time([4, 4, 4, 4], m)
    single = float(t_iter(model.throughput_params, 1, 1, m, 0))
    assert predicted == pytest.approx(single, rel=1e-3)
    assert true_step > 1.5 * predicted
    # After running on 2 nodes, the new configuration is in the records and the model changes.
    job.apply(np.array([2, 2, 0, 0]), 30.0)
    job.advance(60.0, 60.0, 0.0)
    assert {(n, r) for n, r, _ in job.records} == {(1, 1), (2, 4)}
    assert job.fits == len(job.records) == 3   # (1,1,M0), a new m at the first epoch end, (2,4,m)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared profiles not found at {SHARED}")
def test_small_slice_of_real_workload_runs_under_every_policy():
    profiles = load_profiles(SHARED / "traces", apps=["cifar10", "ncf", "deepspeech2", "bert"])
    jobs = [j for j in read_workload(SHARED / "workloads" / "workload-6.csv")
            if j.application in profiles][:12]
    for name in POLICY_NAMES:
        res = simulate(jobs, profiles, make_policy(name), SimConfig(seed=1), "slice")
        assert all(j.jct is not None and j.jct > 0 for j in res.jobs), name
        assert max(res.timeline["allocated_gpus"]) <= 64
