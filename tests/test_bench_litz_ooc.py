"""The out-of-core Litz benchmark (``benchmarks/litz_ooc.py``) in its ``--quick`` mode.

Runs the three K-means configurations (in memory, the thesis's policy, the LRU baseline) at smoke
sizes on an embedded Ray, as a subprocess, and checks the JSON: the figures the issue names are
there and finite, every run gave the in-memory centres, the out-of-core runs evicted and reloaded
and stayed within the budget, the baseline loaded ahead nothing. The speed targets are *not*
asserted (smoke sizes on a shared machine say little); the full benchmark reports them. No process
of the benchmark's Ray session may be left behind.
"""

from __future__ import annotations

import json
import math
import os

import pytest

pytest.importorskip("ray")

from bench_scripts import BENCHMARKS, assert_ray_session_gone, run_benchmark
from pollux.cluster.backends.processes import descendants

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

#: A guard against a hang, not a speed check (the quick run takes well under a minute).
HANG_GUARD_S = 300


def test_litz_ooc_quick_json_has_the_issue_figures() -> None:
    before = set(descendants(os.getpid()))
    code, out, err = run_benchmark(BENCHMARKS / "litz_ooc.py", "--quick", "--json", timeout_s=HANG_GUARD_S)
    assert code == 0, err[-4000:]
    rep = json.loads(out)
    assert rep["benchmark"] == "litz_ooc" and rep["quick"] is True
    for key in ("vs_in_memory", "speedup_vs_baseline", "peak_accounted_over_budget", "state_over_budget"):
        assert isinstance(rep[key], float) and math.isfinite(rep[key]) and rep[key] > 0, key
    assert rep["state_over_budget"] >= 2.0 - 1e-9
    assert rep["identical_results"] is True and rep["targets"]["identical_results"] is True
    runs = rep["runs"]
    assert runs["in_memory"]["evictions"] == 0 and runs["in_memory"]["reloads"] == 0
    for name in ("litz", "lru"):
        assert runs[name]["evictions"] > 0 and runs[name]["reloads"] > 0, name
        assert 0 < runs[name]["peak_accounted_bytes"] <= rep["budget_bytes"], name
        assert runs[name]["bytes_read"] > 0 and runs[name]["work_s"] > 0, name
    assert runs["litz"]["prefetches"] > 0 and runs["lru"]["prefetches"] == 0
    assert runs["litz"]["reloads"] < runs["lru"]["reloads"]
    # The ceiling: every policy loads at least E - B executors an iteration, which litz's count obeys,
    # and no policy gains more than 1 + lru's loads / that many over lru.
    sizes = rep["sizes"]
    fewest = rep["fewest_loads_per_iteration"]
    assert fewest == sizes["executors"] - rep["budget_bytes"] // rep["executor_bytes"] >= 1
    assert runs["litz"]["reloads"] >= fewest * (sizes["iterations"] - 1)
    assert rep["lru_loads_per_iteration"] == runs["lru"]["reloads"] / sizes["iterations"]
    assert 0.0 < rep["speedup_ceiling"] <= 1.0 + rep["lru_loads_per_iteration"] / fewest + 1e-9
    assert set(rep["targets"]) == {"identical_results", "vs_in_memory_le_2", "speedup_vs_baseline_ge_3",
                                   "peak_within_budget_plus_10pct"}

    assert_ray_session_gone(rep.get("ray_session"), before)
