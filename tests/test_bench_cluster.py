"""The cluster benchmark reads the agent's first optimizer step from the ``first_step`` event of each
rank log (``pollux.contract``), not from a free-text log line."""

from __future__ import annotations

from pathlib import Path

from bench_scripts import load_script
from pollux.contract import EVENT_FIRST_STEP, format_event

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    return load_script(ROOT / "benchmarks" / "cluster.py", "bench_cluster")


def test_first_step_times_come_from_the_events_of_every_rank(tmp_path):
    bench = load_bench()
    folder = tmp_path / "job-1" / "restart-2"
    folder.mkdir(parents=True)
    (folder / "rank-0.log").write_text(
        "2026-01-01 00:00:00,000 pollux.torch INFO first optimizer step of this run done\n"
        + format_event(EVENT_FIRST_STEP, 1700000001.5, rank=0, replicas=2, restarts=2) + "\n"
        + format_event(EVENT_FIRST_STEP, 1700000009.0, rank=0, replicas=2, restarts=2) + "\n")
    assert bench.first_step_times(tmp_path, "job-1", 2, 2) == []       # rank 1 has not stepped yet
    (folder / "rank-1.log").write_text("epoch 0\nPOLLUX_EVENT {not json\n"
                                       + format_event(EVENT_FIRST_STEP, 1700000002.25, rank=1) + "\n")
    assert bench.first_step_times(tmp_path, "job-1", 2, 2) == [1700000001.5, 1700000002.25]
    (folder / "rank-2.log").write_text("2026-01-01 00:00:00,000 pollux.torch INFO first optimizer step "
                                       "of this run done\n")
    assert bench.first_step_times(tmp_path, "job-1", 2, 3) == []       # text alone never counts
