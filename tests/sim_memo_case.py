"""Test-only: the small simulation the memo tests run twice, with a memo and without it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pollux.sim.engine import SimConfig
from pollux.sim.profiles import AppProfile, load_profiles
from pollux.sim.workload import WorkloadJob

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux-osdi21"


@dataclass(frozen=True)
class MemoCase:
    profiles: dict[str, AppProfile]
    jobs: list[WorkloadJob]
    config: SimConfig


def memo_case() -> MemoCase:
    """Eight cifar10 and ncf jobs arriving in pairs on 2 × 4 GPUs, bootstrapped: jobs of one
    application ask the same fits and batch choices, so a memo hits."""
    profiles = load_profiles(SHARED / "traces", apps=["cifar10", "ncf"])
    jobs = [WorkloadJob(f"j{i}", 60.0 * (i // 2), "cifar10" if i % 3 else "ncf", 1,
                        128 if i % 3 else 256) for i in range(8)]
    return MemoCase(profiles, jobs, SimConfig(num_nodes=2, gpus_per_node=4, bootstrap_s=60.0))
