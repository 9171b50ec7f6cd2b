"""``pollux scar`` as users run it, and ``benchmarks/scar.py`` on the fast quadratic model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_scripts import run_quick_json
from pollux.cli.entry import main

ROOT = Path(__file__).resolve().parents[1]


def test_models_lists_every_registered_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scar", "models"]) == 0
    out = capsys.readouterr().out
    for name in ("mlr", "mf", "lda", "cnn", "qp"):
        assert out.count(f"\n{name} ") + out.startswith(f"{name} ") == 1


def test_one_point_partial_beats_full(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["scar", "experiment", "--model", "qp", "--lost", "1/4", "--trials", "30", "--json", "--quiet"]
    assert main([*common, "--recovery", "full"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*common, "--recovery", "partial"]) == 0
    part = json.loads(capsys.readouterr().out)
    assert full["recovery"] == "full" and part["recovery"] == "partial"
    assert full["lost_fraction"] == part["lost_fraction"] == 0.25
    assert part["mean"] < full["mean"]
    # text output names the settings and the interval
    assert main(["scar", "experiment", "--model", "qp", "--strategy", "priority", "--trials", "10",
                 "--quiet"]) == 0
    line = capsys.readouterr().out
    assert "priority r=0.125" in line and "±" in line and "10 trials" in line


def test_sweep_writes_plots_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scar", "experiment", "--model", "qp", "--sweep", "--trials", "20", "--json",
                 "--plots", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    sweep = data["models"][0]
    assert sweep["model"] == "qp"
    entry = sweep["layouts"][next(iter(sweep["layouts"]))]
    assert set(entry["partial"]) == {"1/4", "1/2", "3/4"}
    assert set(entry["strategies"]["priority"]) == {"1", "1/2", "1/4", "1/8"}
    assert set(sweep["checks"]) >= {"reduction_in_range", "priority_1_8_ok", "all"}
    assert entry["theory"]["points"]["partial 1/4"]["jump_rms_ratio"] < 1.0  # Theorem 5.3.1 beside it
    assert "priority r=1/8" in captured.err  # progress on stderr
    for name in ("recovery.png", "strategies.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "resnet"], "--model: expected one of"),
        (["--lost", "0"], "--lost: expected a number in (0, 1]"),
        (["--fraction", "3/2"], "--fraction: expected a number in (0, 1]"),
        (["--plots", "x"], "--plots needs --sweep"),
        (["--model", "qp", "--layout", "columns"], "layout: qp has"),
    ],
)
def test_bad_input_is_a_usage_error(argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scar", "experiment", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_benchmark_reports_plain_figures_sensitivity_and_theorems() -> None:
    data, err = run_quick_json(ROOT / "benchmarks" / "scar.py", timeout_s=300)
    assert data["quick"] is True and set(data["plain"]) == {"qp"}
    plain = data["plain"]["qp"]
    assert plain["setting"]["label"] == "spread=2.0"
    entry = plain["layouts"][next(iter(plain["layouts"]))]
    theory = entry["theory"]["points"]
    assert set(theory) >= {"full", "partial 1/4", "partial 1/2", "partial 3/4", "priority 1/8"}
    assert theory["full"]["predicted_reduction"] == 0.0
    # the prediction reads the same points the sweep measured
    assert theory["priority 1/8"]["measured_mean"] == entry["strategies"]["priority"]["1/8"]["mean"]
    (point,) = data["sensitivity"]["qp"]
    assert point["setting"]["label"] == "spread=0.0"
    assert set(point["reduction"]) == {"1/4", "1/2", "3/4"}
    assert point["full"]["trials"] == data["trials"] == 10
    summary = data["summary"]["qp"]
    assert summary["priority_1_8_reduction"] == plain["checks"]["priority_1_8_reduction"]
    assert summary["priority_1_8_gap"] == pytest.approx(max(0.0, 0.78 - summary["priority_1_8_reduction"]))
    assert set(summary["sensitivity"]) == {"spread=0.0"}
    ratios = data["theory"]["theorem_5_4_2"]["ratios"]
    assert all(abs(v["mean_ratio"] - float(k)) <= 0.05 for k, v in ratios.items())
    assert data["theory"]["theorem_5_3_1"]["violations"] == 0
    assert "theorem 5.3.1" in err and "spread=0.0" in err


def test_benchmark_rejects_unknown_models() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scar.py"), "--models", "resnet"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--models: unknown resnet" in proc.stderr and "Traceback" not in proc.stderr
