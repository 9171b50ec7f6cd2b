"""The `pollux goodput` walk-through (the current `make demo`) and the goodput benchmark script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pollux.cli import main
from pollux.goodput.examples import load_example_jobs
from pollux.policy.registry import policy_names

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "pollux-osdi21" / "traces"


def test_example_jobs_load_with_provenance():
    jobs = load_example_jobs()
    assert set(jobs) == {"cifar10", "imagenet"}
    for job in jobs.values():
        assert "validation-" in job.provenance and "placements.csv" in job.provenance
        assert set(job.grad) == {"early", "late"}


def test_goodput_json_shows_batch_growth_late_in_training(capsys):
    assert main(["goodput", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name, phases in out.items():
        early, late = phases["early"], phases["late"]
        # The noise scale grows during training, so at 16 GPUs the best batch grows and pays off.
        assert late["pgns"] > early["pgns"], name
        e16 = next(r for r in early["rows"] if r["gpus"] == 16)
        l16 = next(r for r in late["rows"] if r["gpus"] == 16)
        assert l16["batch_size"] > e16["batch_size"]
        assert l16["speedup"] > e16["speedup"]
        for row in early["rows"] + late["rows"]:
            assert 0 < row["efficiency"] <= 1
            assert row["batch_size"] >= 128
            assert row["batch_size"] == row["gpus"] * row["local_bsz"] * (row["accum_steps"] + 1)


def test_goodput_unknown_job_is_a_clear_error(capsys):
    assert main(["goodput", "--job", "nope"]) == 2
    assert "unknown example job" in capsys.readouterr().err


def test_goodput_table_output(capsys):
    assert main(["goodput", "--job", "cifar10"]) == 0
    out = capsys.readouterr().out
    assert "late in training" in out and "speedup" in out


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"shared profiles not found at {TRACES}")
def test_goodput_benchmark_meets_targets():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "goodput.py"), "--data", str(TRACES), "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    )
    result = json.loads(proc.stdout)
    assert set(result["fit"]) == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
    for app, fit in result["fit"].items():
        assert fit["mean_rel_error"] <= (0.15 if app == "ncf" else 0.10), app
        assert fit["rows"] > 100


def test_goodput_benchmark_bad_data_dir_is_a_clear_error(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n1,x,1,0\n")
    (tmp_path / "app" / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "goodput.py"), "--data", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "placements.csv:2" in proc.stderr and "local_bsz" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------------
# One error convention for every command (docs/cli.md, "Errors and exit statuses")


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sim_usage_errors_exit_2_after_the_commands_usage(capsys, tmp_path):
    code, out, err = run(capsys, ["simulate", "--policy", "nope"])
    assert code == 2 and out == ""
    usage, message = err.strip().splitlines()[0], err.strip().splitlines()[-1]
    assert usage.startswith("usage: pollux simulate ")
    choices = ", ".join(repr(n) for n in policy_names())           # the registry's names
    assert message == ("pollux simulate: error: argument --policy: invalid choice: 'nope' "
                       f"(choose from {choices})")
    code, _, err = run(capsys, ["workload", "generate", "--trace", "t.csv", "--out", str(tmp_path / "o.csv"),
                                "--jobs", "0"])
    assert code == 2 and "pollux workload generate: error: argument --jobs: expected an integer >= 1" in err
    code, _, err = run(capsys, ["goodput", "--job", "nope"])       # found after parsing: the same form
    assert code == 2 and err.startswith("usage: pollux goodput ")
    last = err.strip().splitlines()[-1]
    assert last.startswith("pollux goodput: error: --job: unknown example job(s) nope")
    code, _, err = run(capsys, ["goodput", "--bogus"])              # named after the subcommand
    assert code == 2 and err.strip().endswith("pollux goodput: error: unrecognized arguments: --bogus")
    assert "Traceback" not in err


def test_sim_runtime_errors_exit_1_naming_the_file(capsys, tmp_path):
    missing = tmp_path / "none.csv"
    code, out, err = run(capsys, ["simulate", "--workload", str(missing)])
    assert code == 1 and out == ""
    assert err == f"pollux: error: --workload {missing}: no such file or folder\n"
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nj0,x,cifar10,1,128\n")
    code, out, err = run(capsys, ["simulate", "--workload", str(bad), "--quiet"])
    assert code == 1 and out == ""
    assert err == f"pollux: error: {bad}:2: field 'time': not a number: 'x'\n"
    code, _, err = run(capsys, ["workload", "generate", "--trace", str(missing), "--out",
                                str(tmp_path / "o.csv")])
    assert code == 1 and err.startswith("pollux: error: ") and str(missing) in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o.csv").exists()


def planned_runs(monkeypatch, argv):
    """The run specs ``pollux simulate`` would run for ``argv``, stopped before any simulation."""
    from pollux.sim import runner

    seen = []

    class Stop(Exception):
        pass

    def fake_run_many(specs, *args, **kwargs):
        seen.extend(specs)
        raise Stop

    monkeypatch.setattr(runner, "run_many", fake_run_many)
    with pytest.raises(Stop):              # not a user error: it keeps its traceback
        main(argv)
    return seen


def test_simulate_compares_the_registrys_default_policies(capsys, monkeypatch):
    seen = planned_runs(monkeypatch, ["simulate", "--quiet"])
    assert [s.policy for s in seen] == list(policy_names(compare=True)) == ["pollux", "tiresias", "optimus"]


def test_console_entry_exit_statuses(tmp_path):
    """Through ``python -m pollux.cli``, in its own process: the statuses a shell sees."""
    cmd = [sys.executable, "-m", "pollux.cli"]
    usage = subprocess.run([*cmd, "simulate", "--interference", "2"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 2 and "pollux simulate: error: argument --interference" in usage.stderr
    runtime = subprocess.run([*cmd, "simulate", "--profiles", str(tmp_path / "no")], capture_output=True,
                             text=True, timeout=60)
    assert runtime.returncode == 1
    assert runtime.stderr == f"pollux: error: --profiles {tmp_path / 'no'}: no such folder\n"
    ok = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "usage: pollux" in ok.stdout


def test_simulate_slow_nodes_and_balance_both(capsys, monkeypatch):
    """--slow-nodes/--slow-factor set the nodes' speeds; --balance both runs each policy twice."""
    seen = planned_runs(monkeypatch, ["simulate", "--quiet", "--policy", "pollux", "--policy", "tiresias",
                                      "--slow-nodes", "4", "--slow-factor", "0.25", "--balance", "both"])
    assert [(s.policy, s.config.balance) for s in seen] == [("pollux", False), ("pollux", True),
                                                            ("tiresias", False), ("tiresias", True)]
    assert all(s.config.node_speed == (0.25,) * 4 + (1.0,) * 12 for s in seen)
    seen = planned_runs(monkeypatch, ["simulate", "--quiet", "--policy", "pollux"])
    assert [(s.config.balance, set(s.config.node_speed)) for s in seen] == [(False, {1.0})]


@pytest.mark.parametrize(("argv", "message"), [
    (["--slow-nodes", "17"], "--slow-nodes: expected at most 16 (the cluster's nodes), got 17"),
    (["--slow-nodes", "-1"], "argument --slow-nodes: expected an integer >= 0, got -1"),
    (["--slow-factor", "1.5"], "argument --slow-factor: expected a number in (0, 1], got 1.5"),
    (["--slow-factor", "0"], "argument --slow-factor: expected a number in (0, 1], got 0"),
    (["--balance", "maybe"], "argument --balance: invalid choice: 'maybe'"),
])
def test_simulate_bad_slow_node_options_are_usage_errors(capsys, argv, message):
    code, out, err = run(capsys, ["simulate", "--quiet", *argv])
    assert code == 2 and out == ""
    assert f"pollux simulate: error: {message}" in err
