"""``AdaptiveDataParallel``: DDP that measures the gradient noise and scales the learning rate (SPEC §2, §8).

The wrapper is the DDP module the training script calls; its parts live beside it, one concern each:

* :mod:`pollux.torch.comm_hook`: the DDP communication hook, which all-reduces each gradient bucket
  and measures its squared norms (no extra collective: the step's control flags ride on the first
  bucket);
* :mod:`pollux.torch.gradstats`: the measurements themselves (``GradTracker``);
* :mod:`pollux.torch.optimizer_patch`: the optimiser's patched ``step``/``zero_grad`` (and an AMP
  scaler's calls), which do nothing during accumulation micro-steps and scale the learning rate by
  ``λ = rule(S, stats)`` for the update, and the counters it advances (``WrapperState``);
* :mod:`pollux.torch.oom_guard`: when the forward pass absorbs an out-of-memory error, and fault
  injection.

From the measurements the unbiased estimator gives (sqr, var) with n = K samples. With gradient
accumulation (s ≥ 1), each micro-batch gradient's norm is taken by a tensor hook as it arrives
(n = K·(s+1), so one replica with accumulation has real multi-sample estimates). One replica without
accumulation uses the differenced estimator over consecutive steps (marked biased). The squared norms
use the Adam pre-conditioner ``1/(sqrt(v̂)+eps)`` once the optimiser has taken 5 steps; it is kept
flattened per bucket and refreshed after each optimiser step with one ``cat`` and four element-wise
ops per run of parameters of one group. Estimates are smoothed per parameter group
(``GradNoiseState``).

What stays here is what needs the DDP module itself: the forward pass, the checkpoint registrations,
the agent's step hooks and the read-only accessors scripts use (progress, statistics, batch size).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from pollux.goodput import (
    GradStats,
    ScalingRule,
    gain,
    scaling_rule_for,
)
from pollux.torch.api import BatchLoader, StepInfo, SyncOutcome
from pollux.torch.comm_hook import pollux_comm_hook
from pollux.torch.context import get_context
from pollux.torch.decisions import MIN_UNBIASED, Evidence
from pollux.torch.gradstats import GradTracker
from pollux.torch.oom import first_batch_dim, is_oom, placeholder_forward
from pollux.torch.oom_guard import ForwardOomGuard
from pollux.torch.optimizer_patch import PatchedOptimizer, WrapperState, current_step

#: The first refit waits for this many steps with gradient statistics (one noisy estimate could
#: floor sqr at 0, which makes every batch size look perfectly efficient). Batch-size decisions wait
#: for more, all unbiased (``pollux.torch.decisions.MIN_UNBIASED``).
MIN_STATS_UPDATES = 10


class _ModuleState:
    """The wrapped module's parameters and buffers, as a checkpoint state."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)


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
        rule = scaling_rule or scaling_rule_for(type(optimizer).__name__)
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        self._oom_guard = ForwardOomGuard(ctx, on_cuda=device.type == "cuda")
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
        self.register_comm_hook(self._tracker, pollux_comm_hook)
        self._optimizer_patch = PatchedOptimizer(ctx, optimizer, scaler, rule, self._tracker, self._state)
        ctx.adp = self

    @property
    def scaling_rule(self) -> ScalingRule:
        """The rule giving λ from the scale and the statistics at each update (may be replaced)."""
        return self._optimizer_patch.scaling_rule

    @scaling_rule.setter
    def scaling_rule(self, rule: ScalingRule) -> None:
        self._optimizer_patch.scaling_rule = rule

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

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():          # evaluation: not part of any training step
            return super().forward(*inputs, **kwargs)
        info = current_step(self._ctx)
        if not self._oom_guard.recoverable(info):
            return super().forward(*inputs, **kwargs)
        local_bsz = first_batch_dim((inputs, kwargs)) or info.local_bsz
        try:
            self._oom_guard.maybe_inject(local_bsz)
            return super().forward(*inputs, **kwargs)
        except Exception as exc:
            if not is_oom(exc):
                raise
        # Outside the except block, so that the failed pass's tensors can be freed.
        self._oom_guard.absorb(local_bsz)
        # The replica must still take part in the step's all-reduces; its gradients are discarded
        # (every replica skips the update once the OOM flag is reduced).
        return placeholder_forward(super().forward, local_bsz, inputs, kwargs)

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
        self._oom_guard.inject(times)

    def finish_sync(self, info: StepInfo) -> SyncOutcome:
        """Agent hook: complete the step's statistics and return what the replicas agreed on (the
        flags of the step's all-reduce). Idempotent per step."""
        return self._tracker.finish(info)

    def discard_gradients(self) -> None:
        """Agent hook: drop the step's gradients (every replica skips an update one of them could not
        compute, after an out-of-memory error)."""
        self._optimizer_patch.discard_gradients()

    def expected_progress(self, info: StepInfo) -> float:
        """Progress the step ``info`` will add with the current statistics (gain(S) × its fraction)."""
        stats = self._tracker.stats()
        return float(gain(info.nominal_scale, stats.sqr, stats.var)) * info.fraction

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
