"""The service-at-size benchmark (``benchmarks/service_scale.py``) at its smoke size, so it keeps working.

``--quick --json``: 400 jobs in a real store, ~40 running on 32 simulated nodes of 4 GPUs, the real
service (control loop, ``pollux`` policy, API on loopback) in a child process, users and agents
calling it for 15 s. About 25 s on 2 cores; no Ray. The benchmark runs as a subprocess; if it
overruns, it gets SIGTERM, on which it stops its service before exiting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import run_benchmark

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "service_scale.py"
CALLS = ("hints", "ls", "ls_running", "describe", "submit", "cancel", "nodes")


def run_bench(*args: str, timeout_s: float) -> tuple[int, str, str]:
    return run_benchmark(BENCH, *args, timeout_s=timeout_s, cleanup_s=60)


def test_service_scale_benchmark_quick():
    code, out, err = run_bench("--quick", "--json", timeout_s=120)
    assert code == 0, err[-4000:]
    report = json.loads(out)
    assert "error" not in report, report.get("error")
    assert report["quick"] and report["jobs"] == 400 and report["gpus"] == 128 and report["cores"]
    assert report["filled"]["ended"] + report["filled"]["scheduled"] == 400
    # the scheduled jobs ran: as many as fit at their minimum, the rest queued
    fit = report["gpus"] // report["min_gpus_per_scheduled_job"]
    assert 0.8 * fit <= report["running_at_start"] <= fit, report["running_at_start"]
    # after the churn of submits and cancels, every node still holds a job of its own: the packing that
    # needs no multi-node job (replacing a cancelled multi-node job is the search's harder move, and a
    # slow machine leaves more of them unreplaced at the moment the clients stop)
    per_node = report["gpus"] // report["nodes"] // report["min_gpus_per_scheduled_job"]
    assert report["holding_at_end"] >= report["nodes"] * per_node, report["states_at_end"]
    # (a job being preempted still holds its GPUs while it stops, so only the running ones are bounded)
    assert report["running_at_end"] <= min(fit, report["holding_at_end"]) and report["queued_at_end"] >= 1
    assert report["service_exit"] == 0, err[-4000:]
    # rounds ran back to back while the calls were made, timed by the service
    assert report["rounds"] >= 5, report["rounds"]
    rounds = report["round_s"]
    assert 0 < rounds["p50"] <= rounds["p99"] <= rounds["max"] < 30
    assert 0 < report["policy_s"]["p50"] <= rounds["p50"] + 1e-3
    assert report["round_jobs"]["p50"] >= fit
    assert report["tick_s"]["n"] >= report["rounds"]
    # every kind of call was made, answered, and timed
    for call in CALLS:
        lat = report["latency_ms"][call]
        assert lat["n"] >= 1, call
        assert 0 < lat["p50"] <= lat["p99"] <= lat["max"], (call, lat)
        assert report["errors"][call] == 0, (call, report["errors"])
        if call != "hints":   # an agent's hints may be refused: its job was cancelled or restarted since
            assert report["refused"][call] == 0, (call, report["refused"])
    assert report["latency_ms"]["all"]["n"] == sum(report["latency_ms"][c]["n"] for c in CALLS)
    assert sum(v["n"] for v in report["latency_during_rounds_ms"].values()) >= 1
    assert report["submitted"] >= 1 and report["cancelled"] >= 1 and report["hints_sent"] >= 1
    assert report["jobs_at_end"] == 400 + report["submitted"]
    # the store on disk and the service's memory
    store = report["store"]
    assert store["bytes"]["jobs.db"] > 0 and store["mib"] > 0
    assert store["rows"]["jobs"] == report["jobs_at_end"]
    assert store["rows"]["rounds"] >= report["rounds"]
    rss = report["service_rss_mib"]
    assert 30 < rss["sampled_p50"] <= rss["sampled_max"] <= rss["peak"] < 4096, rss
    assert set(report["targets_met"]) == {"round", "api"}
    assert all(isinstance(v, bool) for v in report["targets_met"].values())
    assert "measuring for" in err
