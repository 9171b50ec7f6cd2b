"""``BatchTuner``: the agent's batch-size decisions for one data loader (SPEC §4, §8).

The loader (:mod:`pollux.torch.data`) keeps the data and the steps; the tuner owns what the batch
is: the limits the user gave (``autoscale_batch_size``) and those out-of-memory errors lowered, the
configuration in force (local batch m and accumulation steps s on the current replicas), the last
decision and its prediction. Rank 0 decides — from the fitted goodput model once a throughput fit
exists and the gradient statistics are ready (within the guards of :mod:`pollux.torch.decisions`),
else the smallest configuration that reaches M0 — and every replica takes rank 0's choice by
broadcast. Every change is logged on the ``pollux.torch`` logger with its evidence.

The tuner reads the shared :class:`~pollux.torch.context.AgentContext` (replicas, profiler, the
fitted model, the model wrapper's statistics) and asks it to refit; it never touches the loader.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pollux.goodput import BatchLimits
from pollux.hints import build_hints
from pollux.torch import decisions
from pollux.torch.api import BatchConfig
from pollux.torch.context import AgentContext
from pollux.torch.decisions import DecisionRecord
from pollux.torch.shares import BalanceReport
from pollux.torch.tensorboard import log_decision

logger = logging.getLogger("pollux.torch")

__all__ = ["OOM_BACKOFF", "BatchTuner", "current_hints", "measured_step_time"]

#: After an out-of-memory error the upper local batch bound becomes ``floor(m × OOM_BACKOFF)``.
OOM_BACKOFF = 0.75


class BatchTuner:
    """The batch configuration of one loader, its limits and the decisions that change it."""

    def __init__(self, init_batch_size: int) -> None:
        self.init_batch_size = int(init_batch_size)
        self.max_batch: int | None = None
        self.min_local = 1
        self.user_max_local: int | None = None
        self.oom_max_local: int | None = None
        self.accumulation = False
        #: The configuration in force (None until the first iteration), and the limits it was chosen
        #: under: a resumed job keeps it only if both still hold.
        self.config: BatchConfig | None = None
        self.config_key: tuple[Any, ...] | None = None
        self.last_decision: DecisionRecord | None = None
        self._warned_forced_accum = False

    # ---------------------------------------------------------------- limits

    def autoscale(self, max_batch_size: int, local_bsz_bounds: tuple[int | None, int | None] | None,
                  gradient_accumulation: bool) -> None:
        """Check and take the user's limits (see ``AdaptiveDataLoader.autoscale_batch_size``)."""
        if isinstance(max_batch_size, bool) or int(max_batch_size) != max_batch_size:
            raise ValueError(f"max_batch_size: expected an integer, got {max_batch_size!r}")
        if max_batch_size < self.init_batch_size:
            raise ValueError(f"max_batch_size: {max_batch_size} is below the initial batch size "
                             f"{self.init_batch_size}")
        lo, hi = (None, None) if local_bsz_bounds is None else tuple(local_bsz_bounds)
        if lo is not None and (int(lo) != lo or lo < 1):
            raise ValueError(f"local_bsz_bounds: lower bound must be a positive integer, got {lo!r}")
        if hi is not None and (int(hi) != hi or hi < 1):
            raise ValueError(f"local_bsz_bounds: upper bound must be a positive integer, got {hi!r}")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"local_bsz_bounds: lower bound {lo} exceeds upper bound {hi}")
        self.max_batch = int(max_batch_size)
        self.min_local = int(lo) if lo is not None else 1
        self.user_max_local = int(hi) if hi is not None else None
        self.accumulation = bool(gradient_accumulation)

    def note_oom_bound(self, bound: int) -> None:
        """Lower the upper local batch bound to ``bound`` (an out-of-memory error, this run or a
        previous one)."""
        self.oom_max_local = bound if self.oom_max_local is None else min(self.oom_max_local, bound)

    @property
    def adaptive(self) -> bool:
        return self.max_batch is not None and self.max_batch > self.init_batch_size

    @property
    def max_batch_size(self) -> int:
        return self.max_batch if self.max_batch is not None else self.init_batch_size

    @property
    def max_local_bsz(self) -> int | None:
        """Upper local batch bound in force: the user's, lowered by out-of-memory errors."""
        bounds = [b for b in (self.user_max_local, self.oom_max_local) if b is not None]
        return min(bounds) if bounds else None

    @property
    def min_local_bsz(self) -> int:
        hi = self.max_local_bsz
        return self.min_local if hi is None else min(self.min_local, hi)

    def limits(self) -> BatchLimits:
        """The batch limits handed to the goodput optimiser."""
        return BatchLimits(init_batch_size=self.init_batch_size, max_batch_size=self.max_batch_size,
                           min_local_bsz=self.min_local_bsz, max_local_bsz=self.max_local_bsz,
                           accumulation=self.accumulation)

    def limits_key(self) -> tuple[Any, ...]:
        return (self.max_batch_size, self.min_local_bsz, self.max_local_bsz, self.accumulation)

    # ---------------------------------------------------------------- the configuration

    def current(self, replicas: int) -> BatchConfig:
        """The configuration in force on ``replicas`` (or the one the next iteration starts with)."""
        if self.config is not None and self.config.replicas == replicas:
            return self.config
        return self.default_config(replicas)

    def default_config(self, k: int) -> BatchConfig:
        """The smallest configuration reaching M0 within the local bounds."""
        m0 = self.init_batch_size
        m, s = -(-m0 // k), 0
        hi = self.max_local_bsz
        if hi is not None and m > hi:
            if not self.accumulation and not self._warned_forced_accum:
                logger.warning("the initial batch size %d does not fit %d replicas with local batch "
                               "<= %d; using gradient accumulation although it was not enabled", m0, k, hi)
                self._warned_forced_accum = True
            s = -(-m0 // (k * hi)) - 1
            m = -(-m0 // (k * (s + 1)))
        return BatchConfig(k, max(m, self.min_local_bsz), s)

    def ensure_config(self, ctx: AgentContext) -> None:
        """At the start of an iteration: keep the configuration if the replicas and the limits are
        those it was chosen for, else decide again (rank 0) and agree on it."""
        k = ctx.replicas
        ctx.profiler.note_replicas(k)
        choice: BatchConfig | None = None
        if ctx.rank == 0:
            config = self.config
            if config is not None and config.replicas == k and self.config_key == self.limits_key():
                choice = config          # resumed (or re-iterated) with the same replicas
            else:
                reason = "start" if config is None else (
                    f"replicas {config.replicas} -> {k}" if config.replicas != k else "batch limits changed")
                choice = self._decide(ctx, reason, periodic=False)
        self._apply(ctx, choice)          # rank 0's choice on every replica

    def refit(self, ctx: AgentContext, balance: BalanceReport | None) -> None:
        """The periodic refit: rank 0 refits the throughput model, decides again and reports hints;
        every replica takes the choice."""
        choice: BatchConfig | None = None
        if ctx.rank == 0:
            ctx.refit_throughput()
            ctx.fault_point("refit")
            self._check_last_decision(ctx)
            choice = self._decide(ctx, "periodic refit", periodic=True)
            self._report_hints(ctx, balance)
        self._apply(ctx, choice)

    def handle_oom(self, ctx: AgentContext, local_bsz: int) -> None:
        """An out-of-memory error at ``local_bsz`` (agreed by every replica): lower the upper local
        bound by :data:`OOM_BACKOFF` and choose again."""
        lowered = math.floor(local_bsz * OOM_BACKOFF)
        if lowered < 1 or lowered >= local_bsz:
            raise RuntimeError(f"out of memory at local batch size {local_bsz}: cannot lower it further")
        self.note_oom_bound(lowered)
        if ctx.rank == 0:
            logger.warning("out of memory at local batch size %d: upper local batch bound lowered to %d",
                           local_bsz, lowered)
        choice = self._decide(ctx, "out of memory", periodic=False) if ctx.rank == 0 else None
        self._apply(ctx, choice)

    def _apply(self, ctx: AgentContext, choice: BatchConfig | None) -> None:
        """Every replica takes rank 0's ``choice`` (None on the other ranks) and lowered bound."""
        mine = [0, 0] if choice is None else [choice.local_bsz, choice.accum_steps]
        m, s, oom_hi = ctx.broadcast_ints([*mine, self.oom_max_local or 0])
        self.oom_max_local = oom_hi or None
        old = self.config
        self.config = BatchConfig(ctx.replicas, m, s)
        self.config_key = self.limits_key()
        if old is not None and old != self.config:
            ctx.fault_point("change")
        log_decision(ctx, self.config)      # TensorBoard: one point per decision (rank 0)

    # ---------------------------------------------------------------- decisions (rank 0)

    def _decide(self, ctx: AgentContext, reason: str, *, periodic: bool) -> BatchConfig:
        """Rank 0's choice of configuration on the current replicas (see :mod:`pollux.torch.decisions`)."""
        k, nodes = ctx.replicas, ctx.nodes
        current = self.config if self.config is not None and self.config.replicas == k else None
        default = self.default_config(k)
        adp = ctx.adp
        ready = (self.adaptive and ctx.fit_params is not None and adp is not None and adp.decision_ready)
        if not ready:
            choice = current if current is not None and periodic else default
            if choice != current:
                why = "fixed batch" if not self.adaptive else "no goodput model yet (statistics not ready)"
                self._log_change(ctx, current, choice, reason, None, None, note=why)
            return choice
        assert ctx.fit_params is not None and adp is not None
        evidence = adp.evidence()
        base = current if current is not None else default
        reference = self.config.batch_size if self.config is not None else self.init_batch_size
        if not ctx.profiler.has_allocation(nodes, k):
            # No timed step on this allocation yet: its prediction would be the exploration prior.
            if current is not None:
                return current
            kept = decisions.keep_batch(self.limits(), k, reference) or default
            self._log_change(ctx, None, kept, reason, None, None,
                             note="keeping the total batch until this allocation is measured")
            return kept
        last = self.last_decision
        measured_last = None
        if last is not None and last.config.replicas == k:
            found = measured_step_time(ctx, last.config)
            measured_last = None if found is None else found[0]
        here = measured_step_time(ctx, base)
        proposal = decisions.decide(ctx.fit_params, evidence, self.limits(), nodes, base, reference,
                                    ctx.profiler.max_local_bsz(), last, measured_last, periodic=periodic,
                                    measured_current_s=None if here is None else here[0])
        if proposal.note.startswith("throughput model misses"):
            logger.info("keeping batch size %d: %s [%s]", base.batch_size, proposal.note, reason)
        if proposal.note and proposal.note.startswith("reversal"):
            logger.info("keeping batch size %d: %s [%s]", base.batch_size, proposal.note, reason)
        else:
            logger.debug("decision round [%s]: %s -> %s, predicted goodput %s, %s; noise scale %.4g from %d "
                         "estimates", reason, base.to_list(), proposal.config.to_list(),
                         proposal.predicted_gain, proposal.note, evidence.pgns(self.init_batch_size),
                         evidence.count)
        new = proposal.config
        if new != current:
            self._log_change(ctx, current, new, reason, proposal.predicted_gain, evidence)
        return new

    def _log_change(self, ctx: AgentContext, old: BatchConfig | None, new: BatchConfig,
                    reason: str, change: float | None, evidence: decisions.Evidence | None,
                    note: str = "") -> None:
        """Log a change of configuration (rank 0): a sentence and a ``decision {JSON}`` line."""
        m0 = float(self.init_batch_size)
        params, nodes = ctx.fit_params, ctx.nodes
        predicted_new = left_pred = model_new = None
        left_meas = measured_step_time(ctx, old) if old is not None else None
        if params is not None and evidence is not None:
            ref = ctx.profiler.max_local_bsz()
            model_new = predicted_new = decisions.predicted_step_time(params, nodes, new, ref)
            if old is not None:
                left_pred = decisions.predicted_step_time(params, nodes, old, ref)
            if left_meas is not None and left_pred is not None and left_pred > 0:
                # Anchored to the data: the model's ratio new/left times the measured step time left.
                predicted_new = model_new * left_meas[0] / left_pred
        if evidence is not None:
            self.last_decision = decisions.make_record(
                new, old if old is not None else self.config, evidence, m0,
                predicted_new if predicted_new is not None else math.nan)
        else:
            self.last_decision = None
        if ctx.rank != 0:
            return
        text = (f"batch size {new.batch_size} (local {new.local_bsz} x {new.micro_steps} micro-step(s) "
                f"on {new.replicas} replica(s))")
        if old is not None:
            text = f"batch size {old.batch_size} -> " + text.split(" ", 2)[2]
        if change is not None:
            text += f": predicted goodput {change:+.1%}"
        if evidence is not None:
            phi = evidence.pgns(m0)
            text += (f"; noise scale {phi:.4g} from {evidence.count} unbiased estimates "
                     f"(sqr {evidence.sqr:.3g} ± {evidence.se_sqr:.2g}, var {evidence.var:.3g} ± "
                     f"{evidence.se_var:.2g})")
        if left_meas is not None and left_pred is not None:
            text += (f"; step time left {left_meas[0] * 1e3:.1f} ms measured vs "
                     f"{left_pred * 1e3:.1f} ms predicted")
        logger.info("%s [%s]%s", text, reason, f": {note}" if note else "")
        adp = ctx.adp
        decisions.log_decision({
            "from": old.to_list() if old is not None else None,
            "to": new.to_list(), "reason": reason, "predicted_gain": change, "note": note,
            "stats": None if evidence is None else evidence.as_dict(m0),
            "left": None if old is None else {
                "config": old.to_list(), "measured_step_s": None if left_meas is None else left_meas[0],
                "measured_steps": None if left_meas is None else left_meas[1],
                "predicted_step_s": left_pred},
            "new_predicted_step_s": predicted_new, "new_model_step_s": model_new,
            "progress": None if adp is None else adp.progress, "epoch": ctx.epoch_state.epoch})

    def _check_last_decision(self, ctx: AgentContext) -> None:
        """Once the configuration chosen last was measured, log its step time against the prediction."""
        last = self.last_decision
        if last is None or last.checked or last.config.replicas != ctx.replicas:
            return
        found = measured_step_time(ctx, last.config)
        if (found is None or found[1] < decisions.CHECK_AFTER_STEPS
                or not math.isfinite(last.predicted_step_s)):
            return
        decisions.log_step_time_check(last.config, last.predicted_step_s, found[0], found[1])
        self.last_decision = DecisionRecord(last.config, last.direction, last.log_pgns, last.log_pgns_se,
                                            last.predicted_step_s, checked=True)

    # ---------------------------------------------------------------- hints

    def hints(self, ctx: AgentContext, balance: BalanceReport | None) -> dict[str, Any] | None:
        """The hints body this job would report now (None before the first throughput fit)."""
        if ctx.fit_params is None:
            return None
        adp = ctx.adp
        stats = adp.grad_stats if adp is not None else None
        hi = self.max_local_bsz
        bounds = (self.min_local_bsz, hi if hi is not None else self.max_batch_size)
        return build_hints(
            ctx.fit_params,
            stats if stats is not None else {"sqr": 1.0, "var": 1e-6},
            self.init_batch_size,
            self.max_batch_size,
            bounds,
            self.accumulation,
            max(ctx.profiler.max_replicas_seen, ctx.replicas),
            adp.progress if adp is not None else 0.0,
            ctx.epoch_state.epoch,
            balance=None if balance is None else balance.as_hints(),
            gpu_type=ctx.env.gpu_type,
            types=ctx.type_hints(bounds),
            current=current_hints(ctx, self.config),
        )

    def _report_hints(self, ctx: AgentContext, balance: BalanceReport | None) -> None:
        if not ctx.reporter.enabled:
            return
        try:
            body = self.hints(ctx, balance)
        except Exception as exc:
            logger.warning("could not build hints: %s", exc)
            return
        if body is not None:
            ctx.reporter.report_async(body)


def measured_step_time(ctx: AgentContext, config: BatchConfig) -> tuple[float, int] | None:
    """Measured (mean step time, steps) of ``config`` on the current nodes, if any."""
    return ctx.profiler.step_time(ctx.nodes, config.replicas, config.local_bsz, config.accum_steps)


def current_hints(ctx: AgentContext, config: BatchConfig | None) -> dict[str, Any] | None:
    """The hints' ``current`` object: the configuration in force and, once the profiler has timed it
    on the current nodes, its mean step time and the steps behind that mean — so that the service can
    set what the job measured beside what its model predicts.

    None without a configuration on the current replicas (before the first iteration, or after a
    resize until the next one starts): the job then runs nothing this could describe. A mean of zero
    (a clock too coarse for the step) says nothing about the speed and is left out.
    """
    if config is None or config.replicas != ctx.replicas:
        return None
    out: dict[str, Any] = {"replicas": config.replicas, "local_bsz": config.local_bsz,
                           "accum_steps": config.accum_steps, "batch_size": config.batch_size}
    found = measured_step_time(ctx, config)
    if found is not None and math.isfinite(found[0]) and found[0] > 0:
        out["step_time"], out["steps"] = float(found[0]), int(found[1])
    return out
