"""Batch-size decisions the agent can stand behind: guarded by the evidence, logged with it.

The goodput optimiser (``pollux.goodput.optimize``) answers "which batch is best if the model is
right". The agent acts on its answer only within what the measurements support:

* **Unbiased statistics only.** A decision waits until the gradient-noise statistics come from at
  least ``MIN_UNBIASED`` multi-sample estimates (several replicas, accumulation micro-steps, or the
  split *probe* steps a single replica runs: see ``AdaptiveDataLoader``). The differenced
  single-replica estimator is biased upwards when the gradient moves between steps, and a noise
  scale read too high makes AdaScale multiply the learning rate by nearly the batch ratio.
* **Decisions on a lower confidence bound of the noise scale.** The optimiser sees
  ``sqr + se(sqr)`` and ``var − se(var)`` (one standard error, from the spread of the recent
  per-step estimates), so a larger batch must be worth it on the pessimistic side of the evidence.
* **A trust region.** One decision at most doubles the total batch (``GROWTH_CAP``), and the local
  batch stays within ``LOCAL_CAP`` times the largest one whose step time was measured: the
  throughput model is not extrapolated far past its data.
* **Hysteresis on the evidence.** Besides the 5 % predicted-gain threshold, a decision that would
  reverse the direction of the previous one is taken only if the noise scale moved beyond its
  noise since then (``|Δ log φ| > REVERSAL_Z`` combined standard errors) or the step time measured
  at the configuration chosen last missed its prediction by more than ``STEP_TIME_TOLERANCE``.
* **A model that reproduces what it measures.** No decision while the predicted step time of the
  running configuration misses its measured one by more than ``MODEL_TOLERANCE`` (a fit stalled with
  a parameter at its floor, say): extrapolating from a model that misses the data it has is a guess.
* **A new allocation keeps the batch until it is measured.** After a restart on a (nodes, replicas)
  with no measured step, the exploration priors of the throughput model predict perfect scaling
  (which draws the scheduler to try it, but is no basis for the agent's choice): the total batch
  stays as close as the bounds allow to the one run before (``keep_batch``), and the next refit,
  with measurements, decides.

Every decision is logged on the ``pollux.torch`` logger twice: a sentence for people and a line
``decision {JSON}`` (statistics, their sample counts, standard errors, the measured and predicted
step time of the configuration left, the predicted step time of the new one). Once the new
configuration has been measured, a line ``step-time check {JSON}`` compares its step time with
the prediction. ``benchmarks/agent_decisions.py`` reads both.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams, optimize, should_switch
from pollux.goodput.efficiency import VAR_FLOOR
from pollux.goodput.model import accumulation_plan, bounded_step_time
from pollux.torch.api import BatchConfig

logger = logging.getLogger("pollux.torch")

#: Unbiased per-step estimates needed before the statistics may drive a decision.
MIN_UNBIASED = 20
#: One decision grows the total batch by at most this factor.
GROWTH_CAP = 2.0
#: The local batch stays within this factor of the largest local batch whose step time was measured.
LOCAL_CAP = 2.0
#: A reversal needs the log noise scale to move by more than this many combined standard errors.
REVERSAL_Z = 2.0
#: ... or the measured step time of the configuration chosen last to miss its prediction by this much
#: (a grossly wrong throughput model, not the noise of a shared machine).
STEP_TIME_TOLERANCE = 0.5
#: No decision while the model's step time for the running configuration misses its measurement by this.
MODEL_TOLERANCE = 0.3
#: Steps measured at a new configuration before its step time is checked against the prediction.
CHECK_AFTER_STEPS = 3

@dataclass(frozen=True, slots=True)
class Evidence:
    """Smoothed gradient statistics (summed over groups) with their standard errors and sample count."""

    sqr: float
    var: float
    se_sqr: float
    se_var: float
    count: int
    biased: bool

    def pgns(self, m0: float) -> float:
        return self.var * m0 / self.sqr if self.sqr > 0 else math.inf

    def conservative(self) -> GradStats:
        """The pessimistic side of one standard error: less noise, more signal, so smaller batches."""
        return GradStats(sqr=max(self.sqr + self.se_sqr, 0.0), var=max(self.var - self.se_var, VAR_FLOOR))

    def log_pgns_se(self) -> float:
        """Standard error of log φ (delta method; inf when a statistic is not resolved)."""
        if self.sqr <= 0 or self.var <= 0:
            return math.inf
        return math.hypot(self.se_sqr / self.sqr, self.se_var / self.var)

    def as_dict(self, m0: float) -> dict[str, Any]:
        phi = self.pgns(m0)
        lo = self.conservative()
        phi_lo = lo.var * m0 / lo.sqr if lo.sqr > 0 else math.inf
        return {"sqr": self.sqr, "var": self.var, "se_sqr": self.se_sqr, "se_var": self.se_var,
                "n": self.count, "biased": self.biased, "pgns": _finite(phi),
                "pgns_conservative": _finite(phi_lo)}


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """What the last decision chose and on which evidence (checkpointed with the loader)."""

    config: BatchConfig
    direction: int              # +1 the batch grew, −1 it shrank, 0 same batch (another m, s)
    log_pgns: float
    log_pgns_se: float
    predicted_step_s: float
    checked: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["config"] = self.config.to_list()     # [K, m, s], as checkpoints always stored it
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecisionRecord:
        return cls(config=BatchConfig.from_seq(data["config"]),
                   direction=int(data["direction"]), log_pgns=float(data["log_pgns"]),
                   log_pgns_se=float(data["log_pgns_se"]), predicted_step_s=float(data["predicted_step_s"]),
                   checked=bool(data.get("checked", False)))


@dataclass(frozen=True, slots=True)
class Proposal:
    """The outcome of one decision round: the configuration to run and why."""

    config: BatchConfig
    changed: bool
    predicted_gain: float | None = None
    note: str = ""


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def trust_limits(limits: BatchLimits, reference_batch: int, max_measured_local: int | None) -> BatchLimits:
    """``limits`` narrowed to the trust region around what was run and measured."""
    m0 = float(limits.init_batch_size)
    cap = max(GROWTH_CAP * float(reference_batch), m0)
    hi = float(limits.max_local)
    if max_measured_local is not None:
        hi = min(hi, max(LOCAL_CAP * float(max_measured_local), float(limits.min_local_bsz)))
    return replace(limits, max_batch_size=min(float(limits.max_batch), cap), max_local_bsz=hi)


def keep_batch(limits: BatchLimits, replicas: int, batch: int) -> BatchConfig | None:
    """The configuration on ``replicas`` whose total batch is closest above ``batch`` (None if none fits)."""
    target = max(float(batch), float(limits.init_batch_size))
    total, m, s, ok = accumulation_plan(target, replicas, limits, force_single=False)
    if not bool(ok) or float(total) > float(limits.max_batch) * (1.0 + 1e-9):
        return None
    return BatchConfig(int(replicas), int(m), int(s))


def predicted_step_time(params: ThroughputParams, nodes: int, config: BatchConfig,
                        max_measured_local: int | None = None) -> float:
    """Seconds per optimiser step the throughput model predicts for ``config`` (pass times beyond
    the largest measured local batch bounded by the prior, as in the decision)."""
    return float(bounded_step_time(params, nodes, config.replicas, config.local_bsz, config.accum_steps,
                                   max_measured_local))


def decide(params: ThroughputParams, evidence: Evidence, limits: BatchLimits, nodes: int,
           current: BatchConfig, reference_batch: int, max_measured_local: int | None,
           last: DecisionRecord | None, measured_step_s: float | None, *,
           periodic: bool, measured_current_s: float | None = None) -> Proposal:
    """One guarded decision at ``current`` (see the module docstring); pure, for rank 0.

    ``reference_batch`` is the total batch the trust region grows from (the batch of the last run
    configuration, also across a change of replicas); ``measured_step_s`` the measured step time
    of the configuration chosen last (None if not measured yet); ``measured_current_s`` that of
    ``current``.
    """
    k = current.replicas
    m0 = float(limits.init_batch_size)
    model = GoodputModel(params, evidence.conservative(), m0)
    if measured_current_s is not None and measured_current_s > 0:
        predicted = predicted_step_time(params, nodes, current, max_measured_local)
        ratio = predicted / measured_current_s
        if not max(ratio, 1.0 / ratio) <= 1.0 + MODEL_TOLERANCE:
            return Proposal(current, False, None,
                            f"throughput model misses the running configuration's step time "
                            f"({predicted * 1e3:.2f} ms predicted, "
                            f"{measured_current_s * 1e3:.2f} ms measured)")
    narrowed = trust_limits(limits, reference_batch, max_measured_local)
    # One replica measures unbiased statistics with probe steps, so it need not accumulate to grow.
    plan = optimize(model, nodes, k, narrowed, force_single_accumulation=False,
                    grad_floor=max_measured_local)
    best = float(plan.goodput)
    if best <= 0.0:
        return Proposal(current, False, None, "no valid batch in the trust region")
    new = BatchConfig(k, int(plan.local_bsz), int(plan.accum_steps))
    base_tp = current.batch_size / predicted_step_time(params, nodes, current, max_measured_local)
    base_good = base_tp * float(model.efficiency(current.batch_size))
    gain = best / base_good - 1.0 if base_good > 0 else math.inf
    if new == current:
        return Proposal(current, False, gain)
    if periodic and not should_switch(base_good, best):
        return Proposal(current, False, gain, "predicted gain below the 5 % threshold")
    direction = (new.batch_size > current.batch_size) - (new.batch_size < current.batch_size)
    if periodic and last is not None and direction != 0 and direction == -last.direction:
        moved = _evidence_moved(evidence, m0, last)
        missed = _prediction_missed(last, measured_step_s)
        if not (moved or missed):
            return Proposal(current, False, gain, "reversal suppressed: statistics within their noise "
                                                  "and step time as predicted since the last decision")
    return Proposal(new, True, gain)


def _evidence_moved(evidence: Evidence, m0: float, last: DecisionRecord) -> bool:
    phi = evidence.pgns(m0)
    if not (math.isfinite(phi) and phi > 0 and math.isfinite(last.log_pgns)):
        return False
    se = math.hypot(evidence.log_pgns_se(), last.log_pgns_se)
    return math.isfinite(se) and abs(math.log(phi) - last.log_pgns) > REVERSAL_Z * se


def _prediction_missed(last: DecisionRecord, measured_step_s: float | None) -> bool:
    if measured_step_s is None or not math.isfinite(last.predicted_step_s) or last.predicted_step_s <= 0:
        return False
    ratio = measured_step_s / last.predicted_step_s
    return abs(ratio - 1.0) > STEP_TIME_TOLERANCE


def make_record(new: BatchConfig, old: BatchConfig | None, evidence: Evidence, m0: float,
                predicted_step_s: float) -> DecisionRecord:
    ref = old.batch_size if old is not None else new.batch_size
    direction = (new.batch_size > ref) - (new.batch_size < ref)
    phi = evidence.pgns(m0)
    return DecisionRecord(config=new, direction=direction,
                          log_pgns=math.log(phi) if math.isfinite(phi) and phi > 0 else math.nan,
                          log_pgns_se=evidence.log_pgns_se(), predicted_step_s=predicted_step_s)


def log_decision(payload: dict[str, Any]) -> None:
    """The machine-readable decision line (``decision {JSON}``)."""
    logger.info("decision %s", json.dumps(_clean(payload), sort_keys=True, allow_nan=False))


def log_step_time_check(config: BatchConfig, predicted_s: float, measured_s: float, steps: int) -> None:
    ratio = measured_s / predicted_s if predicted_s > 0 else math.inf
    logger.info("step-time check %s", json.dumps(_clean({
        "config": config.to_list(), "predicted_s": predicted_s, "measured_s": measured_s, "steps": steps,
        "measured_over_predicted": ratio}), sort_keys=True, allow_nan=False))


def _clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float):
        return _finite(x)
    return x
