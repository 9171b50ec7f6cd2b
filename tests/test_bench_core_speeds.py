"""``benchmarks/core_speeds.py`` (per-core speed, second by second) runs and prints what it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_core_speeds_counts_every_core_in_every_window():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "core_speeds.py"), "--seconds", "2"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rep = json.loads(out)
    cores = sorted(os.sched_getaffinity(0))
    assert rep["cores"] == cores and rep["seconds"] == 2
    counts = rep["iterations_per_second"]
    assert sorted(counts) == sorted(str(c) for c in cores)
    assert all(len(v) == 2 and all(k > 0 for k in v) for v in counts.values())
    if len(cores) >= 2:
        ratios = rep["ratio_core0_over_core1"]
        assert len(ratios) == 2 and all(r > 0 for r in ratios)
        assert rep["ratio_range"][0] <= rep["ratio_mean"] <= rep["ratio_range"][1]


def test_core_speeds_rejects_no_windows():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "core_speeds.py"), "--seconds", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--seconds" in proc.stderr and "Traceback" not in proc.stderr
