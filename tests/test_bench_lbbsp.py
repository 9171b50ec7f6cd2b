"""``benchmarks/lbbsp.py`` (the LB-BSP figures of issue 12) runs end to end at toy sizes.

The figures themselves need the full run (minutes, on a quiet machine: ``docs/benchmarks.md``); this
checks the mechanics a full run relies on: two gloo replicas per section started and stopped by PID,
the example's network at the requested width, shares that always sum to the global batch, the busy
loop of ``real_contention`` stopped, and one JSON object with every section's ratio.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("injected_half_speed", "real_contention", "overhead_equal_speed", "predictor_rmse")


def test_lbbsp_benchmark_smoke():
    m = 64
    cmd = [sys.executable, str(ROOT / "benchmarks" / "lbbsp.py"), "--json", "--width", "1",
           "--train-batch", str(m), "--pairs", "1", "--block-epochs", "2", "--switch-epochs", "2",
           "--switch-blocks", "1",
           "--overhead-pairs", "1", "--overhead-epochs", "2", "--traces", "1", "--length", "200"]
    for name in SECTIONS:
        cmd += ["--only", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    # exit status 1 means a figure missed its target, which toy sizes may: anything else is a failure
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    rep = json.loads(proc.stdout)
    assert set(SECTIONS) <= set(rep)
    assert proc.returncode == (0 if all(rep[s].get("ok", True) for s in SECTIONS) else 1)
    inj = rep["injected_half_speed"]
    assert inj["global_batch"] == m
    assert math.isfinite(inj["ratio"]) and inj["ratio"] > 0
    trajectory = inj["shares_trajectory"] + inj["switch_blocks"][0]["shares"]
    assert trajectory and all(len(x) == 2 and min(x) >= 0 for x in trajectory)
    # every full step splits the global batch; an epoch's tail step is the remainder, split too
    assert max(sum(x) for x in trajectory) == m
    cont = rep["real_contention"]
    if "skipped" not in cont:
        assert math.isfinite(cont["ratio"]) and cont["ratio"] > 0
        assert "busy process PID" in proc.stderr and "stopped" in proc.stderr
        pid = int(proc.stderr.split("busy process PID ")[1].split()[0])
        try:                                  # gone (or the PID reused by something else)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        assert b"while True" not in cmdline
    over = rep["overhead_equal_speed"]
    assert math.isfinite(over["ratio"]) and over["ratio"] > 0
    rmse = rep["predictor_rmse"]["rmse"]
    assert set(rmse) == {"narx", "moving_average", "last_value"} and all(v > 0 for v in rmse.values())
