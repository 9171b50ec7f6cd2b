"""``benchmarks/scale.py`` (issue 38, step 3: how the simulator and the policies scale) runs end to
end in its ``--quick`` form and its JSON holds what the full run's figures are read from.

What the issue's acceptance reads off the full run: ``growth_exponent`` per policy (fitted over the
jobs axis) and ``round_s`` per policy and size; a capped run must say so, and an exponent fitted over
capped runs too. The quick run checks the structure and that the figures are sane (finite
exponents, positive times, the sizes asked for), not their values.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench_scripts import load_script, run_quick_json

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scale.py"
DATA = ROOT.parent / "shared" / "data"

HAVE_DATA = ((DATA / "pollux-osdi21" / "traces" / "philly.csv").is_file()
             and (DATA / "sia-sosp23" / "traces").is_dir())
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"shared data not found under {DATA}")


@pytest.fixture(scope="module")
def script():
    """The benchmark as a module (it is a script, not in a package), for its constants and parser."""
    return load_script(SCRIPT, "scale_bench")


@pytest.fixture(scope="module")
def quick():
    return run_quick_json(SCRIPT, 300)


@needs_data
def test_round_times_for_every_policy_and_size(quick, script):
    rep, err = quick
    sizes = {f"{g}x{j}" for g in script.QUICK.round_gpus for j in script.QUICK.round_jobs}
    assert set(rep["round_s"]) == set(script.POLICIES)
    for policy, by_size in rep["round_s"].items():
        assert set(by_size) == sizes
        for size, t in by_size.items():
            assert f"{t['gpus']}x{t['jobs']}" == size and t["policy"] == policy
            assert t["first_s"] > 0 and t["first_cpu_s"] > 0
            assert len(t["warm_s"]) == script.QUICK.warm_rounds and all(w > 0 for w in t["warm_s"])
            assert t["warm_median_s"] > 0
            assert t["tracemalloc_peak_mib"] > 0 and t["maxrss_mib"] > 0
            # a round hands out GPUs, never more than the cluster has
            assert 0 < t["gpus_allocated_after_first"] <= t["gpus"]
            assert t["running_after_first"] <= t["jobs"]
        if policy == "sia":
            # Sia's jobs arrive all at once: the first round is the cold start the issue measured
            assert all(t["running_before_first"] == 0 for t in by_size.values())
            assert all(t["cluster"].startswith("aws:") for t in by_size.values())
        else:
            assert all(t["cluster"].endswith("x4 (untyped)") for t in by_size.values())
    assert rep["round_maxrss_mib"] > 0
    assert "scale: round sia 512x100" in err


@needs_data
def test_growth_exponents_are_fitted_and_labelled_capped(quick, script):
    rep, _ = quick
    q = script.QUICK
    assert rep["cap_hours"] == q.cap_hours
    for key, axis, values in (("growth_exponent", "jobs", q.jobs), ("gpu_growth_exponent", "gpus", q.gpus)):
        assert set(rep[key]) == set(script.POLICIES)
        for policy, g in rep[key].items():
            assert g["policy"] == policy and g["axis"] == axis
            assert [p[axis] for p in g["points"]] == list(values)
            assert math.isfinite(g["exponent"]) and math.isfinite(g["cpu_exponent"])
            assert all(p["wall_s"] > 0 and p["cpu_s"] > 0 and p["rounds"] > 0 for p in g["points"])
            # every quick run is capped, and the fit says so
            assert g["capped"] is True and g["cap_hours"] == q.cap_hours and "capped" in g["note"]


@needs_data
def test_every_run_says_whether_and_where_it_was_capped(quick, script):
    rep, _ = quick
    q = script.QUICK
    expected = {(p, j, q.jobs_gpus) for p in script.POLICIES for j in q.jobs}
    expected |= {(p, q.gpus_jobs, g) for p in script.POLICIES for g in q.gpus}
    assert {(r["policy"], r["workload_jobs"], r["gpus"]) for r in rep["runs"]} == expected
    assert len(rep["runs"]) == len(expected)            # a run shared by both axes ran once
    for r in rep["runs"]:
        assert r["capped"] is True and r["cap_hours"] == q.cap_hours and r["skipped"] is None
        assert 0 < r["jobs_simulated"] < r["workload_jobs"]
        assert r["jobs_simulated"] + r["jobs_left_out"] == r["workload_jobs"]
        assert r["simulated_hours"] <= q.cap_hours + 2 * 60 / 3600
        assert r["stopped_at_cap"] + r["completed"] <= r["jobs_simulated"]
        assert r["wall_s"] >= r["decide_s"] > 0 and r["cpu_s"] > 0
    assert rep["machine"]["omp_num_threads"] == "1"


def test_the_exponent_is_the_log_log_slope(script):
    xs = [160, 480, 960, 2000]
    assert script.fit_exponent(xs, [3.0 * x**1.2 for x in xs]) == pytest.approx(1.2)
    assert script.fit_exponent([160], [1.0]) is None


def test_bad_options_exit_2_naming_the_option(script, capsys):
    for bad, named in ((["--jobs", "0"], "--jobs"), (["--round-gpus", "100"], "--round-gpus"),
                       (["--gpus", "128"], "--gpus"), (["--cap-hours", "0"], "--cap-hours"),
                       (["--parts", "nope"], "--parts"), (["--policies", "gavel"], "--policies")):
        with pytest.raises(SystemExit) as exc:
            script.main(bad)
        assert exc.value.code == 2 and named in capsys.readouterr().err
