"""``benchmarks/autoscale.py`` (issue 36: goodput against throughput autoscaling) runs end to end at toy
sizes and its report holds together.

The figures need the full run (minutes: ``docs/autoscaling.md``); this runs both sections on a cloud
of at most 2 nodes, with a CIFAR-10 job instead of ImageNet and the first job of workload-6, and
checks what a full run relies on: the derived figures are those of the arms they are derived from,
each target's flag and the exit status agree with the figures, the Pareto flags are the front of the
reported points, fixed clusters are held and billed for the whole run, an autoscaled cloud starts
empty, Or et al.'s jobs really run their initial batch on every GPU, and the plots are written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_scripts import load_script
from pollux.sim.profiles import load_profile
from pollux.sim.scaling_bound import bound_at, epoch_rates, epoch_work

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "autoscale.py"
DATA = ROOT.parent / "shared" / "data" / "pollux-osdi21"
MAX_NODES = 2
FIXED = (1, 2)
APP, M0 = "cifar10", 128          # cifar10's initial batch (src/pollux/sim/applications.json)

needs_data = pytest.mark.skipif(not (DATA / "traces").is_dir(), reason=f"shared data not found at {DATA}")


@pytest.fixture(scope="module")
def script():
    """The benchmark as a module (it is a script, not in a package), for its pure functions."""
    return load_script(SCRIPT, "autoscale_bench")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    plots = tmp_path_factory.mktemp("plots")
    cmd = [sys.executable, str(SCRIPT), "--json", "--application", APP, "--max-nodes", str(MAX_NODES),
           "--workload-jobs", "1", "--fixed", ",".join(map(str, FIXED)), "--plots", str(plots)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    # 1 means a target was missed, which toy sizes may: anything else is a failure
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return proc, json.loads(proc.stdout), plots


def _front(points: dict[str, tuple[float, float]]) -> set[str]:
    """The arms no other arm dominates, written out independently of the script's ``pareto``."""
    out = set()
    for a, (ca, ja) in points.items():
        others = [p for b, p in points.items() if b != a]
        if not any(cb <= ca and jb <= ja and (cb, jb) != (ca, ja) for cb, jb in others):
            out.add(a)
    return out


@needs_data
def test_exit_status_and_flags_follow_the_figures(toy):
    proc, rep, _ = toy
    one, wl = rep["one_job"], rep["workload"]
    assert one["ok_node_hours_reduction"] == (one["node_hours_reduction"] >= 0.25)
    assert one["ok_completion_ratio"] == (one["completion_ratio"] <= 1.06)
    ref = wl["reference_arm"]
    assert ref == f"fixed{max(FIXED)}"
    assert wl["ok_cheaper"] == (wl[f"goodput_cheaper_than_{ref}"] >= 0.20)
    assert wl["ok_jct"] == (wl[f"goodput_jct_over_{ref}"] <= 1.15)
    assert wl["ok_pareto"] == wl["goodput_on_pareto_front"]
    for section in (one, wl):
        assert section["ok"] == all(v for k, v in section.items() if k.startswith("ok_"))
    assert rep["ok"] == (one["ok"] and wl["ok"])
    assert proc.returncode == (0 if rep["ok"] else 1)
    assert "one_job: arm goodput" in proc.stderr and "workload: arm 1/" in proc.stderr   # progress


@needs_data
def test_no_arm_beats_the_clairvoyant_bound(toy):
    """The bound the section reports, and that it holds for the simulator's own runs: neither arm
    finished by its completion time on fewer node-hours than the bound allows there."""
    _, rep, _ = toy
    one = rep["one_job"]
    c, t = one["clairvoyant"], one["arms"]["throughput"]
    assert c["completion_limit_h"] == pytest.approx(1.06 * t["completion_h"])
    assert c["max_node_hours_reduction"] == pytest.approx(1 - c["node_hours_lower_bound"] / t["node_hours"])
    assert c["target_reachable"] == (c["max_node_hours_reduction"] >= 0.25)
    best = c["cheapest_schedule"]
    assert best is not None
    assert best["completion_h"] <= c["completion_limit_h"]
    assert best["node_hours"] >= c["node_hours_lower_bound"] - 1e-9
    times = [h for h, _ in best["nodes_over_time"]]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] < best["completion_h"]
    assert [n for _, n in best["nodes_over_time"]] == [n for _, n in best["nodes_from_epoch"]]
    profile = load_profile(DATA / "traces" / APP)
    rates, work = epoch_rates(profile, MAX_NODES, 4), epoch_work(profile)
    for arm in one["arms"].values():
        bound = bound_at(rates, work, arm["completion_h"] * 3600.0, start_nodes=1, provision_s=120.0)
        assert bound.node_seconds_bound / 3600.0 <= arm["node_hours"] + 1e-9


@needs_data
def test_one_job_figures_are_those_of_its_arms(toy):
    _, rep, _ = toy
    one = rep["one_job"]
    g, t = one["arms"]["goodput"], one["arms"]["throughput"]
    assert one["node_hours_reduction"] == pytest.approx(1 - g["node_hours"] / t["node_hours"])
    assert one["completion_ratio"] == pytest.approx(g["completion_h"] / t["completion_h"])
    for arm in (g, t):
        assert arm["cost"] == pytest.approx(arm["node_hours"])        # 1 per node-hour
        held = arm["nodes_held"]
        assert arm["nodes_ready"][0] == [0.0, 1]                     # starts on one node
        assert all(1 <= n <= MAX_NODES for _, n in held) and max(n for _, n in held) == arm["peak_nodes"]
        times = [h for h, _ in held]
        assert times == sorted(times) and times[-1] < arm["completion_h"]
        # node-hours: at least one node throughout, at most the peak throughout
        done = arm["completion_h"]
        assert done - 1e-9 <= arm["node_hours"] <= arm["peak_nodes"] * done + 1e-9
        assert arm["batch"][0] == [0.0, M0]
    assert (g["autoscaler"], g["batch_per_gpu"]) == ("goodput", False)
    assert (t["autoscaler"], t["batch_per_gpu"]) == ("throughput", True)
    # Or et al.'s jobs: the initial batch on every GPU, so always a multiple of it and within the cloud
    assert all(b % M0 == 0 and b <= M0 * 4 * MAX_NODES for _, b in t["batch"])
    assert len({b for _, b in t["batch"]}) > 1                       # it grew with the GPUs


@needs_data
def test_workload_pareto_flags_agree_with_the_points(toy):
    _, rep, _ = toy
    wl = rep["workload"]
    arms = wl["arms"]
    assert set(arms) == {"goodput", "throughput", *(f"fixed{n}" for n in FIXED)}
    points = {a: (f["node_hours"], f["avg_jct_h"]) for a, f in arms.items()}
    front = _front(points)
    assert set(wl["pareto_front"]) == front
    for a, f in arms.items():
        assert f["on_pareto_front"] == (a in front)
        ca, ja = points[a]
        for b in f["dominated_by"]:
            assert points[b][0] <= ca and points[b][1] <= ja and points[b] != points[a]
    assert wl["goodput_on_pareto_front"] == ("goodput" in front)
    ref = wl["reference_arm"]
    assert wl[f"goodput_cheaper_than_{ref}"] == pytest.approx(
        1 - arms["goodput"]["node_hours"] / arms[ref]["node_hours"])
    assert wl[f"goodput_jct_over_{ref}"] == pytest.approx(
        arms["goodput"]["avg_jct_h"] / arms[ref]["avg_jct_h"])
    # the sensitivity arm is reported apart, labelled, and is on Or et al.'s jobs
    (name, sens), = wl["sensitivity"].items()
    assert name not in arms and name not in wl["pareto_front"] and "sensitivity" in sens["label"]
    assert (sens["autoscaler"], sens["batch_per_gpu"]) == ("throughput", True)


@needs_data
def test_fixed_clusters_are_billed_throughout_and_autoscaled_ones_start_empty(toy):
    _, rep, _ = toy
    arms = rep["workload"]["arms"]
    for n in FIXED:
        f = arms[f"fixed{n}"]
        assert f["nodes_held"] == [[0.0, n]]
        assert f["node_hours"] == pytest.approx(n * f["last_completion_h"])
    for name in ("goodput", "throughput"):
        f = arms[name]
        assert f["cloud"]["min_nodes"] == 0 and f["nodes_held"][0] == [0.0, 0]
        assert f["completed"] == f["jobs"] == 1
        assert 0 < f["node_hours"] <= MAX_NODES * f["last_completion_h"] + 1e-9


@needs_data
def test_plots_are_written(toy):
    _, rep, plots = toy
    for section, name in (("one_job", "one_job.png"), ("workload", "workload.png")):
        path = Path(rep[section]["plot"])
        assert path == plots / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("bad", "named"), [
    (["--workload-jobs", "0"], "--workload-jobs"), (["--fixed", "4,x"], "--fixed"),
    (["--fixed", "0,4"], "--fixed"), (["--max-nodes", "0"], "--max-nodes"),
    (["--application", "no-such-app"], "--application"), (["--only", "nothing"], "--only"),
    (["--data", "/nonexistent"], "--data"), (["--workload", "/nonexistent.csv"], "--workload"),
])
@needs_data
def test_bad_input_exits_2_naming_the_option(script, capsys, bad, named):
    with pytest.raises(SystemExit) as exc:
        script.main(["--json", *bad])
    err = capsys.readouterr()
    assert exc.value.code == 2 and named in err.err and err.out == ""


def test_pareto_ties_and_strict_domination(script):
    pareto = script.pareto
    got = pareto({"a": (1.0, 2.0), "b": (1.0, 2.0), "c": (1.0, 3.0), "d": (2.0, 1.0), "e": (2.0, 2.0)})
    assert got["a"] == [] and got["b"] == []                 # equal points do not dominate each other
    assert sorted(got["c"]) == ["a", "b"]                    # as costly, slower
    assert got["d"] == []                                    # costlier but faster
    assert sorted(got["e"]) == ["a", "b", "d"]


def test_change_points_keep_the_first_and_every_change(script):
    change_points = script.change_points
    assert change_points([0.0, 60.0, 120.0, 180.0], [1, 1, 2, 1]) == [[0.0, 1], [0.0333, 2], [0.05, 1]]
    assert change_points([], []) == []


SIA = ROOT.parent / "shared" / "data" / "sia-sosp23"
TYPED_JOBS = 4


@pytest.mark.skipif(not (SIA / "workloads" / "philly").is_dir() or not (DATA / "traces").is_dir(),
                    reason=f"shared data not found at {SIA} or {DATA}")
def test_the_typed_section_bills_per_type_and_is_not_run_by_default(toy):
    """``--only typed`` at toy size: cost is the sum of the types' node-hours at their prices, the fixed
    arm holds every node of every pool throughout, the goodput arm starts empty; a run without
    ``--typed`` or ``--only typed`` has no ``typed`` key."""
    _, default_report, _ = toy
    assert "typed" not in default_report
    cmd = [sys.executable, str(SCRIPT), "--json", "--only", "typed", "--typed-jobs", str(TYPED_JOBS),
           "--typed-prices", "aws=4,dgx-ext=30"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    typed = json.loads(proc.stdout)["typed"]
    assert typed["prices"] == {"aws": 4.0, "dgx-ext": 30.0} and typed["policy"] == "sia"
    arms = typed["arms"]
    for f in arms.values():
        assert f["completed"] == f["jobs"] == TYPED_JOBS
        assert f["cost"] == pytest.approx(sum(f["node_hours_by_type"][t] * typed["prices"][t]
                                              for t in typed["prices"]))
        assert f["cost_by_type"] == pytest.approx({t: f["node_hours_by_type"][t] * p
                                                   for t, p in typed["prices"].items()})
        assert f["node_hours"] == pytest.approx(sum(f["node_hours_by_type"].values()))
    fixed, good = arms["fixed"], arms["goodput"]
    assert fixed["nodes_held_by_type"] == {"aws": [[0.0, 6]], "dgx-ext": [[0.0, 2]]}
    assert all(series[0] == [0.0, 0] for series in good["nodes_held_by_type"].values())
    assert typed["cost_saving"] == pytest.approx(1 - good["cost"] / fixed["cost"])
    assert typed["jct_ratio"] == pytest.approx(good["avg_jct_h"] / fixed["avg_jct_h"])


@needs_data
def test_bad_typed_prices_exit_2(script, capsys):
    for bad in ("aws=-1", "tpu=3", "aws"):
        with pytest.raises(SystemExit) as exc:
            script.main(["--json", "--only", "typed", "--typed-prices", bad])
        assert exc.value.code == 2 and "--typed-prices" in capsys.readouterr().err
