"""GPU types in the simulator (issue 13): per-type profiles, typed clusters, bootstrap, reports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pollux.policy.base import Cluster
from pollux.policy.clusterspec import parse_cluster
from pollux.policy.fifo import FifoPolicy
from pollux.policy.registry import REGISTRY, RIGID, make_policy
from pollux.sim import defaults
from pollux.sim.engine import SimConfig, SimJob, TypeContext, sia_slowdown, simulate
from pollux.sim.hetero_report import type_summary, typed_finish_time_fairness
from pollux.sim.profiles import load_profiles
from pollux.sim.typed_profiles import available_types, load_typed_profiles
from pollux.sim.workload import WorkloadJob, read_workload

SIA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sia-sosp23"

VALIDATION = "progress,iteration,metric,grad_sqr,grad_var\n60,60,0.5,0.0,1.0\n120,120,0.9,0.0,1.0\n"


def toy_typed(root: Path, name: str = "toy", fast: bool = True) -> Path:
    """A toy application: constant 1 s steps on the un-suffixed (aws) files, 0.5 s on ``fast``
    (its files with the columns in another order); two epochs end at progress 60 and 120 at M0 = 8,
    with gain = S (no noise): a 1-GPU FIFO job at batch 8 needs 120 steps."""
    d = root / name
    d.mkdir(parents=True)
    (d / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,4,1.0,0.0\n1,16,1.0,0.0\n"
        "11,4,1.5,0.5\n11,16,1.5,0.5\n2,4,1.2,0.2\n2,16,1.2,0.2\n")
    (d / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,3.0,2.0\n")
    if fast:
        (d / "placements-fast.csv").write_text(
            "local_bsz,step_time,sync_time,placement\n4,0.5,0.0,1\n32,0.5,0.0,1\n"
            "4,0.8,0.3,11\n32,0.8,0.3,11\n4,0.6,0.1,2\n32,0.6,0.1,2\n")
        (d / "scalability-fast.csv").write_text(
            "local_bsz,step_time,sync_time,num_nodes,num_replicas\n8,1.5,1.0,6,6\n")
    (d / "validation-8.csv").write_text(VALIDATION)
    return d


def toy_job(replicas: int = 1, name: str = "j0", app: str = "toy") -> WorkloadJob:
    return WorkloadJob(name=name, submit_time=0.0, application=app, num_replicas=replicas, batch_size=8)


# ---- loading --------------------------------------------------------------------------------


def test_typed_loading_reads_columns_by_header(tmp_path):
    toy_typed(tmp_path)
    typed = load_typed_profiles(tmp_path, ["aws", "fast", "gpu"])
    assert set(typed["toy"]) == {"aws", "fast", "gpu"}
    assert typed["toy"]["fast"].step_time((1,), 8) == (0.5, 0.0)
    assert typed["toy"]["aws"].step_time((1,), 8) == (1.0, 0.0)
    assert typed["toy"]["fast"].gpu_type == "fast"
    # The fast type measured larger local batches than the T4 files: its limit follows its data.
    assert typed["toy"]["fast"].meta.max_local_bsz == 32
    assert typed["toy"]["aws"].meta == typed["toy"]["gpu"].meta
    assert available_types(tmp_path / "toy") == ("aws", "fast")


def test_untyped_type_matches_untyped_loader(tmp_path):
    toy_typed(tmp_path)
    plain = load_profiles(tmp_path)["toy"]
    gpu = load_typed_profiles(tmp_path, ["gpu"])["toy"]["gpu"]
    assert plain.meta == gpu.meta
    for row, m in (((1,), 4), ((1, 1), 10), ((2,), 16), ((3, 3), 8)):
        assert plain.step_time(row, m) == gpu.step_time(row, m) or np.isnan(plain.step_time(row, m)[0])


def test_app_without_type_has_no_profile_there(tmp_path):
    toy_typed(tmp_path, "a")
    toy_typed(tmp_path, "b", fast=False)
    typed = load_typed_profiles(tmp_path, ["fast", "aws"])
    assert set(typed["a"]) == {"fast", "aws"}
    assert set(typed["b"]) == {"aws"}


def test_unknown_type_is_an_error_naming_the_file(tmp_path):
    toy_typed(tmp_path)
    with pytest.raises(ValueError, match=r"GPU type 'nope'.*placements-nope\.csv"):
        load_typed_profiles(tmp_path, ["aws", "nope"])


def test_missing_column_names_file_and_field(tmp_path):
    d = toy_typed(tmp_path)
    (d / "placements-bad.csv").write_text("placement,local_bsz,step_time\n1,4,1.0\n")
    (d / "scalability-bad.csv").write_text((d / "scalability.csv").read_text())
    with pytest.raises(ValueError, match=r"placements-bad\.csv, line 1: missing column\(s\) sync_time"):
        load_typed_profiles(tmp_path, ["bad"])


@pytest.mark.skipif(not SIA.is_dir(), reason="sia-sosp23 data not present")
def test_real_sia_profiles():
    typed = load_typed_profiles(SIA / "traces", ["aws", "rtx", "dgx-ext"])
    assert set(typed["gpt_pmp"]) == {"rtx", "dgx-ext"}          # profiled on rtx and dgx-ext only
    assert set(typed["cifar10"]) == {"aws", "rtx", "dgx-ext"}
    # An A100 runs a 1-GPU imagenet step faster than a T4.
    aws = typed["imagenet"]["aws"].step_time((1,), 40)[0]
    a100 = typed["imagenet"]["dgx-ext"].step_time((1,), 40)[0]
    assert a100 < aws
    assert typed["imagenet"]["dgx-ext"].meta.max_local_bsz > typed["imagenet"]["aws"].meta.max_local_bsz


# ---- engine ---------------------------------------------------------------------------------


def _run(tmp_path, cluster: str | Cluster, policy="fifo", jobs=None, **cfg):
    root = tmp_path / "profiles"
    if not root.exists():
        toy_typed(root)
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    typed = load_typed_profiles(root, cl.type_names)
    pol = make_policy(policy) if isinstance(policy, str) else policy
    return simulate(jobs or [toy_job()], {}, pol, SimConfig(cluster=cl, **cfg), typed_profiles=typed)


def test_slow_type_runs_slower_than_fast_type(tmp_path):
    slow = _run(tmp_path, "aws:1x1").jobs[0]
    fast = _run(tmp_path, "fast:1x1").jobs[0]
    assert slow.jct == pytest.approx(30 + 120)           # restart delay + 120 steps of 1 s
    assert fast.jct == pytest.approx(30 + 60)            # 120 steps of 0.5 s
    assert slow.type_gpu_hours == {"aws": pytest.approx(slow.gpu_hours)}


def test_speed_factor_multiplies_step_times(tmp_path):
    job = _run(tmp_path, "aws:1x1", slowdown=(("toy", 1.5),)).jobs[0]
    assert job.jct == pytest.approx(30 + 180)
    assert dict(sia_slowdown(["cifar10", "ncf", "gpt_pmp", "bert", "new"])) == {
        "cifar10": 1.8, "ncf": 1.5, "gpt_pmp": 1.0, "bert": 1.2, "new": 1.2}


def test_mixed_type_job_runs_at_slowest_type(tmp_path):
    toy_typed(tmp_path)
    cl = parse_cluster("aws:1x2,fast:1x2")
    typed = load_typed_profiles(tmp_path, cl.type_names)
    ctx = TypeContext(typed["toy"], cl.type_names, cl.type_index())
    job = SimJob(toy_job(2), typed["toy"]["aws"], RIGID, SimConfig(cluster=cl), cl.num_nodes, ctx)
    job.apply(np.array([1, 1]), 30.0)
    step, sync, _ = job.step_time()
    assert (step, sync) == (1.5, 0.5)                    # the aws "11" row, not fast's 0.8 s
    job.apply(np.array([0, 2]), 30.0)
    assert job.step_time()[:2] == (0.6, 0.1)             # all on fast: fast's "2" row
    # In a whole run, the 2-GPU job spans both types (FIFO sees one pool) at the aws speed.
    res = _run(tmp_path / "run", "aws:1x1,fast:1x1", jobs=[toy_job(2)])
    assert res.jobs[0].jct == pytest.approx(30 + 120 * 1.5)
    assert set(res.jobs[0].type_gpu_hours) == {"aws", "fast"}


def test_homogeneous_results_bit_identical():
    """The default cluster, the same cluster given explicitly and a one-type 'aws' cluster (typed
    profiles from the same un-suffixed files) give exactly the same results."""
    root = defaults.profiles_dir()
    profiles = load_profiles(root)
    jobs = read_workload(defaults.workload_file(), applications=profiles)[:6]
    typed = load_typed_profiles(root, ["aws"])
    for name in ("tiresias", "pollux"):
        base = simulate(jobs, profiles, make_policy(name), SimConfig(num_nodes=4))
        same = simulate(jobs, profiles, make_policy(name), SimConfig(cluster=Cluster.uniform(4, 4)))
        aws = simulate(jobs, profiles, make_policy(name),
                       SimConfig(cluster=Cluster.uniform(4, 4, gpu_type="aws")), typed_profiles=typed)
        key = [(j.jct, j.restarts, j.gpu_hours, j.fits, j.batch_sizes) for j in base.jobs]
        assert key == [(j.jct, j.restarts, j.gpu_hours, j.fits, j.batch_sizes) for j in same.jobs]
        assert key == [(j.jct, j.restarts, j.gpu_hours, j.fits, j.batch_sizes) for j in aws.jobs]
        assert base.timeline == same.timeline
        assert "gpus:aws" in aws.timeline and "gpus:aws" not in base.timeline


class _Recording(FifoPolicy):
    """FIFO under another registry name, keeping the views it was shown."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.seen: list = []

    def decide(self, jobs, cluster, state, now, rng):
        self.seen.extend(jobs)
        return super().decide(jobs, cluster, state, now, rng)


def _register(monkeypatch, name: str, aware: bool) -> _Recording:
    pol = _Recording(name)
    monkeypatch.setitem(REGISTRY, name, replace(REGISTRY["fifo"], name=name, type_aware=aware,
                                               factory=lambda **_: pol))
    return pol


def test_type_aware_views_and_bootstrap(tmp_path, monkeypatch):
    aware = _register(monkeypatch, "fifo-aware", True)
    res = _run(tmp_path, "aws:1x1,fast:1x1", policy=aware, bootstrap_s=90.0)
    job = res.jobs[0]
    assert job.bootstrap_gpu_hours == pytest.approx(2 * 90 / 3600)
    held = sum(v for v in job.type_gpu_hours.values()) - job.bootstrap_gpu_hours
    assert job.gpu_hours == pytest.approx(held + 2 * 90 / 3600)
    view = aware.seen[0]
    assert set(view.type_models) == {"aws", "fast"}        # bootstrapped on both types
    assert view.max_replicas_seen == 1                     # the profile ran on one GPU
    assert view.type_limits["fast"].max_local_bsz == 32
    assert view.type_limits["aws"].max_local_bsz == 16
    # The 1-GPU bootstrap already tells the fast type apart.
    fast_rate = float(view.type_models["fast"].throughput(1, 1, 8))
    assert fast_rate > 1.5 * float(view.type_models["aws"].throughput(1, 1, 8))

    plain = _register(monkeypatch, "fifo-plain", False)
    res2 = _run(tmp_path, "aws:1x1,fast:1x1", policy=plain, bootstrap_s=90.0)
    assert plain.seen[0].type_models is None and plain.seen[0].type_limits is None
    assert res2.jobs[0].bootstrap_gpu_hours == 0.0


def test_type_aware_job_lacking_a_type(tmp_path, monkeypatch):
    toy_typed(tmp_path / "profiles", "toy")
    toy_typed(tmp_path / "profiles", "plain", fast=False)
    aware = _register(monkeypatch, "fifo-aware", True)
    # FIFO is not really type-aware: it puts b on the fast GPU, where b has no profile (an error for
    # a rigid job); what matters here is the views of the first round.
    with pytest.raises(RuntimeError, match="no step time"):
        _run(tmp_path, "aws:1x1,fast:1x1", policy=aware,
             jobs=[toy_job(1, "a", "toy"), toy_job(1, "b", "plain")])
    models = {v.id: set(v.type_models) for v in aware.seen}
    assert models == {"a": {"aws", "fast"}, "b": {"aws"}}


def test_untyped_cluster_gives_no_type_models(tmp_path, monkeypatch):
    aware = _register(monkeypatch, "fifo-aware", True)
    toy_typed(tmp_path)
    profiles = load_profiles(tmp_path)
    simulate([toy_job()], profiles, aware, SimConfig(num_nodes=1, gpus_per_node=1, bootstrap_s=90.0))
    assert aware.seen[0].type_models is None


class _RecordingSia:
    """The real ``sia`` policy, recording the views and allocations of every round."""

    name = "sia"

    def __init__(self) -> None:
        self.inner = make_policy("sia")
        self.seen: list = []
        self.allocs: list = []

    def decide(self, jobs, cluster, state, now, rng):
        self.seen.append(list(jobs))
        alloc, state = self.inner.decide(jobs, cluster, state, now, rng)
        self.allocs.append(alloc)
        return alloc, state


def test_untyped_cluster_bootstraps_type_aware_adaptive_jobs(tmp_path):
    """On an untyped cluster (the one-type case) sia's jobs are bootstrapped as on a typed one: a
    model before they ever ran, one GPU counted as seen, the profile charged to their GPU-hours;
    so the first allocation may already exceed one GPU (a first start, not a restart). Pollux, which
    is not type-aware, is unchanged: no model and nothing seen before the first run."""
    toy_typed(tmp_path)
    profiles = load_profiles(tmp_path)
    cfg = SimConfig(num_nodes=1, gpus_per_node=4, bootstrap_s=90.0)
    sia = _RecordingSia()
    res = simulate([toy_job()], profiles, sia, cfg)
    first = sia.seen[0][0]
    assert first.model is not None and first.max_replicas_seen == 1 and first.type_models is None
    assert sum(sia.allocs[0]["j0"].values()) > 1
    job = res.jobs[0]
    assert job.restarts == 0
    assert job.bootstrap_gpu_hours == pytest.approx(90 / 3600)
    assert job.gpu_hours > job.bootstrap_gpu_hours
    # A type-unaware adaptive policy sees no model and nothing seen before the first run.
    seen: list = []
    pollux = make_policy("pollux")
    orig = pollux.decide

    def record(jobs, cluster, state, now, rng):
        seen.append(list(jobs))
        return orig(jobs, cluster, state, now, rng)

    pollux.decide = record
    plain = simulate([toy_job()], profiles, pollux, cfg)
    assert seen[0][0].model is None and seen[0][0].max_replicas_seen == 0
    assert plain.jobs[0].bootstrap_gpu_hours == 0.0


def test_type_report(tmp_path):
    res = _run(tmp_path, "aws:1x1,fast:1x1", jobs=[toy_job(1, "a"), toy_job(1, "b")])
    summary = type_summary(res)
    assert set(summary) == {"aws", "fast"}
    assert summary["aws"]["gpu_hours"] > 0 and summary["fast"]["gpu_hours"] > 0
    assert 0 < summary["fast"]["utilisation"] <= 1
    typed = load_typed_profiles(tmp_path / "profiles", ["aws", "fast"])
    typed_finish_time_fairness(res, typed)
    # Isolated on its best type (fast): 60 s + one start delay.
    fast_job = next(j for j in res.jobs if j.type_gpu_hours.get("fast"))
    assert fast_job.rho == pytest.approx(fast_job.jct / 90.0)


# ---- the command line -----------------------------------------------------------------------


def test_simulate_cluster_end_to_end(tmp_path, capsys):
    from pollux.cli import main

    root = tmp_path / "profiles"
    toy_typed(root)
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,toy,1,8\nb,0,toy,1,8\n")
    out = tmp_path / "o.json"
    code = main(["simulate", "--profiles", str(root), "--workload", str(wl), "--cluster", "aws:1x1,fast:1x1",
                 "--policy", "fifo", "--quiet", "--json", str(out), "--plots", str(tmp_path / "plots")])
    text = capsys.readouterr().out
    assert code == 0 and "Per GPU type" in text and "fast" in text
    import json

    run = json.loads(out.read_text())["runs"][0]
    assert set(run["types"]) == {"aws", "fast"}
    assert sorted(j["jct"] for j in run["jobs"]) == [pytest.approx(90.0), pytest.approx(150.0)]
    assert (tmp_path / "plots" / "gpus-by-type-w-fifo.png").is_file()


def test_simulate_bad_cluster_is_a_usage_error(tmp_path, capsys):
    from pollux.cli import main

    assert main(["simulate", "--quiet", "--cluster", "aws:0x4"]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_config_checks_and_timeline(tmp_path):
    with pytest.raises(ValueError, match="slowdown: factor of 'toy'"):
        SimConfig(slowdown=(("toy", 0.0),))
    with pytest.raises(ValueError, match="bootstrap_s"):
        SimConfig(bootstrap_s=-1.0)
    cfg = SimConfig(cluster=parse_cluster("aws:2x4,fast:1x8"), node_speed=(0.5,))
    assert cfg.node_count == 3 and cfg.speeds().tolist() == [0.5, 1.0, 1.0]
    res = _run(tmp_path, "aws:1x1,fast:1x1", jobs=[toy_job(1, "a"), toy_job(1, "b")])
    assert res.timeline["gpus:aws"][0] == 1 and res.timeline["gpus:fast"][0] == 1
    assert len(res.decide_times) == res.rounds
