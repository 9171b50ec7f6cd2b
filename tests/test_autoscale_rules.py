"""The autoscaling rules (issue 36) on cases checked by hand: the utility of a cluster shared by
speedup curves, the goodput rule growing a job whose larger batches are useful and not one whose are
not, Or et al.'s throughput rule growing both, the hysteresis band, the cooldown, the bounds."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.policy.autoscale import Fleet, autoscaler_names, make_autoscaler
from pollux.policy.autoscale.rules import ThresholdRule
from pollux.policy.autoscale.utility import speedup_curves, utility_by_size
from pollux.policy.base import JobView

#: Synchronisation costs nothing: throughput scales perfectly with the GPUs.
FREE_SYNC = ThroughputParams(0.01, 0.001, 1e-8, 1e-8, 1e-8, 1e-8, 1.0)
LIMITS = BatchLimits(init_batch_size=32, max_batch_size=32 * 64, min_local_bsz=16, max_local_bsz=64)


def job(name: str, grad: GradStats, params: ThroughputParams = FREE_SYNC) -> JobView:
    return JobView(id=name, submit_time=0.0, model=GoodputModel(params, grad, 32), limits=LIMITS)


#: Pure noise (no signal): every batch size is fully efficient, so goodput scales as throughput.
NOISY = GradStats(sqr=0.0, var=1.0)
#: No noise: a larger batch makes no more progress per step, so more GPUs add no goodput.
QUIET = GradStats(sqr=1.0, var=0.0)


def fleet(ready: int, pending: int = 0, lo: int = 1, hi: int = 16) -> Fleet:
    return Fleet(ready=ready, pending=pending, min_nodes=lo, max_nodes=hi, gpus_per_node=4,
                 provision_delay_s=120.0)


def test_the_utility_of_a_cluster_gives_each_gpu_where_it_gains_most():
    # A: 1, 1.5, 1.8, 2.0 on 1..4 GPUs; B has no model: its first GPU is worth 1, more nothing.
    curves = np.array([[0, 1.0, 1.5, 1.8, 2.0], [0, 1.0, 1.0, 1.0, 1.0]])
    assert utility_by_size(curves, np.array([1, 2, 3, 4])) == pytest.approx([1.0, 2.0, 2.5, 2.8])
    # One job scaling perfectly: utility = GPUs, at every size (no grant skips a size).
    linear = np.arange(9, dtype=float)[None, :]
    assert utility_by_size(linear, np.arange(1, 9)) == pytest.approx(np.arange(1, 9))
    assert utility_by_size(np.zeros((0, 5)), np.array([1, 4])) == pytest.approx([0, 0])


def test_speedup_curves_follow_the_models():
    noisy, quiet = speedup_curves([job("a", NOISY), job("b", QUIET)], 8, 4)
    assert noisy[1] == 1.0 and noisy[8] == pytest.approx(8.0, rel=0.02)     # perfect scaling
    assert quiet[1] == 1.0 and quiet[8] < 2.0                              # little to gain
    waiting = JobView(id="w", submit_time=0.0)                             # no model yet
    assert speedup_curves([waiting], 4, 4)[0].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    rigid = JobView(id="r", submit_time=0.0, fixed=(3, 96))
    assert speedup_curves([rigid], 4, 4)[0].tolist() == [0.0, 0.0, 0.0, 3.0, 3.0]
    through = speedup_curves([job("b", QUIET)], 8, 4, "throughput")[0]
    assert through[8] == pytest.approx(8.0, rel=0.02)                      # throughput ignores efficiency


def test_the_goodput_rule_grows_a_job_whose_large_batches_are_useful_and_not_one_whose_are_not():
    rule = make_autoscaler("goodput")
    grow, _ = rule.decide([job("a", NOISY)], fleet(ready=1), None, now=0.0)
    assert grow.target == 16 and grow.efficiency == pytest.approx(1.0, rel=0.02)
    stay, _ = rule.decide([job("b", QUIET)], fleet(ready=1), None, now=0.0)
    assert stay.target == 1                   # one job keeps one node (it needs one GPU)
    # Or et al.'s rule reads throughput only: it grows the quiet job too.
    both, _ = make_autoscaler("throughput").decide([job("b", QUIET)], fleet(ready=1), None, now=0.0)
    assert both.target == 16


def test_the_rule_grows_to_where_utility_per_gpu_is_half_the_ideal():
    """Sync across nodes costs: on N nodes the speedup is known, so the target is checked by hand."""
    costly = ThroughputParams(0.01, 0.001, 1e-8, 1e-8, 0.05, 0.002, 1.0)
    rule = ThresholdRule()
    view = job("c", NOISY, costly)
    eff = rule.efficiency([view], fleet(ready=1))
    expected = int(np.flatnonzero(eff >= 0.5)[-1])
    assert 1 < expected < 16                   # the case is one where the rule must stop short
    decision, state = rule.decide([view], fleet(ready=1), None, now=100.0)
    assert eff[1] > 2 / 3 and decision.target == expected and state["grown_at"] == 100.0


def test_hysteresis_cooldown_pending_nodes_and_bounds():
    rule = ThresholdRule(cooldown_s=600.0)
    costly = job("c", NOISY, ThroughputParams(0.01, 0.001, 1e-8, 1e-8, 0.05, 0.002, 1.0))
    eff = rule.efficiency([costly], fleet(ready=1))
    band = [n for n in range(1, 17) if 1 / 3 <= eff[n] <= 2 / 3]
    assert band, "the case needs a size inside the band"
    keep, _ = rule.decide([costly], fleet(ready=band[0]), None, now=0.0)
    assert keep.target == band[0] and keep.reason == "within the band"
    # Too big for its one job: shrink, but not within the cooldown of growing, nor with nodes coming.
    assert eff[16] < 1 / 3
    grown = {"grown_at": 0.0}
    assert rule.decide([costly], fleet(ready=16), grown, now=300.0)[0].target == 16
    assert rule.decide([costly], fleet(ready=15, pending=1), grown, now=900.0)[0].target == 16
    shrunk, _ = rule.decide([costly], fleet(ready=16), grown, now=900.0)
    assert shrunk.target == int(np.flatnonzero(eff >= 0.5)[-1]) < 16
    # Bounds: never above MAX, never below MIN; nothing to run shrinks to MIN.
    assert rule.decide([job("a", NOISY)], fleet(ready=1, hi=5), None, now=0.0)[0].target == 5
    assert rule.decide([], fleet(ready=4, lo=2), None, now=10_000.0)[0].target == 2
    # Five jobs without a model yet need five GPUs: two nodes of four, however the rest scales.
    waiting = [JobView(id=f"w{i}", submit_time=0.0) for i in range(5)]
    assert rule.decide(waiting, fleet(ready=0, lo=0), None, now=0.0)[0].target == 2


def test_rules_are_pure_and_reject_bad_settings():
    rule = make_autoscaler("goodput")
    views = [job("a", NOISY), job("b", QUIET)]
    first = rule.decide(views, fleet(ready=2), {"grown_at": 5.0}, now=50.0)
    assert rule.decide(views, fleet(ready=2), {"grown_at": 5.0}, now=50.0) == first
    assert make_autoscaler("fixed", nodes=7).decide(views, fleet(ready=2), None, 0.0)[0].target == 7
    with pytest.raises(ValueError, match="unknown autoscaler 'nope'"):
        make_autoscaler("nope")
    with pytest.raises(ValueError, match="thresholds"):
        ThresholdRule(grow_above=0.4, grow_to=0.5)
    with pytest.raises(ValueError, match="MIN <= MAX"):
        Fleet(ready=0, pending=0, min_nodes=3, max_nodes=2, gpus_per_node=4)


@pytest.mark.parametrize("name", autoscaler_names())
def test_every_registered_autoscaler_keeps_the_contract(name):
    """As the scheduling policies' conformance suite does for them: any jobs (none, waiting, rigid,
    modelled), any fleet within its bounds → a target within the bounds, a JSON-able state, the
    same answer for the same input."""
    import json

    options = {"nodes": 3} if name == "fixed" else {}
    rule = make_autoscaler(name, **options)
    views = [job("a", NOISY), job("b", QUIET), JobView(id="w", submit_time=0.0),
             JobView(id="r", submit_time=0.0, fixed=(2, 64))]
    state = None
    for now, (jobs, ready, pending) in enumerate([([], 0, 0), (views, 1, 0), (views[:2], 4, 2),
                                                  (views[2:], 8, 0), ([], 8, 0)]):
        shape = fleet(ready=ready, pending=pending, lo=1, hi=8)
        decision, new_state = rule.decide(jobs, shape, state, float(now) * 1000.0)
        assert 1 <= decision.target <= 8 and isinstance(decision.reason, str)
        json.dumps(new_state)
        assert rule.decide(jobs, shape, state, float(now) * 1000.0) == (decision, new_state)
        state = new_state
