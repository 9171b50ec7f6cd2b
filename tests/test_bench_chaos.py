"""The chaos leg (``benchmarks/chaos.py``) at its ``--quick`` size, and its examples checker.

The quick run: a real server (embedded Ray host, 2 virtual nodes x 2 GPU slots, the service
process), 12 short training jobs submitted in bursts with a cancel burst after each, and the service
SIGKILLed 3 times and restarted: no job lost, none run twice, every job final, each job's examples
seen exactly once per finished epoch. About 50 s on 2 cores. The benchmark runs as a subprocess
(this process never joins Ray); if it overruns, it gets SIGTERM, on which it stops its server
before exiting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load_script, run_benchmark

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "chaos.py"
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def load_bench():
    return load_script(BENCH, "chaos_bench", with_siblings=True)


def test_chaos_quick_loses_no_job_and_runs_none_twice():
    pytest.importorskip("ray")
    code, out, err = run_benchmark(BENCH, "--quick", "--json", timeout_s=240, cleanup_s=150, env=RAY_ENV)
    report = json.loads(out)
    if code != 0 and "server_start_s" not in report:
        pytest.skip(f"the server (embedded Ray) could not start here: {report.get('error')}")
    assert code == 0, err[-4000:]
    assert report["quick"] and report["cores"] and "commit" in report and report["wall_s"] > 0
    kills = report["kills"]
    assert kills["done"] == 3 and kills["not_recovered"] == 0, kills
    assert len(kills["per_kill"]) == 3
    for k in kills["per_kill"]:
        assert 0 < k["api_s"] <= k["recovery_s"], k
        assert k["new_pid"] != k["killed_pid"]
        assert k["adopted"] is not None and k["orphans_stopped"] is not None, k
    assert kills["recovery_s"]["p99"] >= kills["recovery_s"]["p50"] > 0
    jobs = report["jobs"]
    assert jobs["submitted"] == 12 and not jobs["not_submitted"], jobs
    assert sum(jobs["final_states"].values()) == 12, jobs
    assert set(jobs["final_states"]) <= {"succeeded", "cancelled", "failed"}
    assert jobs["cancels"]["sent"] >= 1, jobs["cancels"]
    assert report["lost"] == 0, report["lost_detail"]
    assert report["every_job_final"]
    assert report["run_twice"] == 0, report["run_twice_detail"]
    ex = report["examples"]
    assert ex["epochs_complete"] == ex["epochs_exact"] and ex["examples_redone_after_graceful_stop"] == 0, ex
    assert report["service_log"]["lives"] == 4 and report["service_log"]["tracebacks"] == 0
    assert report["left_alive_after_stop"] == 0
    assert set(report["targets"]) == {"kills", "lost", "run_twice", "recovery_p99_s"}
    assert "kill 3/3" in err and "stopping the service" in err


def _steps(epoch: int, first: int, last: int, order: list[int]) -> list[dict]:
    """Data lines of steps ``first..last`` (inclusive) of ``epoch``: 4 examples a step, 8 a pass."""
    return [{"e": epoch, "p": 8 * epoch + 4 * s, "i": order[4 * s:4 * s + 4]} for s in range(first, last + 1)]


def test_examples_checker_rolls_back_to_the_resume_point_and_finds_repeats_and_gaps():
    bench = load_bench()
    order = [3, 1, 7, 5, 0, 2, 6, 4]
    start = [{"start": 0, "epoch": 0}]
    # run 0: epoch 0 and the first step of epoch 1, then SIGKILLed; run 1 resumed at the end of
    # epoch 0 (its checkpoint), so the first step of epoch 1 is done twice but counted once
    runs = {0: {0: start + _steps(0, 0, 1, order) + _steps(1, 0, 0, order)},
            1: {0: [{"start": 8, "epoch": 1}, *_steps(1, 0, 1, order)]}}
    ok = bench.check_examples(runs, {0: False, 1: True}, 2, 8, True)
    assert ok["epochs_complete"] == ok["epochs_exact"] == 2 and not ok["duplicated_epochs"]
    assert ok["examples_redone_after_kill"] == 4 and ok["examples_redone_after_graceful_stop"] == 0
    # the same, but run 0 ended gracefully (143): it checkpointed, so work redone is a repeat
    bad = bench.check_examples(runs, {0: True, 1: True}, 2, 8, True)
    assert bad["examples_redone_after_graceful_stop"] == 4
    # a run that resumed past where its predecessor stopped: examples missing in epoch 1
    gap = {0: {0: start + _steps(0, 0, 1, order)},
           1: {0: [{"start": 12, "epoch": 1}, *_steps(1, 1, 1, order)]}}
    assert bench.check_examples(gap, {0: True, 1: True}, 2, 8, True)["missing_epochs"] == [1]
    # a second run from the same start while the first ended gracefully: a repeat
    again = {0: {0: start + _steps(0, 0, 1, order)}, 1: {0: start + _steps(0, 0, 1, order)}}
    res = bench.check_examples(again, {0: True, 1: True}, 1, 8, True)
    assert res["examples_redone_after_graceful_stop"] == 8
    # a run's lines without its header (torn) undo nothing: epoch 0 seen twice
    torn = {0: {0: start + _steps(0, 0, 1, order)}, 1: {0: _steps(0, 0, 1, order)}}
    assert bench.check_examples(torn, {0: True}, 1, 8, True)["duplicated_epochs"] == [0]
    # a cancelled job: only the epochs before its last are finished; the last may be partial
    part = {0: {0: start + _steps(0, 0, 1, order) + _steps(1, 0, 0, order)}}
    res = bench.check_examples(part, {0: True}, 3, 8, False)
    assert res["epochs_complete"] == res["epochs_exact"] == 1 and not res["missing_epochs"]
    # two replicas: each rank holds half of every step; together they make the pass
    two = {0: {0: [*start, {"e": 0, "p": 0, "i": order[0:2]}, {"e": 0, "p": 4, "i": order[4:6]}],
               1: [*start, {"e": 0, "p": 0, "i": order[2:4]}, {"e": 0, "p": 4, "i": order[6:8]}]}}
    assert bench.check_examples(two, {0: True}, 1, 8, True)["epochs_exact"] == 1
    assert bench.graceful_runs([{"restart": 0, "exit_code": 143}, {"restart": 1, "exit_code": -9},
                                {"restart": 2, "exit_code": 0}, {"restart": 2, "exit_code": None}]) == \
        {0: True, 1: False, 2: False}


def test_reason_key_and_commit_reader():
    bench = load_bench()
    assert bench.reason_key("job-1a2b3c4d5e: exited with code 3 after 12 s") == \
        bench.reason_key("job-ffffeeee00: exited with code 4 after 9 s")
    commit = bench.read_commit()
    assert commit is None or len(commit) == 40
