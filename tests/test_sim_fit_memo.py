"""The simulation's memo of throughput fits: the same answer as a fresh fit, and results unchanged."""

from __future__ import annotations

import pytest

from pollux.goodput.records import ThroughputParams
from pollux.policy.registry import make_policy
from pollux.sim import fit_memo as fit_memo_module
from pollux.sim.engine import simulate
from pollux.sim.fit_memo import FitMemo, fit_records
from pollux.sim.measurements import Measurements
from sim_memo_case import SHARED, memo_case

RECORDS = {(1, 1, 128): (0.20, 0.18), (1, 2, 128): (0.26, 0.18), (2, 4, 64): (0.31, 0.10)}


def test_a_hit_is_the_fresh_fit_whatever_the_record_order():
    memo = FitMemo()
    first = memo.fit(RECORDS, None)
    shuffled = dict(reversed(list(RECORDS.items())))
    again = memo.fit(shuffled, None)
    assert again is first
    assert (memo.hits, memo.misses) == (1, 1)
    assert first == fit_records(RECORDS, None)
    assert first == fit_records(shuffled, None)        # the fit itself ignores the order


def test_previous_parameters_and_records_are_part_of_the_key():
    memo = FitMemo()
    memo.fit(RECORDS, None)
    memo.fit(RECORDS, ThroughputParams(0.1, 0.001, 0.05, 0.001, 0.1, 0.01, 1.0))
    memo.fit({**RECORDS, (1, 1, 256): (0.35, 0.33)}, None)
    moved = dict(RECORDS)
    moved[(1, 1, 128)] = (0.21, 0.18)
    memo.fit(moved, None)
    assert (memo.hits, memo.misses, len(memo)) == (0, 4, 4)


def test_the_memo_is_bounded_and_forgets_the_least_recently_used():
    memo = FitMemo(max_entries=2)
    a = {(1, 1, 64): (0.1, 0.09)}
    b = {(1, 1, 128): (0.2, 0.18)}
    c = {(1, 1, 256): (0.4, 0.36)}
    memo.fit(a, None)
    memo.fit(b, None)
    memo.fit(a, None)          # a is now the most recent
    memo.fit(c, None)          # evicts b
    assert len(memo) == 2
    memo.fit(a, None)
    memo.fit(b, None)
    assert (memo.hits, memo.misses) == (2, 4)
    with pytest.raises(ValueError, match="max_entries"):
        FitMemo(max_entries=0)


def test_measurements_count_every_fit_remembered_or_not():
    memo = FitMemo()
    one, two = Measurements(False, memo), Measurements(False, memo)
    for m in (one, two):
        m.observe((1, 1, 128), 0.2, 0.02, False, 0, adaptive=True)
        m.observe((1, 2, 128), 0.26, 0.08, False, 0, adaptive=True)
    assert one.fits == two.fits == 2
    assert one.params == two.params
    assert (memo.hits, memo.misses) == (2, 2)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared profiles not found at {SHARED}")
@pytest.mark.parametrize("policy", ["pollux", "sia"])
def test_a_simulation_is_the_same_without_the_memo(monkeypatch, policy):
    """Every job's JCT and fit count are identical when each fit is made afresh."""
    case = memo_case()
    lookups: list[int] = []
    real_fit = FitMemo.fit

    def counted(self: FitMemo, records, previous):
        found = real_fit(self, records, previous)
        lookups.append(self.hits)
        return found

    monkeypatch.setattr(FitMemo, "fit", counted)
    with_memo = simulate(case.jobs, case.profiles, make_policy(policy), case.config)
    assert lookups and lookups[-1] > 0                    # the memo was used, and hit
    monkeypatch.setattr(FitMemo, "fit", lambda self, records, previous: fit_memo_module.fit_records(
        records, previous))
    fresh = simulate(case.jobs, case.profiles, make_policy(policy), case.config)
    assert [(j.name, j.jct, j.fits, j.restarts) for j in with_memo.jobs] == \
           [(j.name, j.jct, j.fits, j.restarts) for j in fresh.jobs]
