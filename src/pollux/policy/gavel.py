"""Gavel's heterogeneity-aware max-sum-throughput policy for rigid jobs, as Sia compared against it.

Gavel (Narayanan et al., OSDI'20) splits scheduling in two. A *policy* works on the fluid view: job
j spends the fraction of time ``X[j, t]`` on GPU type t, and an optimisation over these fractions
expresses the objective. A *round-based mechanism* then turns the fractions into whole allocations,
round after round, so that over time every job gets close to the fractions it was given. Sia's
comparison ran Gavel's max-sum-throughput objective on TunedJobs: every job keeps the replica count
and batch size of its workload row (``JobView.fixed``) and only the GPU type and the rounds it runs
in are chosen. This module is our reading of that, built on ``scipy.optimize.linprog`` (HiGHS).

**The throughput of a job on a type.** A rigid job on r GPUs of type t with global batch B runs
``1 / T_iter`` steps per second, where ``T_iter`` is the job's throughput model on that type
(``job.model_for(t)``) at r replicas on the fewest nodes of that type that hold them, with local batch
``ceil(B / (r·(s+1)))`` and the smallest accumulation s that keeps it within the type's local-batch
limit (as the simulator runs a fixed batch). A type missing from a non-None ``type_models`` has no
profile and cannot run the job, nor can a type with fewer GPUs than the job asks for. A job without a
model yet is equally fast on every type it may use. Throughputs are normalised per job by its best
type, so each job is worth at most 1 whatever its units (steps of a small CNN against steps of BERT).

**The program (the policy).** Maximise ``Σ_j Σ_t X[j,t]·T̂[j,t]`` over ``0 ≤ X ≤ 1`` subject to
``Σ_t X[j,t] ≤ 1`` (a job runs at most all of the time) and ``Σ_j r_j·X[j,t] ≤ G_t`` (on average a
type's GPUs are not over-subscribed), with T̂ the normalised throughput and G_t the type's GPUs not
held by pinned jobs. Gavel's own code also divides each throughput by the job's scale factor (its
replicas), which tilts the sum further towards small jobs; we keep only the per-job normalisation,
which is what makes throughputs of different models comparable at all, and let the capacity rows
charge a job for its GPUs. The LP has one variable per (job, type) pair that can run; a vertex
optimum is integral for most jobs (a job gets a type all the time or not at all), and since a small
gang buys as much objective as a large one for fewer GPUs, max-sum-throughput favours small jobs and
lets large ones wait — the unfairness Sia measured.

**Rounds (the mechanism).** The policy state keeps, per job, the seconds it has been seen and the
seconds it held GPUs of each type (counted from the allocation the caller reports back, so only
what really ran counts). The *received share* on t is ``on[j,t] / seen[j]``; the priority of (j, t)
is ``X[j,t] / share`` (infinite before the job ever ran there). Pairs with ``X > 0`` are walked in
decreasing priority (ties: larger X, the job's current type, arrival order); a job is chosen for
type t when its gang still fits that type's free GPU count, else the walk goes on (skip, not block).
The chosen jobs are then placed type by type: a running job whose type is still chosen keeps its
GPUs where they are (no restart); the others go, in priority order, onto one node of that type when
one has room (the fullest that fits, to keep large holes for large jobs), else onto as few nodes of
the type as possible, using only nodes that host no other distributed job (at most one multi-node
job per node, SPEC §5). Jobs that cannot be placed wait. Finally the GPUs left over are offered,
in the same order and then to jobs with ``X = 0`` (best normalised throughput first), so no GPU idles
while a job that fits waits — Gavel's mechanism likewise fills a round with the next jobs in
priority order; a running job offered leftovers stays where it is if its type may run it. Time
sharing has a price the fluid view does not see: a job whose fraction is split between two types,
or which shares a type with a large gang, moves or pauses from round to round, and every move is a
restart (checkpoint, relaunch) in the simulator and the service.

Running jobs that may not be preempted (``preemptible=False``) holding their whole gang keep their
GPUs before anything else and take no part in the program. The state lives under the key
``"gavel"`` (other keys, such as another policy's state, are ignored). The policy never uses ``rng``: for the
same inputs and state it returns the same allocation, whatever the order of the job list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from pollux.goodput import t_iter
from pollux.policy.base import Allocation, Cluster, JobView, PolicyState
from pollux.policy.baseline import arrivals, keep_rows, rigid_replicas, rows_allocation
from pollux.policy.placement import place_packed

__all__ = ["GavelPolicy", "GavelRound", "fixed_step_times", "max_sum_throughput", "normalised"]

#: Fractions below this are treated as zero (LP round-off).
EPS = 1e-7
#: The key of this policy's part of the state (another policy's keys are ignored).
STATE_KEY = "gavel"


@dataclass(frozen=True, slots=True)
class GavelRound:
    """The program of one round: jobs (arrival order) × GPU types.

    ``norm[j, t]`` is job j's throughput on type t over its best type's (0: cannot run there),
    ``replicas[j]`` its gang size and ``capacity[t]`` the type's GPUs the program may hand out.
    """

    ids: tuple[str, ...]
    types: tuple[str, ...]
    norm: np.ndarray
    replicas: np.ndarray
    capacity: np.ndarray


def _batch(job: JobView) -> float:
    if job.fixed is not None:
        return float(max(int(job.fixed[1]), 1))
    model = job.model
    return float(model.init_batch_size) if model is not None else 1.0


def fixed_step_times(jobs: Sequence[JobView], replicas: Sequence[int] | np.ndarray, types: Sequence[str],
                     capacity: np.ndarray, gpus_per_node: np.ndarray) -> np.ndarray:
    """Seconds per step of every job's fixed configuration on every type, shape (jobs, types).

    ``inf`` where the job cannot run (no profile for the type, or the type has fewer than its
    replicas), ``nan`` where it may run but has no model yet. One vectorised ``t_iter`` call over all
    the pairs with a model: parameters stacked as a (7, pairs) array.
    """
    out = np.full((len(jobs), len(types)), np.inf)
    params: list[tuple[float, ...]] = []
    where: list[tuple[int, int]] = []
    cfg: list[tuple[float, float, float, float, float]] = []   # nodes, r, B, max local, M0
    for j, job in enumerate(jobs):
        r = int(replicas[j])
        batch = _batch(job)
        for ti, t in enumerate(types):
            if job.type_models is not None and t not in job.type_models:
                continue
            if r > int(capacity[ti]) or gpus_per_node[ti] <= 0:
                continue
            model = job.model_for(t)
            if model is None:
                out[j, ti] = np.nan
                continue
            limits = job.limits_for(t)
            top = math.floor(float(limits.max_local) + 1e-9) if limits is not None else batch
            params.append(model.throughput_params.as_array())
            where.append((j, ti))
            cfg.append((float(-(-r // int(gpus_per_node[ti]))), float(r), batch, float(max(top, 1)),
                        float(model.init_batch_size)))
    if not where:
        return out
    p = np.asarray(params, dtype=np.float64).T
    nodes, r_arr, b_arr, top_arr, m0 = np.asarray(cfg, dtype=np.float64).T
    # The smallest accumulation that keeps the local batch within the limit; on one GPU a batch
    # above M0 accumulates at least once (the simulator's rule for a fixed batch).
    s = np.maximum(np.ceil(b_arr / (r_arr * top_arr) - 1e-9) - 1.0, 0.0)
    s = np.where((r_arr == 1.0) & (b_arr > m0 * (1.0 + 1e-9)), np.maximum(s, 1.0), s)
    m = np.ceil(b_arr / (r_arr * (s + 1.0)) - 1e-9)
    step = t_iter(p, nodes, r_arr, m, s)
    rows, cols = np.asarray(where, dtype=np.int64).T
    out[rows, cols] = np.where(np.isfinite(step) & (step > 0.0), step, np.inf)
    return out


def normalised(step: np.ndarray) -> np.ndarray:
    """Throughput over the job's best type (rows of :func:`fixed_step_times`); 0 where it cannot run.

    A job without a model is worth 1 on every type it may use.
    """
    runnable = ~np.isinf(step)
    tp = np.where(runnable & ~np.isnan(step), 1.0 / np.where(runnable & ~np.isnan(step), step, 1.0), 0.0)
    best = tp.max(axis=1, initial=0.0)
    norm = np.divide(tp, best[:, None], out=np.zeros_like(tp), where=best[:, None] > 0.0)
    return np.where(runnable & np.isnan(step), 1.0, norm)


def max_sum_throughput(norm: np.ndarray, replicas: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Gavel's max-sum-throughput fractions ``X`` (jobs × types) by linear programming (HiGHS).

    Maximise ``Σ X·norm`` with ``0 ≤ X ≤ 1``, ``Σ_t X[j,t] ≤ 1`` and ``Σ_j replicas_j·X[j,t] ≤
    capacity_t``; only pairs with ``norm > 0`` get a variable. Returns zeros if HiGHS fails (it
    should not: X = 0 is feasible and the objective is bounded).
    """
    norm = np.asarray(norm, dtype=np.float64)
    out = np.zeros_like(norm)
    jj, tt = np.nonzero(norm > 0.0)
    if jj.size == 0:
        return out
    n_jobs, n_types = norm.shape
    var = np.arange(jj.size)
    a_rows = np.concatenate([jj, n_jobs + tt])
    a_cols = np.concatenate([var, var])
    a_data = np.concatenate([np.ones(jj.size), np.asarray(replicas, dtype=np.float64)[jj]])
    a_ub = csr_matrix((a_data, (a_rows, a_cols)), shape=(n_jobs + n_types, jj.size))
    b_ub = np.concatenate([np.ones(n_jobs), np.maximum(np.asarray(capacity, dtype=np.float64), 0.0)])
    res = linprog(-norm[jj, tt], A_ub=a_ub, b_ub=b_ub, bounds=(0.0, 1.0), method="highs")
    if res.status != 0 or res.x is None:
        return out
    x = np.clip(res.x, 0.0, 1.0)
    out[jj, tt] = np.where(x < EPS, 0.0, x)
    return out


# --------------------------------------------------------------------------------------------
# State: seconds seen and seconds on each type, per job
# --------------------------------------------------------------------------------------------


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _read_state(state: Any) -> tuple[float | None, dict[str, tuple[float, dict[str, float]]]]:
    """(time of the last round, {job: (seconds seen, {type: seconds on it})}); anything malformed
    or foreign (another policy's state) is ignored."""
    part = state.get(STATE_KEY) if isinstance(state, Mapping) else None
    if not isinstance(part, Mapping):
        return None, {}
    jobs: dict[str, tuple[float, dict[str, float]]] = {}
    raw = part.get("jobs")
    for jid, rec in (raw.items() if isinstance(raw, Mapping) else ()):
        if not isinstance(rec, Mapping):
            continue
        seen = _number(rec.get("seen"))
        on = rec.get("on")
        if seen is None or not isinstance(on, Mapping):
            continue
        jobs[str(jid)] = (max(seen, 0.0), {str(t): max(v, 0.0) for t, x in on.items()
                                            if (v := _number(x)) is not None})
    return _number(part.get("now")), jobs


class GavelPolicy:
    """Max-sum-throughput over (job, GPU type) fractions by LP, applied round by round."""

    name = "gavel"

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        order, ids, cur = arrivals(jobs, cluster)
        types = cluster.type_names
        tix = cluster.type_index()
        cap_node = cluster.capacity()
        n_types = len(types)
        want = {j.id: rigid_replicas(j, cur[j.id]) for j in order}

        # The received share per type, from what each job held since the last round.
        last_now, old = _read_state(state)
        dt = max(float(now) - last_now, 0.0) if last_now is not None else 0.0
        seen: dict[str, float] = {}
        on: dict[str, dict[str, float]] = {}
        for jid in ids:
            s0, on0 = old.get(jid, (None, {}))
            mine = dict(on0)
            if s0 is not None and dt > 0.0 and cur[jid].sum() > 0:
                held = np.bincount(tix, weights=cur[jid], minlength=n_types)
                for k in map(int, np.flatnonzero(held)):
                    mine[types[k]] = mine.get(types[k], 0.0) + dt * float(held[k] / held.sum())
            seen[jid] = (s0 + dt) if s0 is not None else 0.0
            on[jid] = mine
        new_state: PolicyState = {STATE_KEY: {
            "now": float(now),
            "jobs": {jid: {"seen": seen[jid], "on": dict(sorted(on[jid].items()))} for jid in ids},
        }}
        if not order or cluster.num_nodes == 0:
            return {}, new_state

        # Pinned jobs keep their gangs first; the program shares what is left.
        free = cap_node.copy()
        pinned = [j.id for j in order
                  if not j.preemptible and int(cur[j.id].sum()) == want[j.id] > 0]
        moved = set(keep_rows(pinned, cur, free))
        rows: dict[str, np.ndarray] = {jid: cur[jid] for jid in pinned if jid not in moved}
        dist = np.zeros(cluster.num_nodes, dtype=bool)
        for row in rows.values():
            if np.count_nonzero(row) > 1:
                dist |= row > 0
        # A pinned gang that no longer fits is placed again like any job.
        todo = [j for j in order if j.id not in rows]
        free_t = np.bincount(tix, weights=free, minlength=n_types).astype(np.int64)
        gpn = np.zeros(n_types, dtype=np.int64)
        np.maximum.at(gpn, tix, cap_node)
        reps = np.asarray([want[j.id] for j in todo], dtype=np.int64)
        step = fixed_step_times(todo, reps, types, free_t, gpn)
        rnd = GavelRound(tuple(j.id for j in todo), types, normalised(step), reps, free_t)
        x = max_sum_throughput(rnd.norm, rnd.replicas, rnd.capacity)

        # Priority of every (job, type) with a fraction: X over the share received there.
        current_type: dict[str, int] = {}
        for jid in rnd.ids:
            used = np.unique(tix[cur[jid] > 0])
            if used.size == 1 and int(cur[jid].sum()) == want[jid]:
                current_type[jid] = int(used[0])
        keyed: list[tuple[float, float, bool, int, int]] = []
        for j, jid in enumerate(rnd.ids):
            for ti in map(int, np.flatnonzero(x[j] > 0.0)):
                share = on[jid].get(types[ti], 0.0) / seen[jid] if seen[jid] > 0.0 else 0.0
                prio = float(x[j, ti]) / share if share > 0.0 else math.inf
                keyed.append((-prio, -float(x[j, ti]), current_type.get(jid) != ti, j, ti))
        walk = [(j, ti) for *_, j, ti in sorted(keyed)]
        # Then the pairs without a fraction, for GPUs that would otherwise idle.
        rest = sorted((-float(rnd.norm[j, ti]), current_type.get(jid) != ti, j, ti)
                      for j, jid in enumerate(rnd.ids)
                      for ti in map(int, np.flatnonzero((rnd.norm[j] > 0.0) & (x[j] <= 0.0))))
        backfill = walk + [(j, ti) for *_, j, ti in rest]

        # Choose by GPU count per type, skip-not-block.
        left = free_t.copy()
        chosen: list[tuple[int, int]] = []
        taken: set[int] = set()
        for j, ti in walk:
            if j not in taken and reps[j] <= left[ti]:
                chosen.append((j, ti))
                taken.add(j)
                left[ti] -= reps[j]

        # Place: running chosen jobs stay where they are, then the others in priority order.
        placer = _Placer(cluster, free, dist, rows)
        for j, ti in chosen:
            if current_type.get(rnd.ids[j]) == ti:
                placer.keep(rnd.ids[j], cur[rnd.ids[j]])
        for j, ti in chosen:
            if rnd.ids[j] not in rows:
                placer.place(rnd.ids[j], int(reps[j]), types[ti])
        # Leftovers go to whoever fits next; a job running on a type it may use stays put rather
        # than restart elsewhere for a round.
        for j, ti in backfill:
            jid = rnd.ids[j]
            if jid in rows:
                continue
            here = current_type.get(jid)
            if here is not None and rnd.norm[j, here] > 0.0 and placer.keep(jid, cur[jid]):
                continue
            placer.place(jid, int(reps[j]), types[ti])
        return rows_allocation(rows, ids, cluster), new_state


class _Placer:
    """Commits rows of one round: ``free`` GPUs per node, ``dist`` nodes hosting a distributed job
    and the ``rows`` so far (all updated in place)."""

    def __init__(self, cluster: Cluster, free: np.ndarray, dist: np.ndarray,
                 rows: dict[str, np.ndarray]) -> None:
        self.cluster, self.free, self.dist, self.rows = cluster, free, dist, rows
        self.of_type = {t: cluster.nodes_of_type(t) for t in cluster.type_names}

    def keep(self, jid: str, row: np.ndarray) -> bool:
        """Keep a running job's row where it is, if it still fits (a distributed row only on nodes
        without another distributed job)."""
        spans = bool(np.count_nonzero(row) > 1)
        if not np.all(row <= self.free) or (spans and bool(np.any(self.dist[row > 0]))):
            return False
        self._commit(jid, row, spans)
        return True

    def place(self, jid: str, replicas: int, gpu_type: str) -> bool:
        """Place a gang on nodes of ``gpu_type`` (:func:`place_on_type`); False if it does not fit."""
        nodes = self.of_type[gpu_type]
        if replicas > int(self.free[nodes].sum()):
            return False
        row = place_on_type(replicas, nodes, self.free, self.dist)
        if row is None:
            return False
        self._commit(jid, row, bool(np.count_nonzero(row) > 1))
        return True

    def _commit(self, jid: str, row: np.ndarray, spans: bool) -> None:
        self.free -= row
        self.rows[jid] = row
        if spans:
            self.dist[row > 0] = True


def place_on_type(replicas: int, nodes: np.ndarray, free: np.ndarray, dist: np.ndarray) -> np.ndarray | None:
    """A gang of ``replicas`` on the given nodes (one GPU type), or None if it does not fit.

    One node when one has room (the one with the fewest free GPUs that still fits, lowest index on
    ties); otherwise as few nodes as possible among those hosting no distributed job (largest free
    first). ``free`` and ``dist`` are read, not changed.
    """
    row = np.zeros_like(free)
    if nodes.size == 0 or replicas <= 0:
        return None
    f = free[nodes]
    fits = np.flatnonzero(f >= replicas)
    if fits.size:
        row[nodes[fits[np.argmin(f[fits])]]] = replicas
        return row
    packed = place_packed(replicas, np.where(dist[nodes], 0, f))
    if packed is None:
        return None
    row[nodes] = packed
    return row
