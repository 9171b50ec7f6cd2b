"""The guards of the agent's batch-size decisions, as pure functions (``pollux.torch.decisions``)."""

from __future__ import annotations

import math

import pytest

from pollux.goodput import BatchLimits, ThroughputParams
from pollux.torch.api import BatchConfig
from pollux.torch.decisions import (
    GROWTH_CAP,
    DecisionRecord,
    Evidence,
    decide,
    keep_batch,
    make_record,
    trust_limits,
)

# Compute-bound throughput with a large fixed cost per pass: larger local batches pay a lot.
PARAMS = ThroughputParams(alpha_grad=0.05, beta_grad=1e-4, alpha_local=0.01, beta_local=1e-8,
                          alpha_node=0.02, beta_node=1e-8, gamma=1.0)
LIMITS = BatchLimits(32, max_batch_size=4096, min_local_bsz=8, max_local_bsz=1024, accumulation=True)


def evidence(pgns: float, rel_se: float = 0.05, count: int = 500) -> Evidence:
    sqr = 1.0
    var = pgns * sqr / 32
    return Evidence(sqr=sqr, var=var, se_sqr=rel_se * sqr, se_var=rel_se * var, count=count, biased=False)


def test_one_decision_at_most_doubles_the_batch_and_the_local_batch_stays_near_the_measured() -> None:
    narrowed = trust_limits(LIMITS, reference_batch=32, max_measured_local=32)
    assert narrowed.max_batch_size == GROWTH_CAP * 32 and narrowed.max_local_bsz == 64
    p = decide(PARAMS, evidence(1e5), LIMITS, 1, BatchConfig(1, 32, 0), 32, 32, None, None, periodic=True)
    assert p.changed and p.config.replicas == 1 and p.config.local_bsz * p.config.micro_steps <= 64


def test_a_noisier_estimate_makes_a_more_cautious_decision() -> None:
    start = BatchConfig(2, 64, 0)
    sure = decide(PARAMS, evidence(300, 0.02), LIMITS, 1, start, 128, 64, None, None, periodic=False)
    unsure = decide(PARAMS, evidence(300, 0.9), LIMITS, 1, start, 128, 64, None, None, periodic=False)
    assert unsure.config.batch_size < sure.config.batch_size


def test_a_reversal_needs_moved_statistics_or_a_grossly_wrong_step_time() -> None:
    # Per-example cost dominates: a larger batch buys little throughput, so efficiency decides.
    params = ThroughputParams(alpha_grad=1e-3, beta_grad=1e-3, alpha_local=1e-3, beta_local=1e-8,
                              alpha_node=2e-3, beta_node=1e-8, gamma=1.0)
    grown = make_record(BatchConfig(2, 32, 0), BatchConfig(2, 16, 0), evidence(30, rel_se=0.5), 32,
                        predicted_step_s=0.033)
    assert grown.direction == 1
    now = evidence(20, rel_se=0.5)                     # lower, but within the noise of both estimates
    wanted = decide(params, now, LIMITS, 1, BatchConfig(2, 32, 0), 64, 32, None, 0.034, periodic=True)
    assert wanted.changed and wanted.config.local_bsz < 32     # without a last decision it would shrink
    kept = decide(params, now, LIMITS, 1, BatchConfig(2, 32, 0), 64, 32, grown, 0.034, periodic=True)
    assert not kept.changed and "reversal suppressed" in kept.note
    # Statistics moved far beyond their noise: the reversal is allowed.
    moved = decide(params, evidence(2.0, rel_se=0.01), LIMITS, 1, BatchConfig(2, 32, 0), 64, 32, grown, 0.034,
                   periodic=True)
    assert moved.changed and moved.config.local_bsz < 32
    # The step time measured at the last choice is twice the prediction: allowed too.
    missed = decide(params, now, LIMITS, 1, BatchConfig(2, 32, 0), 64, 32, grown, 0.066, periodic=True)
    assert missed.changed and missed.config == wanted.config


def test_keep_batch_on_a_new_allocation() -> None:
    assert keep_batch(LIMITS, 2, 96) == BatchConfig(2, 48, 0)
    assert keep_batch(LIMITS, 3, 100) == BatchConfig(3, 34, 0)  # closest above within the bounds
    small = BatchLimits(32, max_batch_size=256, min_local_bsz=8, max_local_bsz=16, accumulation=True)
    assert keep_batch(small, 2, 128) == BatchConfig(2, 16, 3)   # accumulation where the bound requires it
    assert keep_batch(small, 64, 128) is None                   # 64 × 8 exceeds the largest batch


def test_records_round_trip() -> None:
    rec = DecisionRecord(BatchConfig(2, 16, 1), -1, math.log(40.0), 0.2, 0.01, checked=True)
    saved = rec.to_dict()
    assert saved["config"] == [2, 16, 1]                   # the checkpoint format of the bare tuple
    assert DecisionRecord.from_dict(saved) == rec
    assert DecisionRecord.from_dict({**saved, "config": (2, 16, 1)}) == rec    # an older checkpoint


def test_a_batch_configuration_is_a_typed_record() -> None:
    cfg = BatchConfig(2, 16, 1)
    assert (cfg.batch_size, cfg.micro_steps, cfg.to_list()) == (64, 2, [2, 16, 1])
    assert BatchConfig.from_seq([2, 16, 1]) == cfg == BatchConfig.from_seq(cfg)
    for bad, field in (((0, 16, 1), "replicas"), ((2, 0, 1), "local_bsz"), ((2, 16, -1), "accum_steps")):
        with pytest.raises(ValueError, match=f"BatchConfig.{field}"):
            BatchConfig(*bad)
    with pytest.raises(ValueError, match="replicas, local_bsz, accum_steps"):
        BatchConfig.from_seq([2, 16])


def test_no_decision_on_a_model_that_misses_the_running_configuration() -> None:
    predicted = 0.05 + 1e-4 * 32          # T_grad(32) on one replica under PARAMS
    fine = decide(PARAMS, evidence(1e5), LIMITS, 1, BatchConfig(1, 32, 0), 32, 32, None, None, periodic=True,
                  measured_current_s=predicted * 1.1)
    assert fine.changed
    off = decide(PARAMS, evidence(1e5), LIMITS, 1, BatchConfig(1, 32, 0), 32, 32, None, None, periodic=True,
                 measured_current_s=predicted * 2.5)
    assert not off.changed and "misses" in off.note


def test_pass_times_beyond_the_measured_batch_are_bounded_by_the_prior() -> None:
    from pollux.goodput import GoodputModel, GradStats, optimize
    from pollux.goodput.model import bounded_step_time
    from pollux.goodput.throughput import t_iter

    flat = ThroughputParams(alpha_grad=0.01, beta_grad=1e-7, alpha_local=1e-8, beta_local=1e-8,
                            alpha_node=1e-8, beta_node=1e-8, gamma=1.0)   # a degenerate slope
    m = [16.0, 32.0, 64.0, 256.0]
    plain = t_iter(flat, 1, 1, m)
    bounded = bounded_step_time(flat, 1, 1, m, 0, grad_floor=32)
    assert list(bounded[:2]) == list(plain[:2])                      # within the measured range
    t32 = float(plain[1])
    assert bounded[2] >= t32 * 1.5 - 1e-12 and bounded[3] >= t32 * 4.5 - 1e-12
    model = GoodputModel(flat, GradStats(sqr=1.0, var=10.0), 32)
    free = optimize(model, 1, 1, LIMITS)
    held = optimize(model, 1, 1, LIMITS, grad_floor=32)
    assert held.batch_size < free.batch_size
