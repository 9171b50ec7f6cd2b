"""``benchmarks/hpo.py`` (issue 37, part 2: an HPO study on Pollux against static allocation) runs end
to end at toy sizes and its report holds together.

The figures need the full run (100 trials, 5 seeds, tens of minutes); this runs 12 trials of cifar10
cut to 10 epochs, two seeds, both pruner variants, and checks what a full run relies on: the
reductions are those of the arms' own figures, averaged over the seeds; the best-objective verdict
is the two-standard-error rule on the arms' best values; the targets' flags and the exit status
agree with the figures; the pruned variant prunes and its extra gain is the difference of the two
variants; the arms ran what they claim (static: 4 GPUs throughout; Pollux: from one GPU); the plot
is written; bad input exits 2 naming the option.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench_scripts import load_script

pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "hpo.py"
DATA = ROOT.parent / "shared" / "data" / "pollux-osdi21"
TRIALS, SEEDS, EPOCHS = 12, 2, 10
SENSITIVITY = (64, 128)

needs_data = pytest.mark.skipif(not (DATA / "traces").is_dir(), reason=f"shared data not found at {DATA}")


@pytest.fixture(scope="module")
def script():
    """The benchmark as a module (it is a script, not in a package), for its pure functions."""
    return load_script(SCRIPT, "hpo_bench")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    plots = tmp_path_factory.mktemp("plots")
    cmd = [sys.executable, str(SCRIPT), "--json", "--trials", str(TRIALS), "--seeds", str(SEEDS),
           "--epochs", str(EPOCHS), "--sensitivity", ",".join(map(str, SENSITIVITY)), "--plots", str(plots)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    # 1 means a target was missed, which toy sizes may: anything else is a failure
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return proc, json.loads(proc.stdout), plots


@needs_data
def test_the_reductions_are_the_arms_figures_averaged_over_seeds(toy):
    _, rep, _ = toy
    assert set(rep["variants"]) == {"none", "median"} and rep["target_variant"] == "none"
    for name, v in rep["variants"].items():
        pol, sta = v["arms"]["pollux"], v["arms"]["static"]
        assert [r["seed"] for r in pol] == [r["seed"] for r in sta] == list(range(SEEDS))
        mk = [1 - p["makespan_h"] / s["makespan_h"] for p, s in zip(pol, sta, strict=True)]
        jct = [1 - p["mean_jct_min"] / s["mean_jct_min"] for p, s in zip(pol, sta, strict=True)]
        assert [x["makespan_reduction"] for x in v["per_seed"]] == pytest.approx(mk)
        assert [x["mean_jct_reduction"] for x in v["per_seed"]] == pytest.approx(jct)
        assert v["makespan_reduction"] == pytest.approx(np.mean(mk))
        assert v["mean_jct_reduction"] == pytest.approx(np.mean(jct))
        for arm in (*pol, *sta):
            assert arm["pruner"] == name and arm["trials"] == TRIALS
            records = arm["trial_records"]
            assert [t["number"] for t in records] == list(range(TRIALS))
            ends = [t["end_h"] for t in records]
            assert arm["makespan_h"] == pytest.approx(max(ends))
            assert arm["mean_jct_min"] == pytest.approx(
                60 * np.mean([t["end_h"] - t["submit_h"] for t in records]))
            assert arm["pruned"] == sum(t["state"] == "pruned" for t in records)
            complete = [t["value"] for t in records if t["state"] == "complete"]
            assert arm["best_value"] == max(complete)
            assert arm["top5_mean"] == pytest.approx(np.mean(sorted(complete)[-5:]))
    top = rep["variants"]["none"]
    assert rep["makespan_reduction"] == top["makespan_reduction"]
    assert rep["mean_jct_reduction"] == top["mean_jct_reduction"]


@needs_data
def test_no_study_beats_the_clairvoyant_bound(toy):
    """The bounds the benchmark reports, and that they hold for the simulator's own unpruned studies:
    no arm's makespan or mean trial JCT is below them, in any seed."""
    _, rep, _ = toy
    c = rep["clairvoyant"]
    plain = rep["variants"]["none"]["arms"]
    static = plain["static"]
    assert c["max_makespan_reduction"] == pytest.approx(
        np.mean([1 - c["makespan_lower_bound_h"] / s["makespan_h"] for s in static]))
    assert c["max_mean_jct_reduction"] == pytest.approx(
        np.mean([1 - c["mean_jct_lower_bound_min"] / s["mean_jct_min"] for s in static]))
    assert c["makespan_target_reachable"] == (c["max_makespan_reduction"] >= 0.30)
    assert c["mean_jct_target_reachable"] == (c["max_mean_jct_reduction"] >= 0.25)
    for runs in plain.values():
        for r in runs:
            assert r["makespan_h"] >= c["makespan_lower_bound_h"] - 1e-9
            assert r["mean_jct_min"] >= c["mean_jct_lower_bound_min"] - 1e-9


@needs_data
def test_the_best_objective_verdict_is_two_standard_errors(toy):
    _, rep, _ = toy
    for v in rep["variants"].values():
        best = {arm: [r["best_value"] for r in v["arms"][arm]] for arm in ("pollux", "static")}
        b = v["best"]
        diff = np.mean(best["pollux"]) - np.mean(best["static"])
        se = np.sqrt(np.var(best["pollux"], ddof=1) / SEEDS + np.var(best["static"], ddof=1) / SEEDS)
        assert b["difference"] == pytest.approx(diff) and b["se_difference"] == pytest.approx(se)
        assert b["within_noise"] == (abs(diff) <= 2 * se + 1e-12)
    assert rep["best"] == rep["variants"]["none"]["best"]


def test_best_comparison_flags_a_gap_beyond_the_noise(script):
    close = script.best_comparison([0.950, 0.952, 0.948], [0.951, 0.949, 0.950])
    assert close["within_noise"]
    apart = script.best_comparison([0.950, 0.951, 0.949], [0.930, 0.931, 0.929])
    assert not apart["within_noise"] and apart["difference"] == pytest.approx(0.02)
    assert script.reduction(10.0, 14.0) == pytest.approx(2 / 7)


@needs_data
def test_flags_and_exit_status_follow_the_figures(toy):
    proc, rep, _ = toy
    assert rep["ok_makespan"] == (rep["makespan_reduction"] >= 0.30)
    assert rep["ok_jct"] == (rep["mean_jct_reduction"] >= 0.25)
    assert rep["ok_best"] == rep["best"]["within_noise"]
    assert rep["ok"] == (rep["ok_makespan"] and rep["ok_jct"] and rep["ok_best"])
    assert proc.returncode == (0 if rep["ok"] else 1)
    assert "hpo: pruner none, seed 0, arm pollux" in proc.stderr
    assert "hpo: pruner median, seed 1, arm static" in proc.stderr


@needs_data
def test_the_pruned_variant_prunes_and_its_extra_gain_is_the_difference(toy):
    _, rep, _ = toy
    plain, pruned = rep["variants"]["none"], rep["variants"]["median"]
    assert all(r["pruned"] == 0 for arm in plain["arms"].values() for r in arm)
    assert sum(r["pruned"] for arm in pruned["arms"].values() for r in arm) > 0
    p = rep["pruning"]
    assert p["makespan_reduction"] == pruned["makespan_reduction"]
    assert p["extra_makespan_reduction"] == pytest.approx(
        pruned["makespan_reduction"] - plain["makespan_reduction"])
    assert p["extra_mean_jct_reduction"] == pytest.approx(
        pruned["mean_jct_reduction"] - plain["mean_jct_reduction"])
    for arm in pruned["arms"].values():
        for r in arm:
            for t in r["trial_records"]:
                assert (t["epochs_run"] < EPOCHS) == (t["state"] == "pruned")
    assert rep["median_pruner"] == {"n_startup_trials": 5, "n_warmup_steps": EPOCHS // 10}


@needs_data
def test_the_arms_ran_what_they_claim(toy):
    _, rep, _ = toy
    assert rep["static"] == {"policy": "fifo", "gpus": 4, "local_batch": 128, "global_batch": 512}
    assert rep["epochs"] == EPOCHS and rep["gpus"] == 16 and rep["nodes"] == 4
    for v in rep["variants"].values():
        for r in v["arms"]["static"]:
            for t in r["trial_records"]:
                (when, gpus), = t["gpus"]                      # one change point: 4 GPUs from its start
                assert gpus == 4 and when == pytest.approx(t["start_h"], abs=1e-4)
        for r in v["arms"]["pollux"]:
            assert all(t["gpus"][0][1] == 1 for t in r["trial_records"])
            assert max(g for t in r["trial_records"] for _, g in t["gpus"]) > 1
    sens = rep["static_batch_sensitivity"]["local_batches"]
    assert set(sens) == {str(b) for b in SENSITIVITY}
    # the sensitivity row at the default local batch is the main comparison again
    assert sens["128"]["makespan_reduction"] == pytest.approx(rep["makespan_reduction"])
    assert sens["64"]["global_batch"] == 256


@needs_data
def test_the_plot_is_written(toy):
    _, rep, plots = toy
    path = Path(rep["plot"])
    assert path == plots / "hpo.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("bad", "named"), [
    (["--gpus", "6"], "--gpus"), (["--gpus", "0"], "--gpus"), (["--seeds", "0"], "--seeds"),
    (["--trials", "0"], "--trials"), (["--concurrent", "0"], "--concurrent"),
    (["--pruner", "hyperband"], "--pruner"), (["--epochs", "0"], "--epochs"),
    (["--epochs", "101"], "--epochs"),
    (["--static-gpus", "32"], "--static-gpus"), (["--static-local-batch", "4096"], "--static-local-batch"),
    (["--sensitivity", "64,x"], "--sensitivity"), (["--application", "no-such-app"], "--application"),
    (["--data", "/nonexistent"], "--data"),
])
@needs_data
def test_bad_input_exits_2_naming_the_option(script, capsys, bad, named):
    with pytest.raises(SystemExit) as exc:
        script.main(["--json", "--no-plots", *bad])
    err = capsys.readouterr()
    assert exc.value.code == 2 and named in err.err and err.out == ""
