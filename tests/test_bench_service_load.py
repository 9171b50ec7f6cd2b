"""The service load benchmark (``benchmarks/service_load.py``) at a tiny size, so that it keeps working.

Six jobs on a real server (embedded Ray host, 2 virtual nodes x 4 GPU slots, the service process),
submitted, described and cancelled from three threads: every job must end cancelled, none lost or
duplicated, every replica process (and its child) gone after its cancel, and nothing left alive once
the server has stopped. About 25 s on 2 cores. The benchmark runs as a subprocess; if it overruns, it
gets SIGTERM, on which it stops its server before exiting. Its 8 slots are 2 nodes of 4 rather than
the full run's 4 of 2: the same slots for the six jobs, replicas still on more than one node, and
the Ray host starts about 3 s sooner with two fewer virtual nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load_script, run_benchmark

pytest.importorskip("ray")

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "service_load.py"


def run_bench(*args: str, timeout_s: float) -> tuple[int, str, str]:
    return run_benchmark(BENCH, *args, timeout_s=timeout_s, cleanup_s=150)


def test_service_load_benchmark_at_six_jobs():
    code, out, err = run_bench("--json", "--jobs", "6", "--threads", "3", "--nodes", "2",
                               "--gpus-per-node", "4", "--quiet", "2", "--timeout", "90", timeout_s=300)
    assert code == 0, err[-4000:]
    report = json.loads(out)
    assert report["jobs"] == 6 and report["cores"] and "commit" in report
    for call in ("submit", "ls", "describe", "cancel"):
        assert report["latency_ms"][call]["n"] >= 1, call
        assert report["latency_ms"][call]["p99"] >= report["latency_ms"][call]["p50"] > 0, call
    assert report["errors"] == {"submit": 0, "ls": 0, "describe": 0, "cancel": 0}, err[-4000:]
    assert report["running_before_cancel"] == 6, err[-4000:]
    gone = report["cancel_to_gone_s"]
    assert gone["jobs"] >= 6 and gone["running_at_cancel"] == 6, gone
    assert gone["not_gone"] == 0 and gone["max"] < 30.0, gone
    assert report["lost"] == 0, report["lost_detail"]
    assert report["duplicated"] == 0, report["duplicated_detail"]
    assert report["replica_runs"]["unrecorded"] == 0, report["replica_runs"]
    assert report["left_alive_after_stop"] == 0
    assert "replica process(es) alive" in err and "stopping the service" in err


def load_bench_module():
    return load_script(BENCH, "service_load_bench")


def test_duplicate_runs_are_found_in_proc_records_and_in_the_store(tmp_path):
    """The checker itself: sequential runs pass; a rank run twice or two overlapping runs do not."""
    bench = load_bench_module()
    watcher = bench.Watcher(tmp_path)

    def proc(job, restart, rank, pid, start, end):
        watcher.procs[pid] = bench.Proc(job, restart, rank, pid, "main", start, "file", end=end)

    proc("ok", 0, 0, 101, 0.0, 10.0)
    proc("ok", 1, 0, 102, 10.05, 20.0)       # starts within one poll of its predecessor's end: fine
    proc("ok", 1, 1, 103, 10.1, 20.0)
    proc("twice", 0, 0, 201, 0.0, 5.0)
    proc("twice", 0, 0, 202, 6.0, 9.0)       # a second process for one (restart, rank)
    proc("overlap", 0, 0, 301, 0.0, 10.0)
    proc("overlap", 1, 0, 302, 5.0, None)    # a new run while the old one still lives
    store = {"ok": [{"restart": 0, "rank": 0, "pid": 101, "start_time": 0.0, "end_time": 10.0},
                    {"restart": 1, "rank": 0, "pid": 102, "start_time": 10.5, "end_time": 20.0},
                    {"restart": 2, "rank": 0, "pid": None, "start_time": 1.0, "end_time": None}],
             "stored": [{"restart": 0, "rank": 0, "pid": 401, "start_time": 0.0, "end_time": None},
                        {"restart": 1, "rank": 0, "pid": 402, "start_time": 3.0, "end_time": 4.0}]}
    found = bench.duplicated_runs(watcher, store)
    assert found == {"same_rank_twice": ["twice"], "overlapping_runs_proc": ["overlap"],
                     "overlapping_runs_store": ["stored"]}
