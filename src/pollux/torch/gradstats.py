"""Gradient-noise statistics of one training job, measured from DDP's gradient buckets (SPEC §2).

``GradTracker`` is the measuring half of :class:`~pollux.torch.parallel.AdaptiveDataParallel`: it
decides each step how the noise is measured (the mode), reads each gradient bucket through its
layout (which runs of the flat buffer belong to which optimiser parameter group:
:mod:`pollux.torch.grad_layouts`), weighs it with the Adam pre-conditioner
(:mod:`pollux.torch.adam_preconditioner`), and takes the squared norms of the reduced gradient
after the all-reduce. Its parts, each in a module of its own:

- :mod:`pollux.torch.local_norms`: this replica's norms before the all-reduce (from the buckets, or
  from per-parameter hooks over the micro-steps of an accumulated step);
- :mod:`pollux.torch.control_packet`: the packet that rides on the first bucket's all-reduce (the
  replicas' flags, progress, compute times and the previous step's local norms);
- :mod:`pollux.torch.grad_estimates`: the step's norms turned into estimates of (sqr, var),
  smoothed per group, with the weighted moments behind their standard errors (``Evidence``); the
  part that is checkpointed.

The DDP communication hook that feeds the tracker is :mod:`pollux.torch.comm_hook`, registered by the
wrapper (:mod:`pollux.torch.parallel`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pollux.goodput import GradNoiseState, GradStats
from pollux.torch.adam_preconditioner import AdamPreconditioner
from pollux.torch.api import StepInfo, SyncOutcome
from pollux.torch.control_packet import ControlPacket
from pollux.torch.decisions import Evidence
from pollux.torch.grad_estimates import GradEstimates, StepNorms
from pollux.torch.grad_layouts import BucketLayout, BucketLayouts
from pollux.torch.local_norms import LocalNorms
from pollux.torch.squared_norm import squared_norm

if TYPE_CHECKING:
    from pollux.torch.context import AgentContext


class GradTracker:
    """Per-step gradient measurements and the smoothed statistics per parameter group."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device,
                 process_group: Any, totals_in_callback: bool = False) -> None:
        self.optimizer = optimizer
        # Where the norms of the averaged gradient are taken: in the all-reduce's completion
        # callback (communication thread) when gradients are views of the buckets, since user code
        # (unscaling, clipping) may modify them in place before the optimiser step; otherwise at
        # the end of the step, in the training thread, from the reduced buckets.
        self.totals_in_callback = totals_in_callback
        self.device = device
        self.process_group = process_group
        self.num_groups = len(optimizer.param_groups)
        self.preconditioner = AdamPreconditioner(optimizer)
        self.bucket_layouts = BucketLayouts(optimizer, with_preconditioner=self.preconditioner.adam)
        self.estimates = GradEstimates(self.num_groups)
        #: The agent context: the control flags sent with each step and the progress to compare.
        self.ctx: AgentContext | None = None
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.local = LocalNorms(optimizer, device, self.preconditioner, self.bucket_layouts)
        self.control = ControlPacket(self.num_groups, self.rank, self.world)
        # Per step.
        self.step: StepInfo | None = None
        self.mode = "off"
        self.divisor = 1.0
        #: (1/K)·Σ 1/x_r of the step's unequal shares (None: equal micro-batches).
        self.inv_size_mean: float | None = None
        self.total_parts: list[tuple[int, torch.Tensor]] = []
        self.prev_parts: list[tuple[int, torch.Tensor]] = []
        self.mean_parts: list[tuple[int, torch.Tensor]] = []
        self.awaiting: StepNorms | None = None
        self.diff_ok = True
        self.last_good_diff: tuple[int, float] | None = None   # (sid, scaler scale)
        self.outcome: SyncOutcome | None = None
        self.outcome_sid = -1

    # ---------------------------------------------------------------- statistics

    @property
    def states(self) -> list[GradNoiseState]:
        """The smoothed statistics per parameter group."""
        return self.estimates.states

    @property
    def updates(self) -> int:
        return self.estimates.updates

    @property
    def unbiased_updates(self) -> int:
        return self.estimates.unbiased_updates

    def stats(self) -> GradStats:
        return self.estimates.stats()

    def evidence(self) -> Evidence:
        """The smoothed statistics with standard errors from the spread of the recent estimates."""
        return self.estimates.evidence()

    # ---------------------------------------------------------------- per step

    def begin_step(self, info: StepInfo) -> None:
        self.step = info
        if not info.full:
            mode = "off"
        elif info.micro_steps >= 2:
            mode = "micro"
        elif info.replicas >= 2:
            mode = "bucket"
        else:
            mode = "diff"
        self.mode = mode
        self.divisor = float(info.replicas * info.micro_steps)
        self.inv_size_mean = None
        if info.shares is not None:
            # LB-BSP: replica r's mean gradient counts x_r/Σx (not 1/K), so the reduced gradient is
            # the mean over the whole batch; its micro-batches have unequal sizes across replicas.
            shares = info.shares
            self.divisor = float(sum(shares) * info.micro_steps) / float(shares[self.rank])
            self.inv_size_mean = sum(1.0 / x for x in shares) / len(shares)
        self.control.start_step(info)
        awaiting_sid = None if self.awaiting is None else self.awaiting.sid
        self.local.start_step(info, micro=mode == "micro", awaiting_sid=awaiting_sid)
        self.total_parts = []
        self.prev_parts = []
        self.mean_parts = []
        self.diff_ok = True
        self.bucket_layouts.start_step()

    # ---------------------------------------------------------------- bucket layouts

    def layout(self, bucket: Any) -> BucketLayout:
        """The bucket's layout (:mod:`pollux.torch.grad_layouts`), its pre-conditioner up to date."""
        lay, built = self.bucket_layouts.get(bucket)
        if built:
            self.estimates.mark_measured(gi for _, _, gi, _ in lay.runs)
        self.preconditioner.refresh_if_stale(lay)
        return lay

    def after_optimizer_step(self) -> None:
        """Refresh the Adam pre-conditioner from the optimiser state (Adam family only)."""
        self.preconditioner.after_optimizer_step(self.bucket_layouts.layouts.values())

    # ---------------------------------------------------------------- inside the hook

    def local_norms(self, lay: BucketLayout, buf: torch.Tensor) -> None:
        """This replica's norms of a bucket, before it is reduced (:mod:`pollux.torch.local_norms`)."""
        self.local.add_bucket(lay, buf)

    def total_norms(self, lay: BucketLayout, out: torch.Tensor, sid: int) -> None:
        pc2 = self.preconditioner.pc2_of(lay)
        if self.mode == "diff":
            if lay.prev is not None and lay.prev_sid == sid - 1:
                for start, end, gi, _ in lay.runs:
                    pcs = None if pc2 is None else pc2[start:end]
                    cur, prev = out[start:end], lay.prev[start:end]
                    self.total_parts.append((gi, squared_norm(cur, pcs)))
                    self.prev_parts.append((gi, squared_norm(prev, pcs)))
                    self.mean_parts.append((gi, squared_norm(cur + prev, pcs) * 0.25))
            else:
                self.diff_ok = False
            if lay.prev is None:
                lay.prev = out.detach().clone()
            else:
                lay.prev.copy_(out)
            lay.prev_sid = sid
            return
        for start, end, gi, _ in lay.runs:
            self.total_parts.append((gi, squared_norm(out[start:end],
                                                      None if pc2 is None else pc2[start:end], lay, start)))

    # ---------------------------------------------------------------- the per-step packet

    def packet(self, flags: list[float]) -> torch.Tensor:
        """This step's control packet (:mod:`pollux.torch.control_packet`) with the given flags."""
        progress = float(self.ctx.adp.progress) if self.ctx is not None and self.ctx.adp else 0.0
        return self.control.build(flags, progress, self.local.marker, self.local.previous)

    def receive(self, sid: int, values: torch.Tensor) -> None:
        self.control.receive(sid, values)

    def launch_packet(self, sid: int, flags: list[float]) -> None:
        """Fallback for buckets that cannot carry float64 values exactly (fp16/bf16 gradients)."""
        self.control.launch(sid, self.packet(flags), self.process_group)

    # ---------------------------------------------------------------- end of step

    def finish(self, info: StepInfo) -> SyncOutcome:
        if self.outcome is not None and self.outcome_sid == info.sid:
            return self.outcome
        outcome = SyncOutcome()
        self.bucket_layouts.prune()
        if self.mode != "off" and not self.totals_in_callback:
            for lay in list(self.bucket_layouts.layouts.values()):
                if lay.result_sid == info.sid and lay.result is not None:
                    self.total_norms(lay, lay.result, info.sid)
                    lay.result = None
        vals = self.control.collect(info, outcome)
        # Statistics of the previous step: its local norms arrived with this step's packet.
        previous, self.awaiting = self.awaiting, None
        if previous is not None and vals is not None:
            local = self.control.local_norms(vals, previous.replicas)
            if local is not None:
                self.estimates.add(previous, local)
        if self.mode != "off" and outcome.reduced and not outcome.oom:
            record = self._record(info, outcome)
            if record is not None:
                if record.mode == "diff":
                    self.estimates.add(record, None)
                else:
                    self.awaiting = record
        elif self.mode == "diff":
            self.last_good_diff = None
        self.local.end_step()
        self.outcome, self.outcome_sid = outcome, info.sid
        return outcome

    @staticmethod
    def _sum_parts(parts: list[tuple[int, torch.Tensor]], groups: int) -> list[float]:
        out = [0.0] * groups
        if parts:
            values = torch.stack([v.to(torch.float64) for _, v in parts]).tolist()
            for (gi, _), v in zip(parts, values, strict=True):
                out[gi] += v
        return out

    def _record(self, info: StepInfo, outcome: SyncOutcome) -> StepNorms | None:
        """This step's post-all-reduce norms (its local norms come with the next step)."""
        g = self.num_groups
        total = self._sum_parts(self.total_parts, g)
        prev = mean = None
        values = total
        if self.mode == "diff":
            prev = self._sum_parts(self.prev_parts, g)
            mean = self._sum_parts(self.mean_parts, g)
            values = total + prev + mean
        if not all(math.isfinite(v) for v in values):
            outcome.nonfinite = True
            self.last_good_diff = None
            return None
        if self.local.invalid:
            self.last_good_diff = None
            return None
        diff_valid = False
        if self.mode == "diff":
            last = self.last_good_diff
            diff_valid = (self.diff_ok and last is not None and last[0] == info.sid - 1
                          and last[1] == info.scaler_scale)
            self.last_good_diff = (info.sid, info.scaler_scale)
        inv = 1.0 / (info.scaler_scale * info.scaler_scale)
        return StepNorms(sid=info.sid, mode=self.mode, scale=info.nominal_scale, replicas=info.replicas,
                         micro_steps=info.micro_steps, inv=inv, total=total, prev=prev, mean=mean,
                         diff_valid=diff_valid, inv_size_mean=self.inv_size_mean,
                         init_batch=(sum(info.shares) * info.micro_steps / info.nominal_scale
                                     if info.shares else 1.0))

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        """The smoothed statistics (:mod:`pollux.torch.grad_estimates`); the per-step state starts afresh."""
        return self.estimates.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.estimates.load_state_dict(state)
