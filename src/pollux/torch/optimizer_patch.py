"""The optimiser's side of ``AdaptiveDataParallel``: its patched ``step``/``zero_grad``, λ and progress.

The optimiser's ``step`` and ``zero_grad`` (and an AMP scaler's ``step``/``update``/``unscale_``) are
wrapped: during accumulation micro-steps they do nothing (the loader drives ``no_sync``), the final
step multiplies each group's learning rate by ``λ = rule(S, stats)`` for the duration of the update,
and progress grows by ``gain(S)``.

This lives apart from the wrapper (a DDP module) because it needs nothing of DDP: it holds the
optimiser's original methods, the scaling rule and the counters each update advances
(:class:`WrapperState`, checkpointed as ``pollux_adp``), and reads the statistics from the
``GradTracker``.
"""

from __future__ import annotations

import logging
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from pollux.contract import EVENT_FIRST_STEP, format_event
from pollux.goodput import ScalingRule, gain
from pollux.torch.api import StepInfo
from pollux.torch.context import AgentContext
from pollux.torch.gradstats import GradTracker

logger = logging.getLogger("pollux.torch")


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


def current_step(ctx: AgentContext) -> StepInfo:
    """The step in progress; without a loader, each forward after an update starts a new one."""
    info = ctx.step
    if info is None or info.finished or (not info.managed and (info.stepped or info.skipped)):
        info = StepInfo(sid=ctx.new_sid(), replicas=ctx.replicas, micro_steps=1, local_bsz=1,
                        managed=False)
        ctx.begin_step(info)
    return info


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


class PatchedOptimizer:
    """An optimiser (and AMP scaler) whose calls follow the agent's steps (see the module docstring).

    Constructing it patches ``optimizer.step`` and ``optimizer.zero_grad`` and, with a scaler, the
    scaler's ``step``, ``update`` and ``unscale_``; the optimiser's originals are kept here. Each
    applied update advances ``state`` (progress, steps, λ).
    """

    def __init__(self, ctx: AgentContext, optimizer: torch.optim.Optimizer, scaler: Any,
                 scaling_rule: ScalingRule, tracker: GradTracker, state: WrapperState) -> None:
        self._ctx = ctx
        self.optimizer = optimizer
        self.scaling_rule = scaling_rule
        self._tracker = tracker
        self._state = state
        self._logged_first_step = False
        self._orig_step = optimizer.step
        self._orig_zero_grad = optimizer.zero_grad
        # Bound to the optimiser (not to this object), so that code which re-binds
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

    def _skip_while_accumulating(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            info = self._ctx.step
            if info is not None and not info.finished and info.accumulating:
                return None
            return method(*args, **kwargs)

        return wrapper

    def discard_gradients(self) -> None:
        """Drop the step's gradients with the optimiser's own ``zero_grad`` (the patched one would
        keep them inside an accumulation)."""
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
            info = current_step(ctx)
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

    def _epoch_fraction(self) -> float:
        """Epochs trained so far, as the scaling rule reads them: the epoch counter without an active
        loader, else the progress (M0-sized steps) times M0 over the dataset's length."""
        loader = self._ctx.active_loader
        if loader is None:
            return float(self._ctx.epoch_state.epoch)
        return self._state.progress * loader.init_batch_size / loader.dataset_len
