"""Gradient-noise statistics of one training job, measured from DDP's gradient buckets (SPEC §2).

``GradTracker`` is the measuring half of :class:`~pollux.torch.parallel.AdaptiveDataParallel`: it
reads each gradient bucket through its layout (which runs of the flat buffer belong to which
optimiser parameter group: :mod:`pollux.torch.grad_layouts`), weighs it with the Adam
pre-conditioner (:mod:`pollux.torch.adam_preconditioner`), and keeps the per-step local and total
squared norms and the control packet that rides on the first bucket's all-reduce. From those it gives the
unbiased (or, for one replica without accumulation, differenced) estimates of (sqr, var), smoothed
per group, and the weighted moments behind their standard errors (``Evidence``). The DDP hook that
feeds it lives with the wrapper in :mod:`pollux.torch.parallel`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pollux.goodput import (
    GradNoiseState,
    GradStats,
    combine_groups,
    estimate_differenced,
    estimate_from_norms,
)
from pollux.goodput.efficiency import estimate_unequal
from pollux.torch.adam_preconditioner import AdamPreconditioner
from pollux.torch.api import StepInfo, SyncOutcome
from pollux.torch.decisions import Evidence
from pollux.torch.grad_layouts import BucketLayout, BucketLayouts
from pollux.torch.moments import Moments

if TYPE_CHECKING:
    from pollux.torch.context import AgentContext

@dataclass(slots=True)
class _Pending:
    """A step's norms waiting for its local norms (reduced with the next step's first bucket)."""

    sid: int
    mode: str
    scale: float
    replicas: int
    micro_steps: int
    inv: float
    total: list[float]
    prev: list[float] | None
    mean: list[float] | None
    diff_valid: bool
    inv_size_mean: float | None = None
    init_batch: float = 1.0


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
        self.states = [GradNoiseState() for _ in range(self.num_groups)]
        self.measured = [False] * self.num_groups
        self.updates = 0
        self.unbiased_updates = 0
        self.moments = Moments()
        self.micro_weights: tuple[float, ...] | None = None
        self.sent_progress = 0.0
        #: The agent context: the control flags sent with each step and the progress to compare.
        self.ctx: AgentContext | None = None
        # Per step.
        self.step: StepInfo | None = None
        self.mode = "off"
        self.divisor = 1.0
        #: (1/K)·Σ 1/x_r of the step's unequal shares (None: equal micro-batches).
        self.inv_size_mean: float | None = None
        #: This replica's compute time of the previous step, sent in the packet (None: balancing off).
        self.send_times: float | None = None
        self.send_memory_full = False
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.local_acc = torch.zeros(self.num_groups, dtype=torch.float64, device=device)
        self.local_prev = torch.zeros(self.num_groups, dtype=torch.float64, device=device)
        self.prev_marker = 0.0
        self.acc_sid = -1
        self.total_parts: list[tuple[int, torch.Tensor]] = []
        self.prev_parts: list[tuple[int, torch.Tensor]] = []
        self.mean_parts: list[tuple[int, torch.Tensor]] = []
        self.received: tuple[int, torch.Tensor] | None = None        # (sid, reduced packet)
        self.pending: tuple[int, torch.Tensor, Any] | None = None    # unpacked fallback collective
        self.awaiting: _Pending | None = None
        self.diff_ok = True
        self.step_invalid = False
        self.last_good_diff: tuple[int, float] | None = None   # (sid, scaler scale)
        self.outcome: SyncOutcome | None = None
        self.outcome_sid = -1
        self.micro_handles: list[Any] = []
        self.micro_active = False

    # ---------------------------------------------------------------- statistics

    def stats(self) -> GradStats:
        states = [s for s, seen in zip(self.states, self.measured, strict=True) if seen]
        return combine_groups(states)

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
        self.send_times, self.send_memory_full = info.step_time, info.memory_full
        # Micro-batches of unequal size (a probe step splitting an odd local batch) are weighted so
        # that the accumulated gradient is still the mean over the whole batch.
        sizes = info.micro_sizes
        if mode == "micro" and sizes and len(set(sizes)) > 1:
            total = float(sum(sizes))
            self.micro_weights = tuple(len(sizes) * b / total for b in sizes)
        else:
            self.micro_weights = None
        if mode == "micro" and not self.micro_handles:
            self._register_micro_hooks()
        self.micro_active = mode == "micro"
        # The previous step's local norms travel with this step's first bucket.
        self.local_acc, self.local_prev = self.local_prev, self.local_acc
        self.prev_marker = 1.0 if self.awaiting is not None and self.awaiting.sid == self.acc_sid else 0.0
        self.acc_sid = info.sid
        self.local_acc.zero_()
        self.total_parts = []
        self.prev_parts = []
        self.mean_parts = []
        self.received = None
        self.pending = None
        self.diff_ok = True
        self.step_invalid = False
        self.bucket_layouts.start_step()

    def _register_micro_hooks(self) -> None:
        for gi, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self.micro_handles.append(p.register_hook(self._micro_hook(gi, p)))

    def _micro_hook(self, gi: int, param: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor | None]:
        pid = id(param)

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if not self.micro_active or grad.is_sparse:
                return None
            weights = self.micro_weights
            if weights is not None and self.step is not None:
                grad = grad * weights[min(self.step.micro, len(weights) - 1)]
            with torch.no_grad():
                g = grad.reshape(-1)
                if g.dtype not in (torch.float32, torch.float64):
                    g = g.float()
                if self.preconditioner.active:
                    pc = self.bucket_layouts.param_pc2.get(pid)
                    if pc is None:
                        self.step_invalid = True   # layout not known yet: no consistent P this step
                        value = torch.dot(g, g)
                    else:
                        value = torch.dot(g, g * pc.to(g.dtype))
                else:
                    value = torch.dot(g, g)
                self.local_acc[gi] += value
            return grad if weights is not None else None

        return hook

    # ---------------------------------------------------------------- bucket layouts

    def layout(self, bucket: Any) -> BucketLayout:
        """The bucket's layout (:mod:`pollux.torch.grad_layouts`), its pre-conditioner up to date."""
        lay, built = self.bucket_layouts.get(bucket)
        if built:
            for _, _, gi, _ in lay.runs:
                self.measured[gi] = True
        self.preconditioner.refresh_if_stale(lay)
        return lay

    def after_optimizer_step(self) -> None:
        """Refresh the Adam pre-conditioner from the optimiser state (Adam family only)."""
        self.preconditioner.after_optimizer_step(self.bucket_layouts.layouts.values())

    # ---------------------------------------------------------------- inside the hook

    @staticmethod
    def _sqnorm(x: torch.Tensor, pc2: torch.Tensor | None, lay: BucketLayout | None = None,
                start: int = 0) -> torch.Tensor:
        """``|x|²``, or ``x·(P²x)`` with the pre-conditioner (the product goes to ``lay.scratch``)."""
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        if pc2 is None:
            return torch.dot(x, x)
        pc2 = pc2.to(x.dtype)
        if lay is None:
            return torch.dot(x, x * pc2)
        if lay.scratch is None or lay.scratch.dtype != x.dtype or lay.scratch.device != x.device:
            lay.scratch = torch.empty(lay.numel, dtype=x.dtype, device=x.device)
        tmp = lay.scratch[start:start + x.numel()]
        torch.mul(x, pc2, out=tmp)
        return torch.dot(x, tmp)

    def local_norms(self, lay: BucketLayout, buf: torch.Tensor) -> None:
        pc2 = self.preconditioner.pc2_of(lay)
        for start, end, gi, _ in lay.runs:
            self.local_acc[gi] += self._sqnorm(buf[start:end], None if pc2 is None else pc2[start:end],
                                               lay, start)

    def total_norms(self, lay: BucketLayout, out: torch.Tensor, sid: int) -> None:
        pc2 = self.preconditioner.pc2_of(lay)
        if self.mode == "diff":
            if lay.prev is not None and lay.prev_sid == sid - 1:
                for start, end, gi, _ in lay.runs:
                    pcs = None if pc2 is None else pc2[start:end]
                    cur, prev = out[start:end], lay.prev[start:end]
                    self.total_parts.append((gi, self._sqnorm(cur, pcs)))
                    self.prev_parts.append((gi, self._sqnorm(prev, pcs)))
                    self.mean_parts.append((gi, self._sqnorm(cur + prev, pcs) * 0.25))
            else:
                self.diff_ok = False
            if lay.prev is None:
                lay.prev = out.detach().clone()
            else:
                lay.prev.copy_(out)
            lay.prev_sid = sid
            return
        for start, end, gi, _ in lay.runs:
            self.total_parts.append((gi, self._sqnorm(out[start:end],
                                                      None if pc2 is None else pc2[start:end], lay, start)))

    # ---------------------------------------------------------------- the per-step packet
    #
    # Packet layout (summed over replicas): [sigterm, refit due, oom, marker, progress, local norms
    # of the previous step per group]. It rides at the end of the first bucket's all-reduce (no extra
    # collective); ``marker`` counts the replicas that sent local norms (K when they are valid);
    # ``progress`` is each replica's training progress, checked for agreement (see ``finish``).

    PACKET_FLAGS = 5
    #: Relative disagreement of the replicas' progress that stops training (float32 packets round
    #: at about 6e-8).
    PROGRESS_TOLERANCE = 1e-6

    def packet(self, flags: list[float]) -> torch.Tensor:
        self.sent_progress = float(self.ctx.adp.progress) if self.ctx is not None and self.ctx.adp else 0.0
        head = torch.tensor([*flags, self.prev_marker, self.sent_progress], dtype=torch.float64)
        parts = [head.to(self.local_prev.device, non_blocking=True), self.local_prev]
        if self.send_times is not None:
            # Balancing: each replica fills its own slot, so the sum is the gather of compute times.
            times = torch.zeros(2 * self.world, dtype=torch.float64)
            times[self.rank] = float(self.send_times)
            times[self.world + self.rank] = 1.0 if self.send_memory_full else 0.0
            parts.append(times.to(self.local_prev.device, non_blocking=True))
        return torch.cat(parts)

    def receive(self, sid: int, values: torch.Tensor) -> None:
        self.received = (sid, values.to(torch.float64, copy=True))

    def launch_packet(self, sid: int, flags: list[float]) -> None:
        """Fallback for buckets that cannot carry float64 values exactly (fp16/bf16 gradients)."""
        vec = self.packet(flags)
        work = dist.all_reduce(vec, group=self.process_group, async_op=True)
        self.pending = (sid, vec, work)

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
        if self.pending is not None:
            sid, vec, work = self.pending
            self.pending = None
            work.wait()
            self.received = (sid, vec)
        vals = None
        if self.received is not None and self.received[0] == info.sid:
            vals = self.received[1].tolist()
            self.received = None
            outcome.reduced = True
            outcome.sigterm = vals[0] > 0.5
            outcome.refit = vals[1] > 0.5
            outcome.oom = vals[2] > 0.5
            self._check_progress(vals[4] / max(info.replicas, 1))
            first = self.PACKET_FLAGS + self.num_groups
            if info.step_time is not None and len(vals) >= first + 2 * self.world:
                outcome.step_times = tuple(float(v) for v in vals[first:first + 2 * self.world])
        # Statistics of the previous step: its local norms arrived with this step's packet.
        previous, self.awaiting = self.awaiting, None
        if previous is not None and vals is not None and vals[3] > previous.replicas - 0.5:
            g = self.num_groups
            self._finalize(previous, vals[self.PACKET_FLAGS:self.PACKET_FLAGS + g])
        if self.mode != "off" and outcome.reduced and not outcome.oom:
            record = self._record(info, outcome)
            if record is not None:
                if record.mode == "diff":
                    self._finalize(record, None)
                else:
                    self.awaiting = record
        elif self.mode == "diff":
            self.last_good_diff = None
        self.micro_active = False
        self.outcome, self.outcome_sid = outcome, info.sid
        return outcome

    def _check_progress(self, mean: float) -> None:
        """Every replica must count the same progress, or they would end epochs at different steps
        and the next collective would pair mismatched operations (a hang or a gloo abort). When any
        replica differs, the mean differs from every replica's own value, so all of them stop here
        together, with this message, instead."""
        own = self.sent_progress
        if abs(mean - own) > self.PROGRESS_TOLERANCE * max(1.0, abs(own)):
            raise RuntimeError(
                f"pollux.torch: the replicas disagree on training progress (this replica {own!r}, mean "
                f"{mean!r}): their gradient statistics diverged, which is a bug in pollux.torch; "
                "stopping before a collective mismatch (the job can resume from its last checkpoint)")

    @staticmethod
    def _sum_parts(parts: list[tuple[int, torch.Tensor]], groups: int) -> list[float]:
        out = [0.0] * groups
        if parts:
            values = torch.stack([v.to(torch.float64) for _, v in parts]).tolist()
            for (gi, _), v in zip(parts, values, strict=True):
                out[gi] += v
        return out

    def _record(self, info: StepInfo, outcome: SyncOutcome) -> _Pending | None:
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
        if self.step_invalid:
            self.last_good_diff = None
            return None
        diff_valid = False
        if self.mode == "diff":
            last = self.last_good_diff
            diff_valid = (self.diff_ok and last is not None and last[0] == info.sid - 1
                          and last[1] == info.scaler_scale)
            self.last_good_diff = (info.sid, info.scaler_scale)
        inv = 1.0 / (info.scaler_scale * info.scaler_scale)
        return _Pending(sid=info.sid, mode=self.mode, scale=info.nominal_scale, replicas=info.replicas,
                        micro_steps=info.micro_steps, inv=inv, total=total, prev=prev, mean=mean,
                        diff_valid=diff_valid, inv_size_mean=self.inv_size_mean,
                        init_batch=(sum(info.shares) * info.micro_steps / info.nominal_scale
                                    if info.shares else 1.0))

    def _finalize(self, rec: _Pending, local: list[float] | None) -> None:
        """Turn one step's norms into (sqr, var) estimates and smooth them per parameter group."""
        inv, scale = rec.inv, rec.scale
        if rec.mode == "diff":
            if not rec.diff_valid:
                return
            assert rec.prev is not None and rec.mean is not None
            for gi in range(self.num_groups):
                if self.measured[gi]:
                    sqr, var = estimate_differenced(rec.prev[gi] * inv, rec.total[gi] * inv,
                                                    rec.mean[gi] * inv, scale)
                    self.states[gi] = self.states[gi].update(sqr, var, scale, biased=True)
            self.updates += 1
            return
        assert local is not None
        if not all(math.isfinite(v) for v in local):
            return
        n = rec.replicas * rec.micro_steps
        sum_sqr = sum_var = 0.0
        for gi in range(self.num_groups):
            if self.measured[gi]:
                if rec.inv_size_mean is None:
                    sqr, var = estimate_from_norms(local[gi] / n * inv, rec.total[gi] * inv, n, scale)
                else:       # unequal shares (LB-BSP): the size-weighted estimator
                    u_sqr, u_var = estimate_unequal(local[gi] / n * inv, rec.inv_size_mean,
                                                    rec.total[gi] * inv, rec.init_batch * scale,
                                                    rec.init_batch)
                    sqr, var = float(u_sqr), float(u_var)
                self.states[gi] = self.states[gi].update(sqr, var, scale)
                sum_sqr += sqr
                sum_var += var
        self.updates += 1
        if math.isfinite(sum_sqr) and math.isfinite(sum_var):
            self.unbiased_updates += 1
            self.moments.update((sum_sqr, sum_var), scale)

    def evidence(self) -> Evidence:
        """The smoothed statistics with standard errors from the spread of the recent estimates."""
        stats = self.stats()
        se_sqr, se_var = self.moments.standard_errors()
        return Evidence(sqr=stats.sqr, var=stats.var, se_sqr=se_sqr, se_var=se_var,
                        count=self.unbiased_updates, biased=self.unbiased_updates == 0)

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [s.to_dict() for s in self.states], "measured": list(self.measured),
                "updates": self.updates, "unbiased_updates": self.unbiased_updates,
                "moments": [self.moments.w, self.moments.w2, *self.moments.s1, *self.moments.s2]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = state["groups"]
        if len(groups) != self.num_groups:
            raise ValueError(f"gradient statistics saved for {len(groups)} parameter groups, the "
                             f"optimiser has {self.num_groups}")
        self.states = [GradNoiseState.from_dict(d) for d in groups]
        self.measured = [bool(x) for x in state.get("measured", [True] * self.num_groups)]
        self.updates = int(state.get("updates", 0))
        self.unbiased_updates = int(state.get("unbiased_updates", 0))
        mom = [float(v) for v in state.get("moments", [0.0] * 6)]
        self.moments = Moments(mom[0], mom[1], (mom[2], mom[3]), (mom[4], mom[5]))
