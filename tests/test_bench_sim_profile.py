"""``benchmarks/sim_profile.py`` (issue 38, step 1: where a simulation's time goes) runs end to end in
its ``--quick`` form and its split of the time holds together.

What the full run's table relies on: the phases of every run add up to its wall time (nothing is
lost between them, nothing counted twice), the policy's phases agree with the engine's own timer of
``decide`` (an independent clock), every size reports its counts (rounds, active jobs, table size,
refits), the cap is stated on every capped run, and the wrapped library functions are restored
afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_scripts import load_script, run_quick_json

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sim_profile.py"
DATA = ROOT.parent / "shared" / "data"

HAVE_DATA = ((DATA / "pollux-osdi21" / "traces" / "philly.csv").is_file()
             and (DATA / "sia-sosp23" / "traces").is_dir())
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"shared data not found under {DATA}")


@pytest.fixture(scope="module")
def script():
    """The benchmark as a module (it is a script, not in a package), for its pure parts."""
    return load_script(SCRIPT, "sim_profile_bench")


@pytest.fixture(scope="module")
def quick():
    return run_quick_json(SCRIPT, 600)


@needs_data
def test_every_size_and_policy_ran_with_its_counts(quick, script):
    rep, err = quick
    pairs = {(r["size"], r["policy"]) for r in rep["runs"]}
    assert pairs == {(s, p) for s in script.SIZES for p in script.POLICIES}
    for r in rep["runs"]:
        assert r["rounds"] > 0 and r["jobs"] > 0 and r["active_jobs_mean"] > 0
        assert r["table"]["rounds"] == r["rounds"] and r["table"]["entries_mean"] > 0
        assert r["refits"]["count"] > 0 and r["refits"]["total_s"] > 0
        assert r["cap_hours"] == rep["cap_hours"] and r["size"] in rep["capped_sizes"]
        assert r["simulated_hours"] <= rep["cap_hours"] + 2 * rep["interval_s"] / 3600
        assert r["gpus"] == script.SIZES[r["size"]].gpus
        if r["policy"] == "pollux":
            assert r["counts"]["greedy_fills"] > 0 and r["calls"]["decide.speedup_tables"] > 0
        else:
            assert r["calls"]["decide.program_solve"] == r["rounds"]
    assert "sim_profile: sia philly-2000x4096" in err


@needs_data
def test_the_phases_add_up_to_the_wall_time(quick):
    rep, _ = quick
    for r in rep["runs"]:
        phases = r["phases_s"]
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) == pytest.approx(r["wall_s"], rel=0.03)
        # the policy's phases against the engine's own timer around decide
        assert r["decide"]["phases_s"] == pytest.approx(r["decide"]["engine_timer_s"], rel=0.03, abs=1e-3)
        assert phases["refits"] == r["refits"]["total_s"]


@needs_data
def test_the_typed_sizes_run_on_the_sia_mix(quick, script):
    rep, _ = quick
    for r in rep["runs"]:
        size = script.SIZES[r["size"]]
        if size.typed or (r["policy"] == "sia" and size.generated):
            assert r["typed"] and r["cluster"] == script.SIA_MIX[size.gpus]
        else:
            assert not r["typed"] and r["cluster"] == f"{size.gpus // 4}x4 (untyped)"


def test_the_wrappers_are_removed_afterwards(script):
    from pollux.policy.pollux import policy as pollux_policy
    from pollux.sim import fit_memo
    from pollux.sim.engine import SimJob

    before = (SimJob.advance, fit_memo.fit_records, pollux_policy.greedy)
    clock = script.PhaseClock()
    with pytest.raises(RuntimeError), script.instrumented(clock):
        assert fit_memo.fit_records is not before[1]
        raise RuntimeError("a failed run")
    assert (SimJob.advance, fit_memo.fit_records, pollux_policy.greedy) == before


def test_nested_calls_count_once(script):
    clock = script.PhaseClock()
    inner = clock.wrap("inner", lambda: sum(range(20000)))
    outer = clock.wrap("outer", lambda: [inner() for _ in range(3)])
    outer()
    assert clock.calls == {"inner": 3, "outer": 1}
    assert clock.seconds["inner"] > 0 and clock.seconds["outer"] >= 0


def test_bad_options_exit_2_naming_the_option(script, capsys):
    for bad, named in ((["--sizes", "nope"], "--sizes"), (["--policies", "gavel"], "--policies"),
                       (["--cap-hours", "0"], "--cap-hours")):
        with pytest.raises(SystemExit) as exc:
            script.main(bad)
        assert exc.value.code == 2 and named in capsys.readouterr().err
