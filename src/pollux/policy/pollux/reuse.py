"""When a Pollux round may keep the last decision without searching again (issue 38).

A round's search depends on the jobs (their ids and priority order, pinned rows, replica limits), their
speedup tables, the cluster, the current allocation and the jobs' re-allocation penalties. Between two
rounds of a steady cluster only the penalties move: they depend on each job's age, which grows by a
round's length. On workload-6 a quarter of the rounds (235 of 991, mostly with one to seven jobs in the
tail of the run) saw nothing else change since the round before, and in every one of them the full
search chose the allocation already running; it cost about 40 ms a round to find that out.

So a round may keep the current allocation when two things hold:

* its :func:`inputs_digest` equals the one the last search stored for the allocation it chose: the
  same jobs in the same order with the same tables and limits, on the same cluster, and that choice is
  the allocation now running;
* no job's penalty factor has moved more than a tolerance since that search. The factor
  ``(T − R·δ)/(T + δ)`` only rises with age, so moves grow cheaper; a job an hour old gains about 4e-4 a
  60 s round, one five hours old 2e-5. The tolerance bounds how stale the decision may grow.

Whatever else changes (a job arrives or ends, a model is refitted, the statistics or the fair share
move, the allocation was not applied, the priority order changes) makes the next round search again.
The digest and the penalties at the search travel in the policy state, so a service that restarts, or
builds a new policy each round, decides as the simulator does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from pollux.policy.base import PolicyState
from pollux.policy.pollux.problem import PolluxProblem

#: Key of the reuse record in the policy state.
STATE_KEY = "reuse"


def inputs_digest(prob: PolluxProblem, matrix: np.ndarray) -> str:
    """A digest of everything the search reads but the penalties, with ``matrix`` as the current
    allocation: the jobs in priority order, pinned rows, replica limits, speedup tables (scaled by
    the fair share), the nodes and their capacity, and the objective's options.

    SHA-256 over the arrays' own buffers (no copies): at 4,096 GPUs and 1,000 jobs the tables are 7 MB,
    and a round takes two digests (this one and the :func:`record` of its choice). The allocation
    goes in by its non-zero cells: as a dense matrix it would be 8 MB more."""
    h = hashlib.sha256()
    h.update("\0".join(prob.job_ids).encode())
    h.update(b"\1")
    h.update("\0".join(prob.cluster.nodes).encode())
    h.update(np.array([prob.p, prob.max_nodes, prob.interference], dtype=np.float64).data)
    for arr in (prob.cap, prob.pinned, prob.min_replicas, prob.max_replicas, prob.movable):
        h.update(np.ascontiguousarray(arr).data)
    h.update(np.ascontiguousarray(prob.tables.table, dtype=np.float64).data)
    # The allocation by its non-zero cells (its shape is fixed by the jobs and nodes above).
    flat = np.asarray(matrix, dtype=np.int64).reshape(-1)
    cells = np.flatnonzero(flat)
    h.update(cells.data)
    h.update(np.ascontiguousarray(flat[cells]).data)
    return h.hexdigest()


def record(prob: PolluxProblem, chosen: np.ndarray) -> dict[str, Any]:
    """The reuse record a search stores: the digest of the round it expects next (the same inputs,
    ``chosen`` running) and the penalty factors it decided with."""
    return {"digest": inputs_digest(prob, chosen), "penalty": prob.pen.tolist()}


def may_reuse(prob: PolluxProblem, state: PolicyState | None, drift: float) -> bool:
    """Whether this round may keep the current allocation (see the module docstring)."""
    if not isinstance(state, dict):
        return False
    saved = state.get(STATE_KEY)
    if not isinstance(saved, dict):
        return False
    digest, penalty = saved.get("digest"), saved.get("penalty")
    if not isinstance(digest, str) or not isinstance(penalty, list) or len(penalty) != prob.num_jobs:
        return False
    try:
        then = np.asarray(penalty, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if not np.all(np.isfinite(then)) or float(np.max(np.abs(prob.pen - then), initial=0.0)) > drift:
        return False
    return digest == inputs_digest(prob, prob.cur) and prob.feasible(prob.cur)
