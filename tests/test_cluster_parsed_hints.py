"""Hints parsed once per body: the round's views are those of a fresh parse, only cheaper."""

from __future__ import annotations

import pytest

from pollux.cluster.control.parsed_hints import HintsMemo, hints_text, parse_hints
from pollux.cluster.control.scheduler import Scheduler, job_view
from pollux.cluster.state.store import JobStore
from pollux.goodput.records import GradStats, ThroughputParams
from pollux.hints import build_hints
from pollux.policy.base import Cluster

PARAMS = ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23)
CLUSTER = Cluster.uniform(4, 2)


def hints(sqr: float = 8.95, seen: int = 2) -> dict:
    return build_hints(PARAMS, GradStats(sqr=sqr, var=5.07), init_batch_size=128, max_batch_size=4096,
                       local_bsz_bounds=(32, 1024), accumulation=True, max_replicas_seen=seen,
                       progress=100.0, epoch=1)


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "jobs.db")
    yield s
    s.close()


def test_a_body_is_parsed_once_and_again_only_when_its_text_changes():
    memo = HintsMemo()
    body = hints()
    first = memo.parse("a", hints_text(body), body, None)
    assert memo.parse("a", hints_text(dict(reversed(list(body.items())))), body, None) is first
    assert (memo.hits, memo.misses) == (1, 1)
    changed = hints(sqr=9.5)
    second = memo.parse("a", hints_text(changed), changed, None)
    assert second is not first and second.model.grad_stats.sqr == pytest.approx(9.5)
    typed = memo.parse("a", hints_text(changed), changed, ("t4", "a100"))   # the types are part of it
    assert typed.type_models is not None and set(typed.type_models) == {"t4", "a100"}
    assert (memo.hits, memo.misses) == (1, 3)
    # A type-aware round and a type-unaware view of the same job keep one entry each.
    assert memo.parse("a", hints_text(changed), changed, None) is second
    assert memo.parse("a", hints_text(changed), changed, ("t4", "a100")) is typed
    assert (memo.hits, memo.misses) == (3, 3)
    memo.keep_only(["b"])
    memo.parse("a", hints_text(changed), changed, ("t4", "a100"))
    assert memo.misses == 4


def test_a_body_that_does_not_validate_raises_every_time():
    memo = HintsMemo()
    bad = hints()
    bad["throughput"]["gamma"] = 1e300
    for _ in range(2):
        with pytest.raises(ValueError):
            memo.parse("a", hints_text(bad), bad, None)
    assert memo.misses == 2


def test_views_from_the_memo_equal_fresh_views(store):
    for i in range(3):
        store.submit({"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096},
                     job_id=f"j{i}", now=float(i))
    store.put_hints("j0", hints(seen=1), now=5.0)
    store.put_hints("j1", hints(sqr=4.0, seen=2), now=5.0)
    sched = Scheduler(store)
    first = sched.decide(100.0, CLUSTER)
    memo = sched._isolation.parsed
    assert memo.misses == 2
    again = sched.decide(160.0, CLUSTER)
    assert memo.misses == 2 and memo.hits >= 2          # unchanged hints were not parsed again
    stored = store.hints_of(["j0", "j1", "j2"])
    for j in store.list_jobs():
        fresh = job_view(j, stored.get(j.id), 160.0, CLUSTER.total_gpus)
        view = job_view(j, stored.get(j.id), 160.0, CLUSTER.total_gpus,
                        parsed=None if j.id not in stored else parse_hints(stored[j.id]))
        assert view == fresh
    assert set(first.allocation) | set(again.allocation) <= {"j0", "j1", "j2"}
    store.put_hints("j1", hints(sqr=6.0, seen=2), now=170.0)   # a new body is parsed again
    sched.decide(220.0, CLUSTER)
    assert memo.misses == 3
