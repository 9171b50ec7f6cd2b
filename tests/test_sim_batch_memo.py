"""The simulation's memo of batch choices and the scalar gain: the same answers, results unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.goodput.efficiency import gain, gain_of
from pollux.policy.registry import make_policy
from pollux.sim import batch_memo as batch_memo_module
from pollux.sim.batch_config import adaptive_batch_config
from pollux.sim.batch_memo import BatchChoiceMemo
from pollux.sim.engine import simulate
from sim_memo_case import SHARED, memo_case

PARAMS = ThroughputParams(0.02, 0.0007, 0.03, 0.0016, 0.12, 0.0026, 2.2)
LIMITS = BatchLimits(128, 4096, 16, 512, accumulation=True)


def model(sqr: float, var: float) -> GoodputModel:
    return GoodputModel(PARAMS, GradStats(sqr=sqr, var=var), 128)


def same_float(a: float, b: float) -> bool:
    """Equal as doubles, NaN with NaN, and the sign of a zero too."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


EDGES = [0.0, -0.0, 1e-300, 1e-281, 1e-279, 1e-10, 0.5, 1.0, 3.7, 1e5, 1e279, 1e281, 1e300,
         math.inf, math.nan, -1.0, -1e-300]


@pytest.mark.parametrize("scale", [*EDGES, 2.0, 64.0])
def test_scalar_gain_is_numpy_gain_bit_for_bit_at_the_edges(scale):
    for sqr in EDGES:
        for var in EDGES:
            with np.errstate(all="ignore"):     # numpy overflows and divides by zero here, quietly
                want = float(gain(scale, sqr, var))
                got = gain_of(scale, sqr, var)
            assert same_float(got, want), (scale, sqr, var)


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-3, 1e4), st.floats(0.0, 1e12), st.floats(0.0, 1e12))
def test_scalar_gain_is_numpy_gain_bit_for_bit(scale, sqr, var):
    assert same_float(gain_of(scale, sqr, var), float(gain(scale, sqr, var)))


def test_a_hit_is_the_search_s_own_answer():
    memo = BatchChoiceMemo()
    first = memo.choose(model(2.0, 30.0), 1, 4, LIMITS, 128, False)
    again = memo.choose(model(2.0, 30.0), 1, 4, LIMITS, 128, False)      # equal, not the same object
    assert again == first == adaptive_batch_config(model(2.0, 30.0), 1, 4, LIMITS, 128, False)
    assert (memo.hits, memo.misses) == (1, 1)


def test_every_argument_is_part_of_the_key():
    memo = BatchChoiceMemo()
    cases = [(model(2.0, 30.0), 1, 4, LIMITS, 128, False), (model(2.0, 31.0), 1, 4, LIMITS, 128, False),
             (model(2.0, 30.0), 2, 4, LIMITS, 128, False), (model(2.0, 30.0), 1, 8, LIMITS, 128, False),
             (model(2.0, 30.0), 1, 4, BatchLimits(128, 2048, 16, 512, accumulation=True), 128, False),
             (model(2.0, 30.0), 1, 4, LIMITS, 128, True), (None, 1, 4, LIMITS, 128, False)]
    for args in cases:
        assert memo.choose(*args) == adaptive_batch_config(*args)
    assert (memo.hits, memo.misses) == (0, len(cases))


def test_the_memo_is_bounded_and_forgets_the_least_recently_used():
    memo = BatchChoiceMemo(max_entries=2)
    a, b, c = ((model(2.0, v), 1, 2, LIMITS, 128, False) for v in (10.0, 20.0, 40.0))
    memo.choose(*a)
    memo.choose(*b)
    memo.choose(*a)                   # a is now the most recent
    memo.choose(*c)                   # b goes
    assert len(memo) == 2
    memo.choose(*a)
    assert memo.hits == 2
    memo.choose(*b)
    assert memo.misses == 4
    with pytest.raises(ValueError, match="max_entries"):
        BatchChoiceMemo(max_entries=0)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared profiles not found at {SHARED}")
@pytest.mark.parametrize("policy", ["pollux", "sia"])
def test_a_simulation_is_the_same_without_the_memo(monkeypatch, policy):
    """Every job's JCT, batch sizes and restarts are identical when every choice is searched afresh."""
    case = memo_case()
    hits: list[int] = []
    real_choose = BatchChoiceMemo.choose

    def counted(self: BatchChoiceMemo, *args):
        found = real_choose(self, *args)
        hits.append(self.hits)
        return found

    monkeypatch.setattr(BatchChoiceMemo, "choose", counted)
    with_memo = simulate(case.jobs, case.profiles, make_policy(policy), case.config)
    assert hits and hits[-1] > 0                          # the memo was used, and hit
    monkeypatch.setattr(BatchChoiceMemo, "choose",
                        lambda self, *args: batch_memo_module.adaptive_batch_config(*args))
    fresh = simulate(case.jobs, case.profiles, make_policy(policy), case.config)
    assert [(j.name, j.jct, j.restarts, j.batch_sizes) for j in with_memo.jobs] == \
           [(j.name, j.jct, j.restarts, j.batch_sizes) for j in fresh.jobs]
