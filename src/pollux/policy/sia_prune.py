"""Which columns of Sia's program an optimum can do without, dropped before the solve (issue 38).

When many more jobs wait than there are GPUs (2,000 jobs submitted within 8 hours to 64 GPUs: ~900
jobs in a round's program, ~6,000 configurations), HiGHS spent most of a simulation's time sorting
through jobs that cannot all run. Most of those columns are provably unnecessary:

Take a configuration c = (GPU type t, count n) and F, the free GPUs over all types. In any feasible
choice, a job on c holds n GPUs, so at most F − n *other* jobs hold any. Rank the jobs offering c by
their coefficient in the objective (cost minus idle cost: lower is better; ties by job index). If a
job j below the first F − n + 1 of that ranking runs on c, at least one of those first F − n + 1 is
idle; giving c to it instead of j keeps every constraint (same type, same count, and its
one-configuration row was empty) and does not raise the objective. Each such move lowers the sum of
the ranks of the used columns, so repeating it ends, at an optimal choice that uses only the first
F − n + 1 jobs of every configuration. Dropping the other columns therefore leaves the optimal value
as it was. (With room for every job, F − n + 1 is at least the number of jobs and nothing is dropped.)

What it does not keep is *which* optimum the solver returns when several choices are optimal, or
within the relative gap of each other: there the reduced program may be answered with another of them.
Measured on the 960-job and 2,000-job Philly runs (``docs/benchmarks.md``).
"""

from __future__ import annotations

import numpy as np


def needed_columns(config_type: np.ndarray, config_count: np.ndarray, job: np.ndarray,
                   coefficient: np.ndarray, free_gpus: int) -> np.ndarray:
    """Indices (ascending) of the columns an optimum needs: per configuration (type, count) the
    ``free_gpus − count + 1`` best by ``coefficient`` (ties: the lower ``job`` first)."""
    size = int(coefficient.size)
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    count = config_count.astype(np.int64)
    key = config_type.astype(np.int64) * (int(count.max()) + 1) + count
    order = np.lexsort((job, coefficient, key))
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, size]))
    rank = np.empty(size, dtype=np.int64)
    rank[order] = np.arange(size) - group_start
    return np.flatnonzero(rank < int(free_gpus) - count + 1)
