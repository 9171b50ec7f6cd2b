"""Tiresias: discretised 2D-LAS (optionally 2D-Gittins) for rigid, gang-scheduled jobs (SPEC §6).

Each job asks for ``job.fixed = (replicas, batch)`` and runs on exactly ``replicas`` GPUs or not at
all. Priority comes from the job's attained service (GPU-seconds, ``job.attained_service``, which the
caller counts only while the job runs):

* K priority queues (default K = 2) split by attained-service thresholds (default 16 GPU-hours, the
  Pollux comparison; the Tiresias testbed used 3200 GPU-s). With K > 2 and a single threshold the
  thresholds double per queue (1×, 2×, 4×, … as in the paper's sensitivity study), or pass a sequence.
* New jobs enter queue 1, which is ordered by arrival ``(submit_time, id)``; a job whose attained
  service crosses its queue's upper threshold is demoted, and lower queues keep the order in which jobs
  were demoted (recorded in the policy state; jobs demoted in the same round keep their previous
  relative order). This is the reference behaviour behind the published comparison, a deliberate
  deviation from the paper's "FIFO by first start time".
* Every round walks queue 1, then queue 2, … over the *total* GPU count of the cluster: a job whose
  replicas fit in the GPUs not yet claimed is marked running; one that does not fit is pending (and loses
  its GPUs if it had any: preemption) and the walk continues (skip, do not block).
* Running jobs keep their placement; newly started jobs are then placed, in walk order, on what the
  preempted jobs released — packed onto as few nodes as possible by default (repeatedly the node with
  the most free GPUs gives all it can), or one GPU at a time from the most-free node with
  ``placement="spread"``. The walk's count guarantees that they fit.
* Running non-preemptible jobs (``preemptible=False``) are pinned: they keep their GPUs before the walk
  (unless they no longer hold their full gang, e.g. a node vanished; then they queue like any job).

Options:

* ``gittins=True`` — 2D-Gittins: queues other than the last are ordered by the Gittins index of the job
  over the empirical distribution of GPU-time (service) of completed jobs; the last queue stays in
  demotion order (its quantum is infinite). A policy only sees current jobs, so a job that disappears
  from the job list between rounds is recorded as completed with the attained service last seen (at most
  one round's service short). With no samples yet, queues fall back to the LAS order above.
* ``promote_knob`` — starvation prevention (off by default): a pending job in a lower queue whose waiting
  time since its last promotion (time since submission minus executed time) reaches ``promote_knob``
  times its executed time (attained service / replicas) is promoted to queue 1; its executed and waiting
  times restart from zero (kept as offsets in the state) so it is not demoted again at once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, PolicyState
from pollux.policy.baseline import (
    Baseline,
    arrivals,
    rigid_replicas,
    rows_allocation,
    settle,
)

DEFAULT_THRESHOLD_GPU_S = 16 * 3600.0
MAX_SAMPLES = 10_000


def gittins_index(samples: np.ndarray, attained: float, quantum: float) -> float:
    """Gittins index of a job with ``attained`` service and service quantum ``quantum``.

    ``P(S − a ≤ Δ | S > a) / E[min(S − a, Δ) | S > a]`` over the empirical distribution ``samples`` of
    total service S (Tiresias, Pseudocode 1, with the discretised quantum Δ). 0 when no sample exceeds
    ``attained`` (the job has outlived every job seen so far); +inf for a vanishing quantum.
    """
    if quantum <= 0.0:
        return math.inf
    left = samples[samples > attained] - attained
    if left.size == 0:
        return 0.0
    p_done = float(np.mean(left <= quantum))
    expected = float(np.mean(np.minimum(left, quantum)))
    return p_done / expected if expected > 0.0 else math.inf


class TiresiasPolicy(Baseline):
    """Discretised 2D-LAS / 2D-Gittins with K queues and skip-not-block gang scheduling."""

    name = "tiresias"

    def __init__(
        self,
        threshold_gpu_s: float | Sequence[float] = DEFAULT_THRESHOLD_GPU_S,
        num_queues: int = 2,
        gittins: bool = False,
        promote_knob: float | None = None,
        placement: str = "packed",
    ) -> None:
        if num_queues < 1:
            raise ValueError(f"num_queues: must be >= 1, got {num_queues}")
        if isinstance(threshold_gpu_s, int | float):
            thresholds = [float(threshold_gpu_s) * 2.0**i for i in range(num_queues - 1)]
        else:
            thresholds = [float(t) for t in threshold_gpu_s]
            if len(thresholds) != num_queues - 1:
                raise ValueError(f"threshold_gpu_s: {len(thresholds)} thresholds for {num_queues} queues "
                                 f"(need {num_queues - 1})")
        if any(t <= 0 for t in thresholds) or any(b <= a for a, b in itertools.pairwise(thresholds)):
            raise ValueError(f"threshold_gpu_s: thresholds must be positive and increasing, got {thresholds}")
        if promote_knob is not None and not promote_knob > 0:
            raise ValueError(f"promote_knob: must be > 0 or None, got {promote_knob}")
        self.thresholds = tuple(thresholds)
        self.num_queues = int(num_queues)
        self.gittins = bool(gittins)
        self.promote_knob = None if promote_knob is None or math.isinf(promote_knob) else float(promote_knob)
        super().__init__(placement)

    # ----------------------------------------------------------------------------------------

    def _level(self, service: float) -> int:
        """Queue index (0-based) a job with this (effective) attained service belongs to."""
        return sum(1 for t in self.thresholds if service >= t)

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        state = state or {}
        k = self.num_queues
        order, ids, cur = arrivals(jobs, cluster)
        alive = set(ids)
        by_id = {j.id: j for j in order}
        want = {j.id: rigid_replicas(j, cur[j.id]) for j in order}

        # Lower queues (2..K) in demotion order; jobs that left are forgotten.
        old_queues = [list(q) for q in state.get("queues", [])]
        queues: list[list[str]] = [[] for _ in range(k - 1)]
        for i, q in enumerate(old_queues[: k - 1]):
            queues[i] = [jid for jid in q if jid in alive]
        for q in old_queues[k - 1:]:  # fewer queues than the state had: merge into the last
            if queues:
                queues[-1].extend(jid for jid in q if jid in alive)
        offsets = {jid: (float(v[0]), float(v[1]))
                   for jid, v in state.get("offsets", {}).items() if jid in alive}

        # Completed-job samples for 2D-Gittins: jobs seen last round and gone now.
        samples = [float(x) for x in state.get("samples", [])]
        last_service = state.get("service", {})
        for jid in sorted(last_service):
            if jid not in alive:
                samples.append(float(last_service[jid]))
        samples = samples[-MAX_SAMPLES:]
        service = {j.id: float(j.attained_service) for j in order}

        def effective(jid: str) -> float:
            return service[jid] - offsets.get(jid, (0.0, 0.0))[1]

        level = {jid: 0 for jid in ids}
        for i, q in enumerate(queues):
            for jid in q:
                level[jid] = i + 1

        # Demotion: walk current queue order so simultaneous demotions keep their relative order.
        if k > 1:
            walk = [jid for jid in ids if level[jid] == 0] + [jid for q in queues for jid in q]
            for jid in walk:
                target = max(self._level(effective(jid)), level[jid])
                if target != level[jid]:
                    if level[jid] > 0:
                        queues[level[jid] - 1].remove(jid)
                    queues[target - 1].append(jid)
                    level[jid] = target

        # Starvation prevention: promote long-waiting pending jobs of lower queues back to queue 1.
        if self.promote_knob is not None:
            for jid in ids:
                if level[jid] == 0 or cur[jid].sum() > 0:
                    continue
                job = by_id[jid]
                age0 = offsets.get(jid, (0.0, 0.0))[0]
                executed = max(effective(jid), 0.0) / want[jid]
                waiting = max(float(now) - float(job.submit_time) - age0, 0.0) - executed
                if waiting >= self.promote_knob * executed:
                    queues[level[jid] - 1].remove(jid)
                    level[jid] = 0
                    offsets[jid] = (max(float(now) - float(job.submit_time), 0.0), service[jid])

        # Priority order: queue 1 by arrival (or Gittins), lower queues by demotion (Gittins except last).
        sample_arr = np.sort(np.asarray(samples, dtype=np.float64))
        use_gittins = self.gittins and sample_arr.size > 0

        def ranked(members: list[str], qi: int) -> list[str]:
            if not use_gittins or qi == k - 1:
                return members
            hi = self.thresholds[qi]
            g = {jid: gittins_index(sample_arr, service[jid], hi - effective(jid)) for jid in members}
            return [jid for _, jid in sorted(((-g[jid], p), jid) for p, jid in enumerate(members))]

        priority = ranked([jid for jid in ids if level[jid] == 0], 0)
        for i, q in enumerate(queues):
            priority += ranked(q, i + 1)

        # Pinned: running jobs that may not be preempted keep their GPUs whatever their priority.
        pinned = [jid for jid in priority
                  if int(cur[jid].sum()) == want[jid] and not by_id[jid].preemptible]
        free_count = cluster.total_gpus - sum(int(cur[jid].sum()) for jid in pinned)
        pinned_set = set(pinned)
        chosen = []
        for jid in priority:
            if jid in pinned_set:
                continue
            if want[jid] <= free_count:
                chosen.append(jid)
                free_count -= want[jid]

        # Placement: pinned rows, then running chosen jobs keep theirs, then new starts in walk order.
        rows = settle(cur, cluster.capacity().copy(), pinned, want, chosen, chosen, self.placement)
        new_state: PolicyState = {
            "queues": queues,
            "offsets": {jid: [a, s] for jid, (a, s) in sorted(offsets.items())},
            "samples": samples if self.gittins else [],
            "service": service if self.gittins else {},
        }
        return rows_allocation(rows, ids, cluster), new_state
