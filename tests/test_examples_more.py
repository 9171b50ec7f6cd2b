"""The LeNet and tabular examples, and the pure parts of benchmarks/agent_decisions.py.

The benchmark's log parsing and figures (reversals, time to accuracy, step-time ratios) are checked
on synthetic inputs; each new example script runs once for a few epochs in one process (an
environment stripped of POLLUX_* and torchrun variables) and its JSON lines are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "agent_decisions.py"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK")


def load_bench():
    return load_script(BENCH, "agent_decisions")


ad = load_bench()


def decision(old, new, reason="periodic refit", **extra) -> dict:
    return {"from": old, "to": new, "reason": reason, "predicted_gain": 0.1,
            "stats": {"sqr": 1.0, "var": 2.0, "pgns": 30.0, "n": 40, "biased": False}, **extra}


# ---------------------------------------------------------------------------------------------
# Parsing


def test_parse_marked_lines_with_any_prefix_and_trailing_text():
    d1 = decision([1, 16, 0], [1, 32, 0])
    d2 = decision(None, [2, 8, 0], reason="start")
    text = "\n".join([
        f"2026-11-23 20:24:43,151 pollux.torch INFO decision {json.dumps(d1)}",
        f"[rank0]: INFO:pollux.torch:decision {json.dumps(d2)} (logged twice?)",
        "2026-11-23 pollux.torch INFO batch size 16 -> 32 (local 32 x 1 micro-step(s)) [periodic refit]",
        "pollux.torch INFO decision {not json at all",
        "pollux.torch INFO decision without an object",
        'something else {"from": [1, 1, 0]}',
        'pollux.torch INFO step-time check {"config": [1, 32, 0], "predicted_s": 0.02, "measured_s": 0.025,'
        ' "steps": 12}',
    ])
    found = ad.parse_decisions(text)
    assert found == [d1, d2]
    checks = ad.parse_step_checks(text)
    assert checks == [{"config": [1, 32, 0], "predicted_s": 0.02, "measured_s": 0.025, "steps": 12}]
    assert ad.parse_decisions("") == [] and ad.parse_step_checks("no checks\n") == []


def test_parse_events_reads_epoch_and_final_lines_and_legacy_results():
    out = "\n".join([
        json.dumps({"event": "epoch", "epoch": 0, "val_acc": 0.5, "time": 10.0}),
        "not json",
        "{broken",
        json.dumps({"event": "final", "val_acc": 0.7}),
        json.dumps({"test_accuracy": 0.9, "batch_sizes": [16, 32]}),
        json.dumps([1, 2]),
    ])
    events = ad.parse_events(out)
    assert [e["event"] for e in events] == ["epoch", "final", "final"]
    assert events[-1]["val_acc"] == 0.9 and events[-1]["batch_sizes"] == [16, 32]


def test_batch_of_and_reason_classes():
    assert ad.batch_of([2, 16, 1]) == 64 and ad.batch_of((1, 32, 0)) == 32
    assert ad.batch_of(None) is None and ad.batch_of([1, 2]) is None and ad.batch_of(["a", 1, 0]) is None
    assert ad.is_start("start") and ad.is_start("start; fixed batch") and not ad.is_start("periodic refit")
    assert ad.is_replica_change("replicas 1 -> 2") and ad.is_replica_change("replicas 2 -> 1; no model")
    assert not ad.is_replica_change("periodic refit") and not ad.is_replica_change(None)


# ---------------------------------------------------------------------------------------------
# Figures


def test_count_reversals_ignores_start_replica_changes_and_no_ops():
    seq = [
        decision(None, [1, 16, 0], reason="start"),
        decision([1, 16, 0], [1, 32, 0]),                 # up
        decision([1, 32, 0], [1, 16, 1]),                 # same global batch: skipped
        decision([1, 16, 1], [1, 64, 0]),                 # up
        decision([1, 64, 0], [2, 8, 0], reason="replicas 1 -> 2"),     # down, but a replica change
        decision([2, 8, 0], [2, 32, 0]),                  # up: no reversal
        decision([2, 32, 0], [2, 16, 0]),                 # down: reversal 1
        decision([2, 16, 0], [2, 24, 0]),                 # up: reversal 2
    ]
    assert ad.count_reversals(seq) == 2
    assert ad.count_reversals(seq[:6]) == 0
    assert ad.count_reversals([]) == 0
    assert [ad.is_change(d) for d in seq] == [False, True, False, True, False, True, True, True]


def test_step_time_ratios_one_and_two_sided():
    checks = [{"predicted_s": 0.010, "measured_s": 0.020},     # pred/meas 0.5 (two-sided 2)
              {"predicted_s": 0.030, "measured_s": 0.020},     # 1.5
              {"predicted_s": 0.0, "measured_s": 0.020},       # unusable
              {"predicted_s": None, "measured_s": 0.020},
              {"config": [1, 2, 0]}]
    r = ad.step_time_ratios(checks)
    assert r["checks"] == 2
    assert r["ratio_max"] == pytest.approx(1.5)
    assert r["ratio_max_two_sided"] == pytest.approx(2.0)
    none = ad.step_time_ratios([])
    assert none["checks"] == 0 and none["ratio_max"] is None and none["ratio_max_two_sided"] is None


def test_time_to_accuracy_adds_earlier_runs_wall_time():
    runs = [
        {"launch": 100.0, "exit": 130.0, "epochs": [{"time": 110.0, "val_acc": 0.80},
                                                     {"time": 120.0, "val_acc": 0.90}]},
        {"launch": 140.0, "exit": 170.0, "epochs": [{"time": 150.0, "val_acc": 0.95},
                                                     {"time": 160.0, "val_acc": 0.97}]},
    ]
    assert ad.time_to_accuracy(runs, 0.80) == pytest.approx(10.0)
    assert ad.time_to_accuracy(runs, 0.85) == pytest.approx(20.0)
    # the run before counts launch → exit; the gap between its exit and the next launch does not count
    assert ad.time_to_accuracy(runs, 0.95) == pytest.approx(30.0 + 10.0)
    assert ad.time_to_accuracy(runs, 0.96) == pytest.approx(30.0 + 20.0)
    assert ad.time_to_accuracy(runs, 0.99) is None
    assert ad.time_to_accuracy([], 0.5) is None


def test_compare_and_summary_criteria():
    def job(acc, total, decisions=(), checks=(), error=None):
        runs = [{"launch": 0.0, "exit": total, "epochs": [{"time": total * 0.5, "val_acc": acc - 0.001},
                                                          {"time": total, "val_acc": acc}]}]
        return {"final_acc": acc, "runs": runs, "error": error, "total_s": total,
                "reversals": ad.count_reversals(decisions), "changes": sum(map(ad.is_change, decisions)),
                "step_time": ad.step_time_ratios(checks), "batch_sizes": [16], "replica_sequence": [1],
                "sigterm_after_s": None, "first_change_after_s": None, "loadavg": [None]}

    fixed = job(0.950, 60.0)
    good = ad.compare(job(0.945, 40.0, checks=[{"predicted_s": 1.0, "measured_s": 1.2}]), fixed)
    assert good["pass"] == {"accuracy": True, "time_to_accuracy": False, "reversals": True,
                            "step_time_ratio": True}      # never reached 0.950
    fast = ad.compare(job(0.951, 40.0), fixed)
    # its first epoch (at 20 s) already has 0.950 = the fixed job's final accuracy
    assert fast["tta_adaptive_s"] == pytest.approx(20.0) and fast["pass"]["time_to_accuracy"] is True
    assert fast["pass"]["step_time_ratio"] is None and fast["speedup_tta"] == pytest.approx(3.0)
    bad = ad.compare(job(0.930, 40.0, decisions=[decision([1, 16, 0], [1, 32, 0]),
                                                 decision([1, 32, 0], [1, 16, 0]),
                                                 decision([1, 16, 0], [1, 32, 0])]), fixed)
    assert bad["pass"]["accuracy"] is False and bad["pass"]["reversals"] is False and bad["reversals"] == 2
    s = ad.summarise([fast, good])
    assert s["pass"] == {"accuracy": True, "time_to_accuracy": False, "reversals": True,
                         "step_time_ratio": True}
    assert s["overall"] is False
    assert ad.summarise([fast])["overall"] is None             # no step-time check anywhere
    assert ad.overall([True, True]) is True and ad.overall([True, None]) is None


def test_first_change_seen():
    start = f"x decision {json.dumps(decision(None, [1, 16, 0], reason='start'))}\n"
    assert not ad.first_change_seen(start)
    assert ad.first_change_seen(start + f"y decision {json.dumps(decision([1, 16, 0], [1, 32, 0]))}\n")
    assert ad.first_change_seen("pollux.torch INFO batch size 16 -> 26 (local 26 x 1) ... [periodic refit]")


# ---------------------------------------------------------------------------------------------
# The example scripts, alone, a few epochs


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_") and k not in TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    return env


@pytest.mark.parametrize(("script", "extra"), [
    ("lenet", ["--epochs", "2"]),
    ("tabular", ["--epochs", "2"]),
    ("tabular", ["--epochs", "1", "--fixed", "--optimizer", "adam"]),
])
def test_example_smoke_run_prints_epoch_and_final_lines(script, extra):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    cmd = [sys.executable, str(ROOT / "examples" / script / "train.py"), "--refit-interval", "1", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    epochs = [e for e in lines if e["event"] == "epoch"]
    finals = [e for e in lines if e["event"] == "final"]
    n = int(extra[extra.index("--epochs") + 1])
    assert [e["epoch"] for e in epochs] == list(range(n)) and len(finals) == 1 and lines[-1] is finals[0]
    for e in epochs:
        assert {"val_acc", "time", "batch_size", "replicas", "run"} <= set(e)
        assert 0.0 <= e["val_acc"] <= 1.0 and e["replicas"] == 1 and e["run"] == 1
    final = finals[0]
    assert final["epochs"] == n and final["runs"] == 1 and final["fixed"] == ("--fixed" in extra)
    assert final["val_acc"] > 0.5, final            # well above chance after an epoch or two
    if "--fixed" in extra:
        assert final["batch_sizes"] == [epochs[0]["batch_size"]]
    assert ad.parse_decisions(proc.stderr) == ad.parse_decisions(proc.stderr)   # parses whatever is there
