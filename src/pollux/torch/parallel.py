"""``AdaptiveDataParallel``: DDP that measures the gradient noise and scales the learning rate (SPEC §2, §8).

Statistics come from a DDP communication hook (public API: ``register_comm_hook`` and ``GradBucket``),
one Python call per gradient bucket per step, measured by :mod:`pollux.torch.gradstats`:

* before the bucket's all-reduce, the squared norm of the local (pre-conditioned) gradient, per
  optimiser parameter group: one dot product per contiguous run of one group's parameters in the
  flat bucket buffer (no Python loop over parameters);
* after it, the squared norm of the averaged gradient, likewise;
* no extra collective: the first bucket of each step (small: DDP caps it at about 1 MiB) is sent as a
  copy with a few values appended: three control flags (SIGTERM received, refit due, out of memory)
  and the previous step's per-group local norms, so a step's estimate is completed one step later.

From these the unbiased estimator gives (sqr, var) with n = K samples. With gradient accumulation
(s ≥ 1), each micro-batch gradient's norm is taken by a tensor hook as it arrives (n = K·(s+1), so one
replica with accumulation has real multi-sample estimates). One replica without accumulation uses
the differenced estimator over consecutive steps (marked biased). The squared norms use the Adam
pre-conditioner ``1/(sqrt(v̂)+eps)`` once the optimiser has taken 5 steps; it is kept flattened per
bucket and refreshed after each optimiser step with one ``cat`` and four element-wise ops per run of
parameters of one group. Estimates are smoothed per parameter group (``GradNoiseState``).

The optimiser's ``step`` and ``zero_grad`` (and an AMP scaler's ``step``/``update``/``unscale_``) are
wrapped: during accumulation micro-steps they do nothing (the loader drives ``no_sync``), the final
step multiplies each group's learning rate by ``λ = rule(S, stats)`` for the duration of the update,
and progress grows by ``gain(S)``.
"""

from __future__ import annotations

import logging
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pollux.contract import EVENT_FIRST_STEP, format_event
from pollux.goodput import (
    GradStats,
    ScalingRule,
    gain,
    scaling_rule_for,
)
from pollux.torch.api import BatchLoader, StepInfo, SyncOutcome
from pollux.torch.context import AgentContext, get_context
from pollux.torch.decisions import MIN_UNBIASED, Evidence
from pollux.torch.gradstats import GradTracker
from pollux.torch.oom import first_batch_dim, free_memory, is_oom, placeholder_forward, synthetic_oom

logger = logging.getLogger("pollux.torch")

#: The first refit waits for this many steps with gradient statistics (one noisy estimate could
#: floor sqr at 0, which makes every batch size look perfectly efficient). Batch-size decisions wait
#: for more, all unbiased (``pollux.torch.decisions.MIN_UNBIASED``).
MIN_STATS_UPDATES = 10


def _delegate(target: Callable[..., Any]) -> Callable[..., Any]:
    """A function whose first argument (the object it is bound to) is dropped before calling target."""
    def method(_owner: Any, *args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    method.__doc__ = getattr(target, "__doc__", None)
    return method


def _announce_first_step(ctx: AgentContext) -> None:
    """Once per run: the moment this replica trains again after a (re)start.

    Written twice: a sentence on the ``pollux.torch`` logger for people, and the structured event
    :data:`pollux.contract.EVENT_FIRST_STEP` on the process's stderr (a replica's stdout and stderr
    are its log file under the service, whatever the script did with ``logging``), which tools such as
    the re-allocation benchmark read with :func:`pollux.contract.parse_events`.
    """
    logger.info("first optimizer step of this run done (rank %d of %d)", ctx.rank, ctx.replicas)
    line = format_event(EVENT_FIRST_STEP, time.time(), rank=ctx.rank, replicas=ctx.replicas,
                        restarts=ctx.env.restarts)
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):   # pragma: no cover - stderr closed: the event is informational
        pass


class _ModuleState:
    """The wrapped module's parameters and buffers, as a checkpoint state."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)


def _pollux_comm_hook(tracker, bucket):  # unannotated: DDP checks the annotations of comm hooks
    """All-reduce the mean of the bucket over replicas and micro-steps, measuring squared norms.

    The local norms are taken before the all-reduce. The norms of the averaged gradient are taken in
    the completion callback when gradients are views of the buckets (the default: user code may
    modify them in place before the optimiser step), else at the end of the step in the training
    thread (``GradTracker.finish``). The first bucket of each step also carries the step's control
    flags and the previous step's local norms, appended to a reused copy of it (that bucket is
    small: DDP caps it at about 1 MiB).
    """
    info = tracker.step
    if info is not None and info.step_time is not None:
        info.compute_end = time.perf_counter()     # balancing: this replica's gradients are ready
        if info.compute_event is not None:         # CUDA: when they are ready on the device
            info.compute_event.record()
    buf = bucket.buffer()
    lay = tracker.layout(bucket)
    sid = info.sid if info is not None else -1
    mode = tracker.mode
    if mode == "bucket":
        tracker.local_norms(lay, buf)
    if tracker.divisor != 1.0:
        buf.div_(tracker.divisor)
    numel = buf.numel()
    send = buf
    if bucket.index() == 0:
        flags = tracker.ctx.outgoing_flags()
        if buf.dtype in (torch.float32, torch.float64):
            packet = tracker.packet(flags)
            size = numel + packet.numel()
            send = lay.send
            if send is None or send.numel() != size or send.dtype != buf.dtype:
                send = lay.send = torch.empty(size, dtype=buf.dtype, device=buf.device)
            send[:numel].copy_(buf)
            send[numel:].copy_(packet)
        else:
            tracker.launch_packet(sid, flags)
    fut = dist.all_reduce(send, group=tracker.process_group, async_op=True).get_future()
    in_callback = tracker.totals_in_callback and mode != "off"

    def done(f: torch.futures.Future) -> torch.Tensor:
        out = f.value()[0]
        if out.numel() > numel:
            tracker.receive(sid, out[numel:])
            out = out[:numel]
        if in_callback:
            tracker.total_norms(lay, out, sid)
        else:
            lay.result, lay.result_sid = out, sid
        return out

    return fut.then(done)


class WrapperState:
    """The wrapper's own checkpointed state: progress, optimiser updates, λ and the gradient statistics.

    ``AdaptiveDataParallel`` keeps its counters here and registers this object as ``pollux_adp``, so
    the checkpoint goes through ``state_dict``/``load_state_dict`` (the wrapper's own ``state_dict`` is
    the module's, as in DDP).
    """

    def __init__(self, tracker: GradTracker) -> None:
        self.tracker = tracker
        self.progress = 0.0       # scale-invariant iterations
        self.steps = 0            # optimiser updates applied
        self.lr_factor = 1.0      # λ of the last update

    def state_dict(self) -> dict[str, Any]:
        return {"progress": self.progress, "steps": self.steps, "lr_factor": self.lr_factor,
                "grad": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.progress = float(state["progress"])
        self.steps = int(state["steps"])
        self.lr_factor = float(state.get("lr_factor", 1.0))
        self.tracker.load_state_dict(state["grad"])


class AdaptiveDataParallel(DistributedDataParallel):
    """DistributedDataParallel with gradient-noise statistics, LR scaling and checkpointed state.

    ``optimizer`` must be the optimiser of ``module``'s parameters; its ``step`` and ``zero_grad``
    are wrapped (see the module docstring). ``lr_scheduler`` and ``scaler`` (an AMP GradScaler) are
    checkpointed with the model; the user keeps calling them as usual. ``scaling_rule`` defaults to
    AdaScale for SGD-like optimisers and the square-root rule for the Adam family. Other keyword
    arguments go to ``DistributedDataParallel``. The process group is the default one
    (:func:`pollux.torch.init_process_group` is called if it is not initialised yet).
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, scaler: Any = None, scaling_rule: ScalingRule | None = None,
                 **ddp_kwargs: Any) -> None:
        ctx = get_context()
        if ctx.adp is not None:
            raise RuntimeError("only one AdaptiveDataParallel per process is supported")
        ctx.registry.register("model", _ModuleState(module))   # before DDP broadcasts rank 0's weights
        # Gradients as views of the communication buckets: saves DDP's two copies per step between
        # gradients and buckets, which pays for the statistics (override with False if needed).
        ddp_kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(module, **ddp_kwargs)
        self._ctx = ctx
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.scaler = scaler
        self.scaling_rule: ScalingRule = scaling_rule or scaling_rule_for(type(optimizer).__name__)
        self._logged_first_step = False
        self._inject_ooms = 0
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        self._on_cuda = device.type == "cuda"
        self._tracker = GradTracker(optimizer, device, self.process_group,
                                    totals_in_callback=bool(getattr(self, "gradient_as_bucket_view", False)))
        self._tracker.ctx = ctx
        self._state = WrapperState(self._tracker)
        ctx.registry.register("optimizer", optimizer)
        if lr_scheduler is not None:
            ctx.registry.register("lr_scheduler", lr_scheduler)
        if scaler is not None:
            ctx.registry.register("grad_scaler", scaler)
        ctx.registry.register("pollux_adp", self._state)
        self._tracker.after_optimizer_step()   # a restored Adam state activates the pre-conditioner
        self.register_comm_hook(self._tracker, _pollux_comm_hook)
        self._orig_step = optimizer.step
        self._orig_zero_grad = optimizer.zero_grad
        # Bound to the optimiser (not to this wrapper), so that code which re-binds
        # ``optimizer.step.__func__`` to the optimiser, as torch's LR schedulers do, still works.
        step = _delegate(self._wrapped_step)
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # we set _opt_called ourselves
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = types.MethodType(  # type: ignore[method-assign]
            _delegate(self._wrapped_zero_grad), optimizer)
        # The scaler's per-iteration calls are no-ops until the final micro-step of an accumulation
        # (unscaling or updating the scale mid-way would corrupt the accumulated gradients). The LR
        # scheduler is left alone (patching it would leak into its state_dict): step it per epoch,
        # or per iteration only when ``not model.accumulating``.
        if scaler is not None:
            for name in ("step", "update", "unscale_"):
                setattr(scaler, name, types.MethodType(
                    _delegate(self._skip_while_accumulating(getattr(scaler, name))), scaler))
        ctx.adp = self

    def _skip_while_accumulating(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            info = self._ctx.step
            if info is not None and not info.finished and info.accumulating:
                return None
            return method(*args, **kwargs)

        return wrapper

    @property
    def accumulating(self) -> bool:
        """True during the non-final micro-steps of gradient accumulation (no update happens)."""
        info = self._ctx.step
        return info is not None and not info.finished and info.accumulating

    # ---------------------------------------------------------------- steps

    def begin_step(self, info: StepInfo) -> None:
        """Agent hook (called by the context when a step is announced): prepare its measurement."""
        if self.scaler is not None and self.scaler.is_enabled():
            info.scaler_scale = float(self.scaler.get_scale())
        self._tracker.begin_step(info)

    def _current_step(self) -> StepInfo:
        """The step in progress; without a loader, each forward after an update starts a new one."""
        ctx = self._ctx
        info = ctx.step
        if info is None or info.finished or (not info.managed and (info.stepped or info.skipped)):
            info = StepInfo(sid=ctx.new_sid(), replicas=ctx.replicas, micro_steps=1, local_bsz=1,
                            managed=False)
            ctx.begin_step(info)
        return info

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():          # evaluation: not part of any training step
            return super().forward(*inputs, **kwargs)
        info = self._current_step()
        if not self._oom_recoverable(info):
            return super().forward(*inputs, **kwargs)
        local_bsz = first_batch_dim((inputs, kwargs)) or info.local_bsz
        try:
            self._maybe_inject_oom(local_bsz)
            return super().forward(*inputs, **kwargs)
        except Exception as exc:
            if not is_oom(exc):
                raise
        # Outside the except block, so that the failed pass's tensors can be freed.
        logger.warning("out of memory in the forward pass at local batch size %d (rank %d): "
                       "skipping this step", local_bsz, self._ctx.rank)
        self._ctx.oom_in_step = True
        free_memory()
        # The replica must still take part in the step's all-reduces; its gradients are discarded
        # (every replica skips the update once the OOM flag is reduced).
        return placeholder_forward(super().forward, local_bsz, inputs, kwargs)

    def _oom_recoverable(self, info: StepInfo) -> bool:
        """Out-of-memory recovery applies to loader-driven steps without a user upper local bound,
        on CUDA (or when faults are injected)."""
        loader = self._ctx.active_loader
        if not info.managed or loader is None or loader.user_max_local_bsz is not None:
            return False
        return self._on_cuda or self._inject_ooms > 0 or self._ctx.fault_oom_above is not None

    def _maybe_inject_oom(self, local_bsz: int) -> None:
        if self._inject_ooms > 0:
            self._inject_ooms -= 1
            raise synthetic_oom(local_bsz)
        limit = self._ctx.fault_oom_above
        if limit is not None and local_bsz > limit:
            raise synthetic_oom(local_bsz)

    def release_process_group(self) -> None:
        """Agent hook: drop the references this wrapper holds to the process group, which the context
        is tearing down (see ``AgentContext.shutdown``). The wrapper is unusable afterwards."""
        self._tracker.process_group = None
        for name in ("reducer", "logger"):
            if name in self.__dict__:
                delattr(self, name)
        self.__dict__["process_group"] = None

    def inject_oom(self, times: int = 1) -> None:
        """Fault injection (tests): the next ``times`` forward passes raise a synthetic CUDA OOM.

        Only effective where out-of-memory recovery applies: in a loader-driven step of a loader
        without an upper local batch bound.
        """
        self._inject_ooms += max(int(times), 0)

    def finish_sync(self, info: StepInfo) -> SyncOutcome:
        """Agent hook: complete the step's statistics and return what the replicas agreed on (the
        flags of the step's all-reduce). Idempotent per step."""
        return self._tracker.finish(info)

    def discard_gradients(self) -> None:
        """Agent hook: drop the step's gradients (every replica skips an update one of them could not
        compute, after an out-of-memory error)."""
        self._orig_zero_grad(set_to_none=True)

    def _wrapped_zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        info = self._ctx.step
        if (info is not None and info.managed and not info.finished and not info.stepped
                and not info.skipped and (info.micro > 0 or info.nonfinal_step_called)):
            return None    # inside gradient accumulation: keep the accumulated gradients
        return self._orig_zero_grad(*args, **kwargs)

    def _wrapped_step(self, *args: Any, **kwargs: Any) -> Any:
        ctx = self._ctx
        info = ctx.step
        if info is None or info.finished:
            info = self._current_step()
        if info.accumulating:
            info.nonfinal_step_called = True
            return None
        if info.skipped:
            return None
        if info.stepped:
            return self._orig_step(*args, **kwargs)
        outcome = self._tracker.finish(info)
        if outcome.oom:
            info.skipped = True
            self.discard_gradients()
            return None
        stats = self._tracker.stats()
        factor = float(self.scaling_rule(info.scale, stats, self._epoch_fraction()))
        groups = self.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        try:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr * factor
            result = self._orig_step(*args, **kwargs)
        finally:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr
        info.stepped = True
        # What torch's LR schedulers check (see __init__): a private flag of torch's, set on purpose.
        self.optimizer._opt_called = True  # type: ignore[attr-defined]
        self._state.lr_factor = factor
        self._state.steps += 1
        if not self._logged_first_step:
            self._logged_first_step = True
            _announce_first_step(ctx)
        self._state.progress += float(gain(info.nominal_scale, stats.sqr, stats.var)) * info.fraction
        self._tracker.after_optimizer_step()
        if not info.managed:
            info.finished = True
            if outcome.sigterm and ctx.registry.enabled:
                ctx.preempt()
        return result

    def expected_progress(self, info: StepInfo) -> float:
        """Progress the step ``info`` will add with the current statistics (gain(S) × its fraction)."""
        stats = self._tracker.stats()
        return float(gain(info.nominal_scale, stats.sqr, stats.var)) * info.fraction

    def _epoch_fraction(self) -> float:
        loader = self._ctx.active_loader
        if loader is None:
            return float(self._ctx.epoch_state.epoch)
        return self._state.progress * loader.init_batch_size / loader.dataset_len

    # ---------------------------------------------------------------- accessors

    @property
    def progress(self) -> float:
        """Training progress in scale-invariant iterations (M0-sized steps)."""
        return self._state.progress

    @property
    def steps(self) -> int:
        """Optimiser steps applied so far."""
        return self._state.steps

    @property
    def grad_stats(self) -> GradStats:
        """Smoothed (sqr, var) summed over parameter groups (var at batch size M0)."""
        return self._tracker.stats()

    @property
    def grad_stats_per_group(self) -> list[GradStats]:
        return [s.stats() for s in self._tracker.states]

    @property
    def stats_ready(self) -> bool:
        """Whether enough steps were measured for the statistics to drive batch-size decisions."""
        return self._tracker.updates >= MIN_STATS_UPDATES

    @property
    def unbiased_updates(self) -> int:
        """Steps that gave an unbiased (multi-sample) estimate of the gradient statistics."""
        return self._tracker.unbiased_updates

    @property
    def decision_ready(self) -> bool:
        """Whether the statistics may drive batch-size decisions: enough unbiased estimates."""
        return self._tracker.unbiased_updates >= MIN_UNBIASED

    def evidence(self) -> Evidence:
        """Smoothed statistics with their standard errors and the count of unbiased estimates."""
        return self._tracker.evidence()

    @property
    def biased_stats(self) -> bool:
        """True while the statistics come only from the differenced (biased) estimator."""
        return not any(s.has_unbiased for s in self._tracker.states)

    def _loader(self) -> BatchLoader | None:
        ctx = self._ctx
        if ctx.active_loader is not None:
            return ctx.active_loader
        return ctx.loaders[-1] if ctx.loaders else None

    @property
    def init_batch_size(self) -> int | None:
        loader = self._loader()
        return None if loader is None else loader.init_batch_size

    @property
    def batch_size(self) -> int | None:
        """Current total batch M = K·m·(s+1) (None before a loader exists)."""
        loader = self._loader()
        return None if loader is None else loader.current_batch_size

    @property
    def scale(self) -> float:
        loader = self._loader()
        if loader is None:
            return 1.0
        return loader.current_batch_size / loader.init_batch_size

    @property
    def pgns(self) -> float:
        """Pre-conditioned gradient noise scale φ = var·M0/sqr (inf when sqr is 0)."""
        m0 = self.init_batch_size or 1
        return self.grad_stats.pgns(m0)

    @property
    def gain(self) -> float:
        """gain(S) at the current batch: M0-steps of progress per optimiser step."""
        stats = self.grad_stats
        return float(gain(self.scale, stats.sqr, stats.var))

    @property
    def efficiency(self) -> float:
        return self.gain / self.scale

    @property
    def lr_factor(self) -> float:
        """λ applied to the learning rate at the last optimiser step."""
        return self._state.lr_factor

    def to_scalars(self) -> dict[str, float]:
        """Scalars for TensorBoard or logs (``writer.add_scalar(k, v, step)`` for each)."""
        stats = self.grad_stats
        loader = self._loader()
        out = {
            "progress": self._state.progress,
            "steps": float(self._state.steps),
            "epoch": float(self._ctx.epoch_state.epoch),
            "grad_sqr": stats.sqr,
            "grad_var": stats.var,
            "pgns": self.pgns,
            "gain": self.gain,
            "efficiency": self.efficiency,
            "lr_factor": self._state.lr_factor,
            "replicas": float(self._ctx.replicas),
        }
        if loader is not None:
            out.update({"batch_size": float(loader.current_batch_size),
                        "local_bsz": float(loader.local_bsz),
                        "accum_steps": float(loader.accumulation_steps)})
        if self._ctx.balance_report is not None:      # LB-BSP: shares and compute times per rank
            out.update(self._ctx.balance_report.scalars())
        return out
