"""Tests of pollux.sim.report: summaries, finish-time fairness, JSON shape, table, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pollux.sim.engine import JobResult, SimConfig, SimResult
from pollux.sim.fairness import finish_time_fairness, isolated_jct, isolated_share, packed_placement
from pollux.sim.plots import write_plots
from pollux.sim.profiles import AppMeta, load_profile
from pollux.sim.report import summarize, to_json
from pollux.sim.table import format_table

# ------------------------------------------------------------------------------------------------
# Hand-made results


def _job(name: str, app: str, submit: float, jct: float | None, restarts: int = 0, gpu_hours: float = 1.0,
         fits: int = 0, rho: float | None = None, active: float = 1.0) -> JobResult:
    return JobResult(name=name, application=app, submit=submit,
                     completion=None if jct is None else submit + jct, jct=jct, restarts=restarts,
                     gpu_hours=gpu_hours, fits=fits, epochs=1, active_jobs_mean=active, rho=rho,
                     batch_sizes=[128])


def _result(policy: str = "pollux", workload: str = "workload-1", jobs: list[JobResult] | None = None,
            scale: float = 1.0) -> SimResult:
    if jobs is None:
        jobs = [
            _job("a", "cifar10", 0.0, 100.0 * scale, restarts=1, gpu_hours=2.0, fits=3, rho=0.5),
            _job("b", "cifar10", 50.0, 200.0 * scale, restarts=2, gpu_hours=4.0, fits=5, rho=1.5),
            _job("c", "bert", 100.0, 300.0 * scale, restarts=0, gpu_hours=6.0, fits=1, rho=2.5),
            _job("d", "ncf", 120.0, 1000.0 * scale, restarts=5, gpu_hours=0.0, fits=7, rho=3.0),
        ]
    n = 200
    t = np.arange(n) * 60.0
    timeline = {
        "time": t.tolist(),
        "allocated_gpus": np.minimum(64, np.arange(n) % 80).astype(float).tolist(),
        "active_jobs": [4.0] * n,
        "running_jobs": [3.0] * n,
        "efficiency": (0.5 + 0.4 * np.sin(t / 3000.0)).tolist(),
    }
    return SimResult(policy=policy, workload=workload, seed=0, config=SimConfig(), jobs=jobs,
                     timeline=timeline, wall_time_s=12.5, decide_time_s=2.0, rounds=n)


def test_summary_statistics_known_values():
    s = summarize(_result())
    jcts = [100.0, 200.0, 300.0, 1000.0]
    assert s["avg_jct"] == pytest.approx(400.0)
    assert s["median_jct"] == pytest.approx(250.0)
    # numpy linear percentile: position 0.99·3 = 2.97 between 300 and 1000.
    assert s["p99_jct"] == pytest.approx(300.0 + 0.97 * 700.0)
    assert s["p99_jct"] == pytest.approx(float(np.percentile(jcts, 99)))
    # Last completion 120 + 1000, first submission 0.
    assert s["makespan"] == pytest.approx(1120.0)
    assert s["restarts_per_job"] == pytest.approx(2.0)
    assert s["gpu_hours_per_job"] == pytest.approx(3.0)
    assert s["fits_per_job"] == pytest.approx(4.0)
    assert s["rounds"] == 200
    assert s["wall_time_s"] == pytest.approx(12.5)
    assert s["decide_time_s"] == pytest.approx(2.0)
    assert s["decide_time_per_round_s"] == pytest.approx(0.01)
    assert s["app_jct"] == {"bert": pytest.approx(300.0), "cifar10": pytest.approx(150.0),
                            "ncf": pytest.approx(1000.0)}
    rho = s["rho"]
    assert rho["count"] == 4
    assert rho["mean"] == pytest.approx(1.875)
    assert rho["median"] == pytest.approx(2.0)
    assert rho["max"] == pytest.approx(3.0)
    assert rho["share_gt_1"] == pytest.approx(0.75)
    assert rho["share_gt_2"] == pytest.approx(0.5)


def test_summary_with_unfinished_jobs_and_no_rho():
    jobs = [_job("a", "cifar10", 10.0, 100.0), _job("b", "bert", 0.0, None, restarts=4)]
    s = summarize(_result(jobs=jobs))
    assert s["completed"] == 1 and s["num_jobs"] == 2
    assert s["avg_jct"] == s["median_jct"] == s["p99_jct"] == pytest.approx(100.0)
    assert s["makespan"] == pytest.approx(110.0)          # first submission is the unfinished job's
    assert s["restarts_per_job"] == pytest.approx(2.0)
    assert s["rho"]["count"] == 0 and s["rho"]["share_gt_2"] is None


def test_json_shape_is_exact_and_serialisable():
    results = [_result("pollux"), _result("tiresias", scale=2.0)]
    results[1].jobs[0].jct = None                          # unfinished job -> null
    results[1].jobs[0].completion = None
    results[1].jobs[1].rho = math.nan                      # non-finite -> null
    data = to_json(results)
    assert list(data) == ["runs"]
    assert len(data["runs"]) == 2
    run_keys = ["policy", "workload", "avg_jct", "median_jct", "p99_jct", "makespan", "restarts_per_job",
                "wall_time_s", "jobs"]
    job_keys = ["name", "application", "submit", "jct", "restarts", "gpu_hours", "rho", "fits"]
    for run in data["runs"]:
        assert list(run)[: len(run_keys)] == run_keys
        for job in run["jobs"]:
            assert list(job)[: len(job_keys)] == job_keys
        assert len(run["timeline"]["time"]) <= 600
        assert set(run["timeline"]) >= {"time", "allocated_gpus", "efficiency"}
    run0, run1 = data["runs"]
    assert run0["policy"] == "pollux" and run0["workload"] == "workload-1"
    assert run0["avg_jct"] == pytest.approx(400.0)
    assert run0["jobs"][0] == {**run0["jobs"][0], "name": "a", "application": "cifar10", "submit": 0.0,
                               "jct": 100.0, "restarts": 1, "gpu_hours": 2.0, "rho": 0.5, "fits": 3}
    assert run1["jobs"][0]["jct"] is None
    assert run1["jobs"][1]["rho"] is None
    text = json.dumps(data, allow_nan=False)               # strictly valid JSON
    assert json.loads(text) == data


def test_table_lists_each_policy_and_blocks():
    results = [_result("pollux", "workload-1"), _result("tiresias", "workload-1", scale=2.0),
               _result("pollux", "workload-2", scale=1.5), _result("tiresias", "workload-2", scale=3.0)]
    text = format_table(results)
    for name in ("pollux", "tiresias", "workload-1", "workload-2"):
        assert name in text
    assert "Mean over workloads" in text
    assert "Mean JCT per application" in text
    assert "400 (0.11 h)" in text                          # pollux workload-1 average JCT
    # Mean over workloads of pollux's average JCT: (400 + 600) / 2.
    assert "500 (0.14 h)" in text
    for app in ("bert", "cifar10", "ncf"):
        assert app in text
    single = format_table([_result("pollux")])
    assert "pollux" in single and "Mean over workloads" not in single


def test_plots_are_valid_pngs(tmp_path: Path):
    results = [_result("pollux"), _result("tiresias", scale=2.0), _result("optimus", scale=3.0)]
    paths = write_plots(results, tmp_path / "plots")
    names = sorted(p.name for p in paths)
    assert names == ["jct_cdf.png", "rho_cdf.png", "timeline-workload-1.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 1024


def test_plots_skip_rho_when_unknown(tmp_path: Path):
    jobs = [_job("a", "cifar10", 0.0, 100.0), _job("b", "bert", 5.0, 300.0)]
    paths = write_plots([_result(jobs=jobs)], tmp_path)
    assert sorted(p.name for p in paths) == ["jct_cdf.png", "timeline-workload-1.png"]


# ------------------------------------------------------------------------------------------------
# Isolated JCT on a hand-made profile
#
# M0 = 10, max batch 40, local batch 5..40, 2 epochs ending at progress 100 and 300.
# Step times are constant in the local batch: 1 GPU ("1"): step 1.0, sync 0.5; 4 GPUs ("4"): step 0.5,
# sync 0.25. With sqr = 0 the gain is S (perfect scaling); with var = 0 it is 1.
#
# 1 GPU: M = M0 gives s = 0, T = 1, rate 1; any M > M0 forces s = 1, m = ceil(M/2), T = 1 + 0.5 = 1.5,
#   so with gain S the best is M = 40: rate (40/10)/1.5 = 8/3; with gain 1 the best is M0 at rate 1.
# 4 GPUs: M from max(10, 4·5) = 20 to 40, s = 0, m = M/4, T = 0.5: with gain S the best is M = 40 at rate
#   4/0.5 = 8; with gain 1 every M gives rate 2.


def _write_profile(root: Path, name: str, stats_by_epoch: list[tuple[float, float]]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n"
        "1,5,1.0,0.5\n1,40,1.0,0.5\n"
        "4,5,0.5,0.25\n4,40,0.5,0.25\n"
    )
    (d / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n"
        "6,24,5,0.5,0.25\n6,24,40,0.5,0.25\n"
    )
    for b in (10, 40):
        rows = [f"{p},{10 * (e + 1)},0.5,{sqr},{var}"
                for e, (p, (sqr, var)) in enumerate(zip((100.0, 300.0), stats_by_epoch, strict=True))]
        (d / f"validation-{b}.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n"
                                                + "\n".join(rows) + "\n")
    return d


def _meta(name: str) -> AppMeta:
    return AppMeta(name=name, init_batch_size=10, max_batch_size=40, min_local_bsz=5, max_local_bsz=40,
                   epochs=2, optimizer="sgd", metric_higher_is_better=True)


@pytest.fixture
def toy_profiles(tmp_path: Path):
    perfect = load_profile(_write_profile(tmp_path, "toyperfect", [(0.0, 1.0), (0.0, 1.0)]),
                           meta=_meta("toyperfect"))
    mixed = load_profile(_write_profile(tmp_path, "toymixed", [(0.0, 1.0), (1.0, 0.0)]),
                         meta=_meta("toymixed"))
    return perfect, mixed


def test_packed_placement():
    assert packed_placement(1) == [1]
    assert packed_placement(4) == [4]
    assert packed_placement(10) == [4, 4, 2]
    with pytest.raises(ValueError):
        packed_placement(0)


def test_isolated_jct_by_hand(toy_profiles):
    perfect, mixed = toy_profiles
    assert isolated_jct(perfect, 1) == pytest.approx(300.0 / (8.0 / 3.0))          # 112.5 s
    assert isolated_jct(perfect, 4) == pytest.approx(300.0 / 8.0)                   # 37.5 s
    # Epoch 0 (progress 100) at gain S, epoch 1 (progress 200) at gain 1.
    assert isolated_jct(mixed, 1) == pytest.approx(100.0 / (8.0 / 3.0) + 200.0 / 1.0)
    assert isolated_jct(mixed, 4) == pytest.approx(100.0 / 8.0 + 200.0 / 2.0)
    # Cached: a second call returns the identical value.
    assert isolated_jct(perfect, 4) == isolated_jct(perfect, 4)


def test_grad_stats_many_are_grad_stats_value_for_value(toy_profiles):
    # isolated_jct reads every candidate batch of an epoch at once: the same interpolation as one by
    # one, to the bit, inside, between and outside the measured batch sizes, epochs clamped alike.
    _, mixed = toy_profiles
    batches = np.array([1.0, 10.0, 12.5, 17.0, 39.0, 40.0, 1e6])
    for epoch in (-1, 0, 1, 5):
        sqr, var = mixed.grad_stats_many(epoch, batches)
        one_by_one = [mixed.grad_stats(epoch, float(b)) for b in batches]
        assert sqr.tolist() == [g.sqr for g in one_by_one]
        assert var.tolist() == [g.var for g in one_by_one]
    with pytest.raises(ValueError, match="finite"):
        mixed.grad_stats_many(0, np.array([10.0, np.nan]))


@pytest.mark.parametrize("app", ["cifar10", "imagenet"])
def test_grad_stats_many_interpolate_a_measured_profile_as_grad_stats_do(app):
    folder = Path(__file__).resolve().parents[2] / "shared/data/pollux-osdi21/traces" / app
    if not folder.is_dir():
        pytest.skip(f"{folder} not found (the shared data sets)")
    profile = load_profile(folder)
    batches = np.geomspace(profile.meta.init_batch_size / 2, profile.meta.max_batch_size * 2, 50)
    for epoch in range(0, profile.meta.epochs, max(profile.meta.epochs // 7, 1)):
        sqr, var = profile.grad_stats_many(epoch, batches)
        one_by_one = [profile.grad_stats(epoch, float(b)) for b in batches]
        assert sqr.tolist() == [g.sqr for g in one_by_one]
        assert var.tolist() == [g.var for g in one_by_one]


def test_isolated_jct_falls_back_to_a_feasible_share(toy_profiles):
    perfect, _ = toy_profiles
    # 5 GPUs ([4, 1]: 2 nodes, 5 replicas) lies outside the profile's interpolation hull, so the job
    # uses the largest smaller share that works: 4 GPUs on one node.
    assert isolated_jct(perfect, 5) == pytest.approx(37.5)
    # 9 GPUs: min_local·9 = 45 exceeds the max batch 40 — no batch fits; a smaller share is used.
    value = isolated_jct(perfect, 9)
    assert math.isfinite(value) and value <= isolated_jct(perfect, 1)


def test_finish_time_fairness(toy_profiles):
    perfect, _ = toy_profiles
    jobs = [
        # JCT_iso = isolated JCT + one 30 s start delay (a first start is not a restart).
        _job("j1", "toyperfect", 0.0, 135.0, active=16.0),     # 4 GPUs: iso 37.5 + 30 -> ρ 2
        _job("j2", "toyperfect", 0.0, 285.0, active=64.0),     # 1 GPU: iso 112.5 + 30 -> ρ 2
        _job("j3", "toyperfect", 0.0, 142.5, active=100.0),    # share max(1, 0) = 1 -> ρ 1
        _job("j4", "toyperfect", 0.0, None, active=2.0),       # unfinished: no ρ
    ]
    result = _result(jobs=jobs)
    out = finish_time_fairness(result, {"toyperfect": perfect}, 64)
    assert out is result
    assert [j.rho for j in jobs[:3]] == [pytest.approx(2.0), pytest.approx(2.0), pytest.approx(1.0)]
    assert jobs[3].rho is None
    with pytest.raises(ValueError, match="no profile"):
        finish_time_fairness(_result(jobs=[_job("x", "other", 0.0, 1.0)]), {"toyperfect": perfect}, 64)


def test_isolated_share():
    assert isolated_share(_job("a", "cifar10", 0, 1, active=3.0), 64) == 21
    assert isolated_share(_job("a", "cifar10", 0, 1, active=0.5), 64) == 64       # capped at G
    assert isolated_share(_job("a", "cifar10", 0, 1, active=200.0), 64) == 1
    assert isolated_share(_job("a", "ncf", 0, 1, active=1.0), 64) == 1            # ncf: one replica
