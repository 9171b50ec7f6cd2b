"""``benchmarks/policy.py``'s greedy baseline, run in-process on small random rounds.

The whole benchmark takes about 30 s even with ``--quick`` (its 4,096-GPU scenario), too long for
the suite; its baseline once broke silently when the problem's API moved. This runs the baseline
itself, cheaply: it must end feasible, no less fit than where it started, and give out GPUs where
some are free and a waiting job could take them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from policy_oracles import random_mixed_round
from pollux.policy.base import Cluster, with_allocation
from pollux.policy.pollux import PolluxPolicy

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def policy_bench():
    sys.path.insert(0, str(BENCH))           # the script imports its neighbour trace_rows
    try:
        spec = importlib.util.spec_from_file_location("policy_bench", BENCH / "policy.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("seed", range(4))
def test_greedy_baseline_ends_feasible_and_no_less_fit(seed: int) -> None:
    bench = policy_bench()
    cluster = Cluster.uniform(4 if seed % 2 else 8, 4)
    jobs, alloc = random_mixed_round(np.random.default_rng(seed), cluster, 12)
    prob = PolluxPolicy().problem(with_allocation(jobs, alloc), cluster)
    for start in (prob.cur, np.where(prob.pinned[:, None], prob.cur, 0)):
        out = bench.greedy_baseline(prob, start)
        assert prob.feasible(out)
        assert prob.fitness(out) >= prob.fitness(prob.repair_one(start))
    empty = bench.greedy_baseline(prob, np.zeros_like(prob.cur))
    assert empty.sum() > 0                   # free GPUs and jobs that can take one
