"""pollux.cluster.control.service_accounting: what each running group is credited before a round."""

from __future__ import annotations

from pollux.cluster.control.records import Group
from pollux.cluster.control.service_accounting import held_before_round, unaccounted


def _group(job_id: str, gpus: dict[str, int], started: float = 10.0, **kw) -> Group:
    return Group(job_id=job_id, restart=0, placement=gpus, handles=[], started=started, **kw)


def test_each_second_is_credited_once():
    g = _group("a", {"n0": 2, "n1": 2})
    assert unaccounted(g, 15.0) == 20.0          # 5 s on 4 GPUs
    assert unaccounted(g, 15.0) == 0.0           # nothing new
    assert unaccounted(g, 16.5) == 6.0
    assert unaccounted(g, 12.0) == 0.0           # a clock that went back credits nothing ...
    assert unaccounted(g, 17.0) == 2.0           # ... and does not credit the same time twice


def test_before_a_round_every_running_group_at_once_but_cleanup_and_stopping_ones():
    groups = [_group("a", {"n0": 1}), _group("b", {"n1": 4}, started=14.0),
              _group("c", {"n2": 2}, cleanup=True), _group("d", {"n3": 1}, stop_reason="cancelled"),
              _group("e", {"n4": 1}, started=20.0)]
    assert held_before_round(groups, 20.0) == {"a": 10.0, "b": 24.0}
    assert held_before_round(groups, 20.0) == {}
