"""Sia's memo of each job's configuration-table rows across rounds (pollux.policy.sia_job_rows).

The memo must not change the table, bit for bit, in any round: tables built with it over a sequence
of changing rounds (jobs arriving and leaving, models refitted, allocations moved, restarts, free GPUs
changing, limits changing) are compared array by array with tables built from scratch. A second test
checks that capping the free GPUs in the key (``candidate_bound``) changes no row either.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from policy_oracles import random_model
from pollux.goodput import BatchLimits, GoodputModel
from pollux.goodput.records import GradStats
from pollux.policy import sia_configs
from pollux.policy.base import Cluster, JobView, fixed_shape
from pollux.policy.clusterspec import parse_cluster
from pollux.policy.sia import SiaPolicy
from pollux.policy.sia_configs import ConfigTable, build_configs
from pollux.policy.sia_goodput import GoodputCache
from pollux.policy.sia_job_rows import RowMemo

CLUSTER = parse_cluster("aws:3x4,rtx:2x8,dgx-ext:1x8")
ROUNDS = 30


@dataclass
class SimJob:
    """A job's evolving state in the synthetic rounds (a view is rebuilt from it every round)."""

    id: str
    model: GoodputModel | None
    limits: BatchLimits | None
    speeds: dict[str, float]
    submit: float
    allocation: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    seen: int = 0
    min_replicas: int = 0
    max_replicas: int = 64
    fixed: int = 1

    def view(self, now: float) -> JobView:
        """Fresh model objects every round (equal by value, as the simulator builds them)."""
        models = None
        limits = None
        if self.model is not None:
            models = {t: _on_type(self.model, s) for t, s in self.speeds.items()}
            limits = {t: self.limits for t in self.speeds if self.limits is not None}
        return JobView(id=self.id, submit_time=self.submit, age_s=now - self.submit, restarts=self.restarts,
                       allocation=dict(self.allocation), min_replicas=self.min_replicas,
                       max_replicas=self.max_replicas, model=self.model, limits=self.limits,
                       max_replicas_seen=self.seen, fixed=fixed_shape(self.fixed, 256),
                       type_models=models, type_limits=limits)


def _on_type(model: GoodputModel, speed: float) -> GoodputModel:
    p = model.throughput_params
    return replace(model, throughput_params=replace(p, alpha_grad=p.alpha_grad / speed,
                                                    beta_grad=p.beta_grad / speed))


def _new_job(rng: np.random.Generator, i: int, now: float) -> SimJob:
    model, limits = random_model(rng)
    types = [t for t in CLUSTER.type_names if rng.random() < 0.8] or [CLUSTER.type_names[0]]
    no_model = rng.random() < 0.2
    job = SimJob(id=f"j{i}", model=None if no_model else model, limits=None if no_model else limits,
                 speeds={t: float(rng.choice([0.5, 1.0, 2.0])) for t in types}, submit=now,
                 fixed=int(rng.choice([1, 2, 4])), max_replicas=int(rng.choice([4, 8, 64])))
    if rng.random() < 0.15:
        job.min_replicas = job.max_replicas = int(rng.choice([1, 2, 4]))
    return job


def _move(rng: np.random.Generator, job: SimJob) -> None:
    """Give the job a new allocation on one type (or none): a restart when it held GPUs."""
    if job.allocation:
        job.restarts += 1
    job.allocation = {}
    if rng.random() < 0.3:
        return
    nodes = CLUSTER.nodes_of_type(str(rng.choice(sorted(job.speeds))))
    want = int(rng.choice([1, 2, 4, 8, 12]))
    for n in rng.permutation(nodes):
        take = min(want, CLUSTER.gpus[int(n)])
        job.allocation[CLUSTER.nodes[int(n)]] = take
        want -= take
        if want == 0:
            break
    job.seen = max(job.seen, sum(job.allocation.values()))


def _evolve(rng: np.random.Generator, jobs: list[SimJob], round_no: int, now: float) -> None:
    """One round's changes: arrivals, departures, refits, moves, limits; most jobs unchanged."""
    for k in range(int(rng.integers(0, 4))):
        jobs.append(_new_job(rng, 1000 * round_no + k, now))
    for job in list(jobs):
        u = rng.random()
        if u < 0.05:
            jobs.remove(job)
        elif u < 0.12 and job.model is not None:
            stats = job.model.grad_stats
            job.model = replace(job.model, grad_stats=GradStats(stats.sqr * 1.5, stats.var))
        elif u < 0.2:
            _move(rng, job)
        elif u < 0.23:
            job.seen += 1
        elif u < 0.25 and job.limits is not None:
            job.limits = replace(job.limits, max_batch_size=job.limits.max_batch * 2)


def _rounds(seed: int, num: int = ROUNDS) -> Iterator[tuple[list[JobView], np.ndarray]]:
    """The views and free GPUs per type of ``num`` changing rounds."""
    rng = np.random.default_rng(seed)
    jobs = [_new_job(rng, i, 0.0) for i in range(25)]
    capacity = np.asarray(list(CLUSTER.type_capacity().values()), dtype=np.int64)
    for r in range(num):
        now = 60.0 * (r + 1)
        _evolve(rng, jobs, r + 1, now)
        # Free GPUs: sometimes the whole type, sometimes a few, sometimes none.
        free = np.where(rng.random(capacity.size) < 0.3, capacity, rng.integers(0, capacity + 1))
        yield [job.view(now) for job in jobs], free


def _table(jobs: list[JobView], cluster: Cluster, free: np.ndarray, *, rigid: bool, cache: GoodputCache,
           memo: RowMemo | None) -> ConfigTable:
    return build_configs(jobs, cluster, free, p=-0.5, lambda_n=3.0, restart_penalty_s=30.0, min_factor=0.1,
                         rigid_fixed=rigid, cache=cache, lambda_a=0.07, explore_factor=4, memo=memo)


def _assert_same(got: ConfigTable, want: ConfigTable) -> None:
    assert got.job_ids == want.job_ids
    assert got.types == want.types
    assert got.counts == want.counts
    for name in ("job", "gtype", "count", "goodput", "changed", "cost", "idle_cost", "norm", "factor",
                 "running"):
        a = getattr(got, name)
        b = getattr(want, name)
        assert a.dtype == b.dtype, name
        assert a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name               # bit for bit, not approximately


@pytest.mark.parametrize("rigid", [False, True])
def test_memo_gives_the_same_table_every_round(rigid: bool) -> None:
    memo = RowMemo(4096)
    cache = GoodputCache(4096)
    for jobs, free in _rounds(seed=3):
        with_memo = _table(jobs, CLUSTER, free, rigid=rigid, cache=cache, memo=memo)
        fresh = _table(jobs, CLUSTER, free, rigid=rigid, cache=GoodputCache(0), memo=None)
        _assert_same(with_memo, fresh)
    # The memo was used where jobs were unchanged and missed where they changed; a job whose models
    # alone changed (its gradient statistics) was planned from its stored counts, the others afresh.
    assert memo.hits > 0
    assert memo.misses > 0
    assert 0 < memo.replans < memo.misses


def test_small_memo_and_changed_context_stay_exact() -> None:
    """A memo smaller than the job count (evictions) and a cluster whose node sizes change (the memo
    is emptied, not misused)."""
    memo = RowMemo(5)
    cache = GoodputCache(64)
    bigger = parse_cluster("aws:3x8,rtx:2x8,dgx-ext:1x8")          # same types, other node size
    for r, (jobs, free) in enumerate(_rounds(seed=4)):
        cluster = bigger if r % 7 == 3 else CLUSTER
        with_memo = _table(jobs, cluster, free, rigid=False, cache=cache, memo=memo)
        fresh = _table(jobs, cluster, free, rigid=False, cache=GoodputCache(0), memo=None)
        _assert_same(with_memo, fresh)


def test_free_gpus_capped_in_key_change_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key holds the free GPUs only up to the job's largest possible count: with no cap at all
    (the free GPUs as they are) every table is the same."""
    rounds = list(_rounds(seed=5))
    capped = [_table(jobs, CLUSTER, free, rigid=False, cache=GoodputCache(0), memo=None)
              for jobs, free in rounds]
    monkeypatch.setattr(sia_configs, "candidate_bound", lambda *args: 10**9)
    for (jobs, free), want in zip(rounds, capped, strict=True):
        _assert_same(_table(jobs, CLUSTER, free, rigid=False, cache=GoodputCache(0), memo=None), want)


def test_policy_keeps_its_memo_and_decides_as_without() -> None:
    """``SiaPolicy`` owns the memo (the simulator and the service both reuse it across rounds); its
    decisions equal those of a policy whose memo holds nothing."""
    kept = SiaPolicy()
    none = SiaPolicy(cache=0)
    rng = np.random.default_rng(0)
    for jobs, _ in _rounds(seed=6, num=10):
        a, sa = kept.decide(jobs, CLUSTER, None, 0.0, rng)
        b, sb = none.decide(jobs, CLUSTER, None, 0.0, rng)
        assert a == b
        assert sa == sb
    assert kept._rows.hits > 0
    assert none._rows.hits == 0
