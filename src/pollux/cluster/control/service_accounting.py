"""Attained service: the GPU time each running group held, credited to its job in the store.

The policies read a job's attained service (GPU-seconds held so far: Tiresias's and Pollux's
priority, the fairness of every round), so the control loop credits it before every round, and when
a group is asked to stop. Not every tick: the store is not written twice a second per running job.
Before a round every running group is credited in *one* transaction
(:meth:`~pollux.cluster.state.job_table.JobTable.add_services`): one per job — a thousand a round at
size — held the store's lock a thousand times in a row, and the API's calls queued behind them
(``benchmarks/service_scale.py``, ``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Iterable

from pollux.cluster.control.records import Group


def unaccounted(group: Group, now: float) -> float:
    """The GPU-seconds ``group`` held since it was last credited (0 for a cleanup group), from now
    on counted as credited: the caller adds them to the job's service."""
    start = group.accounted if group.accounted is not None else group.started
    group.accounted = max(now, start)
    if now > start and not group.cleanup:
        return (now - start) * sum(group.placement.values())
    return 0.0


def held_before_round(groups: Iterable[Group], now: float) -> dict[str, float]:
    """Per job, what its group held since last credited, for the groups not stopping (a stopping
    group was credited when asked to stop); only jobs with something to add."""
    held = {g.job_id: unaccounted(g, now) for g in groups if not g.stopping}
    return {job_id: seconds for job_id, seconds in held.items() if seconds > 0}
