"""Unequal per-replica batches (LB-BSP, SPEC §10) in the agent: the loader's share state.

Replicas of one job do not always run at the same speed (mixed devices, a noisy neighbour); with
bulk-synchronous training every step then waits for the slowest. LB-BSP gives each replica its own
share ``x_r`` of every micro-step chunk (``Σ x_r = K·m``, so the global batch the goodput optimiser
chose is unchanged) such that all replicas finish their compute together. The parts:

* the sampler hands replica r a contiguous sub-range of each chunk (:mod:`pollux.torch.sampler`);
* the DDP hook weights replica r's mean gradient by ``x_r/Σx`` instead of ``1/K``, so the update is
  the mean gradient of the whole batch (:mod:`pollux.torch.gradstats`, ``GradTracker.begin_step``);
* the gradient statistics use the unequal-size estimator (``goodput.efficiency.estimate_unequal``);
* this module: :class:`LoaderBalance` keeps the shares of one loader, measures this replica's compute
  time (forward + backward up to its last gradient bucket, not the wait for the others), and feeds the
  replicas' times — gathered in the control packet the first gradient bucket already carries, one step
  late, no extra collective — to a balancer of :mod:`pollux.balance.balancers`. Every replica computes the
  same shares from the same gathered numbers (each replica fills only its own slot of a sum, so the
  values are bit-identical everywhere), so no broadcast is needed.

Balancing is off unless the script calls ``loader.balance_batches(mode)`` or ``POLLUX_BALANCE`` is set.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pollux.balance.balancers import (
    Balancer,
    CpuBalancer,
    make_balancer,
    proportional_shares,
    stragglers,
)
from pollux.contract import BALANCE_MODES, ENV_BALANCE
from pollux.torch.api import BatchConfig

logger = logging.getLogger("pollux.torch")

#: Steps of a new configuration (start, restart, other replicas or local batch) whose compute times
#: are not used: the first step includes one-time work (DDP's bucket rebuild, allocator warm-up), as
#: in the throughput profiler, which drops it too.
WARMUP_STEPS = 1
#: The balancer is updated once the measured steps with the same shares add up to this much compute
#: (the slowest replica's), with their mean times: on short steps an update per step would cost more
#: than it gains (the CPU algorithm's NARX predictor refits a small network every 25 updates) and
#: would follow every noisy step; steps longer than this update at every step, as in the paper.
BALANCE_WINDOW_S = 0.02
#: The CPU balancer's window doubles after every update that kept the shares, up to this much, and
#: falls back to :data:`BALANCE_WINDOW_S` when the shares change or the replicas' relative speeds
#: shift (:data:`SHIFT_FACTOR`): in a steady state each update costs (two speed predictions, a split)
#: without gaining anything, and a longer window averages the step times' noise, while a shift
#: restarts the window at once. (0.08 s until the shift check existed; at 0.32 s the balancer's own
#: work fell from ~170 to ~52 µs per 43 ms step of the LB-BSP benchmark.)
BALANCE_WINDOW_MAX_S = 0.32
#: The CPU balancer's first update of a configuration, and its first after a change of shares, pools
#: at least this many steps: the first move is the largest (from equal shares straight to the
#: proportional ones) and the next one settles it, and one step's times carry a few % of noise on a
#: shared machine, which the dead band would then leave in place.
FIRST_WINDOW_STEPS = 2
#: A window restarts from the newest step when the replicas' speeds relative to each other changed by
#: more than this factor against the window's mean (the largest over the smallest of the replicas'
#: new/mean time ratios): pooled across such a change (a new straggler, a slowdown that moved), the
#: mean times lie between the old and the new state, and the balancer made a partial move first and
#: the real one a window later (4–7 steps after the change in the LB-BSP benchmark). A replica slowed
#: 2× gives 2, a slowdown that moves from one replica to the other 4; a few % of step noise stays far
#: below 1.5 (the equal-speed section of the benchmark kept 0–3 share changes per 180-step block with
#: the check on). The restarted window pools FIRST_WINDOW_STEPS steps, so one hiccup alone does not
#: move the shares.
SHIFT_FACTOR = 1.5
#: A replica whose device memory use is above this fraction may not grow its share (GPU algorithm).
MEMORY_FRACTION = 0.95


def parse_mode(mode: Any, *, name: str = "balance") -> str | None:
    """A balance mode: "auto", "gpu" or "cpu"; "off" and None mean no balancing (None).

    Anything else is a ``ValueError`` naming ``name`` (the argument or the environment variable) and
    the choices.
    """
    if mode is None:
        return None
    if isinstance(mode, str) and mode.strip().lower() in BALANCE_MODES:
        value = mode.strip().lower()
        return None if value == "off" else value
    raise ValueError(f"{name}: expected one of {', '.join(repr(m) for m in BALANCE_MODES)} or None, "
                     f"got {mode!r}")


def env_mode() -> str | None:
    """The default balance mode from ``POLLUX_BALANCE`` (unset or empty: off)."""
    text = os.environ.get(ENV_BALANCE, "").strip()
    return parse_mode(text, name=ENV_BALANCE) if text else None


def speeds_shifted(mean: np.ndarray, new: np.ndarray, factor: float) -> bool:
    """Whether the replicas' relative speeds changed by more than ``factor`` between a window's
    mean times and a new step's (the largest over the smallest of the per-replica ratios)."""
    ratio = new / mean
    return bool(ratio.max() > factor * ratio.min())


@dataclass(frozen=True, slots=True)
class BalanceReport:
    """The balancer's latest state, for the log, ``to_scalars()`` and the hints' ``balance`` field.

    ``shares`` are the micro-batch sizes per rank in force, ``step_times`` the compute seconds per rank
    of the last measured step, ``predicted_step_time`` what the balancer expects for these shares and
    ``stragglers`` the ranks held at the minimum share.
    """

    mode: str
    shares: tuple[int, ...]
    step_times: tuple[float, ...]
    predicted_step_time: float
    stragglers: tuple[int, ...] = ()

    def as_hints(self) -> dict[str, Any]:
        predicted = self.predicted_step_time
        if not math.isfinite(predicted) or predicted < 0:
            predicted = max(self.step_times, default=0.0)
        return {"mode": self.mode, "shares": list(self.shares), "step_times": list(self.step_times),
                "predicted_step_time": float(predicted), "stragglers": list(self.stragglers)}

    def scalars(self) -> dict[str, float]:
        out = {"balance_predicted_step_time": float(self.predicted_step_time),
               "balance_stragglers": float(len(self.stragglers))}
        for r, (x, t) in enumerate(zip(self.shares, self.step_times, strict=True)):
            out[f"balance_share{r}"] = float(x)
            out[f"balance_step_time{r}"] = float(t)
        return out


@dataclass(slots=True)
class LoaderBalance:
    """Shares of one ``AdaptiveDataLoader`` and the balancer that moves them (see the module docstring).

    ``shares`` hold for the configuration ``key = (K, m)``; None means equal shares. The loader asks
    :meth:`shares_for` before each step, :meth:`outgoing_time` for the value its packet carries, and
    calls :meth:`after_step` once the replicas agreed on the step.
    """

    cuda: bool = False
    mode: str | None = None
    balancer: Balancer | None = None
    shares: tuple[int, ...] | None = None
    key: tuple[int, int] | None = None
    prev_used: tuple[int, ...] | None = None      # effective shares of the last step (None: unusable)
    last_time: float = 0.0                        # this replica's compute time of that step
    report: BalanceReport | None = None
    warned: set[int] = field(default_factory=set)
    warmup: int = 0                               # steps of a new configuration not yet timed
    window: tuple[tuple[int, ...], np.ndarray, int] | None = None   # (shares, summed times, steps)
    window_s: float = BALANCE_WINDOW_S            # compute seconds pooled per update (see above)
    window_steps: int = 1                         # and at least this many steps

    def set_mode(self, mode: Any, *, name: str = "balance") -> None:
        self.mode = parse_mode(mode, name=name)
        self.balancer = make_balancer(self.mode, cuda=self.cuda)
        self.shares, self.key, self.prev_used, self.report = None, None, None, None

    @property
    def enabled(self) -> bool:
        return self.balancer is not None

    def active(self, replicas: int) -> bool:
        return self.balancer is not None and replicas >= 2

    @property
    def algorithm(self) -> str:
        return "cpu" if isinstance(self.balancer, CpuBalancer) else "gpu"

    # ---------------------------------------------------------------- before a step

    def shares_for(self, cfg: BatchConfig, lo: int, hi: int | None) -> tuple[int, ...] | None:
        """Shares for a step of ``cfg`` (None: equal). A new replica count starts from equal shares; a
        new local batch on the same replicas keeps their proportions."""
        k, m = cfg.replicas, cfg.local_bsz
        if not self.active(k):
            return None
        out_of_bounds = self.shares is not None and (min(self.shares) < lo or (
            hi is not None and max(self.shares) > hi))        # a bound lowered by an OOM error
        if self.key != (k, m) or out_of_bounds:
            new = None
            if self.key is not None and self.key[0] == k and self.shares is not None:
                try:
                    new = tuple(int(x) for x in proportional_shares(k * m, self.shares, lo, hi))
                except ValueError:
                    new = None
            else:
                assert self.balancer is not None
                self.balancer.reset()
                self.prev_used = None
            self.shares, self.key = (None if new is None or len(set(new)) == 1 else new), (k, m)
            self.warmup = WARMUP_STEPS
            self.window_s = BALANCE_WINDOW_S
            self.window_steps = FIRST_WINDOW_STEPS if isinstance(self.balancer, CpuBalancer) else 1
        return self.shares

    def outgoing_time(self, replicas: int) -> float | None:
        """What this replica's packet carries: its compute time of the previous step (0: none)."""
        return self.last_time if self.active(replicas) else None

    # ---------------------------------------------------------------- after a step

    def after_step(self, cfg: BatchConfig, used: tuple[int, ...] | None, compute_time: float,
                   step_times: Sequence[float] | None, lo: int, hi: int | None, rank: int,
                   progress: float) -> None:
        """Feed the gathered times of the previous step to the balancer; remember this step's.

        ``used`` are this step's effective shares (None for a step that cannot be measured: a tail
        step, a skipped one), ``step_times`` the packet's times (K compute times, then K memory flags).
        """
        if not self.active(cfg.replicas) or self.balancer is None:
            return
        k = cfg.replicas
        if used is not None and self.warmup > 0:     # the first step of a configuration warms it up
            self.warmup -= 1
            used = None
        prev = self.prev_used
        self.prev_used = used
        self.last_time = float(compute_time) if used is not None and compute_time > 0 else 0.0
        if step_times is None or prev is None or len(step_times) < 2 * k:
            return
        times = np.asarray(step_times[:k], dtype=np.float64)
        if not np.all(np.isfinite(times) & (times > 0)) or sum(prev) != k * cfg.local_bsz:
            return
        # Judge only shares still in force: the times of the step before a change (they arrive one
        # step late) would be weighed against the shares it had, and move the new ones again.
        if prev != (self.shares if self.shares is not None else (cfg.local_bsz,) * k):
            self.window = None
            return
        # Steps with the same shares are pooled until they add up to the window (window_s), but
        # not across a change of the replicas' relative speeds (SHIFT_FACTOR).
        if self.window is not None and self.window[0] == prev:
            summed, steps = self.window[1] + times, self.window[2] + 1
            if speeds_shifted(self.window[1] / self.window[2], times, SHIFT_FACTOR):
                summed, steps = times, 1
                self.window_s = BALANCE_WINDOW_S
                if isinstance(self.balancer, CpuBalancer):
                    self.window_steps = FIRST_WINDOW_STEPS
        else:
            summed, steps = times, 1
        if float(summed.max()) < self.window_s or steps < self.window_steps:
            self.window = (prev, summed, steps)
            return
        self.window, self.window_steps = None, 1
        times = summed / steps
        memory_ok = [bool(f < 0.5) for f in step_times[k:2 * k]]
        hi_eff = hi if hi is not None else k * cfg.local_bsz
        new = tuple(int(x) for x in self.balancer.update(list(prev), times, lo, hi_eff,
                                                         memory_ok=memory_ok))
        current = self.shares if self.shares is not None else (cfg.local_bsz,) * k
        slow = tuple(stragglers(new, lo)) if len(set(new)) > 1 else ()
        self.report = BalanceReport(self.algorithm, new, tuple(float(t) for t in times),
                                    float(self.balancer.predicted_step_time), slow)
        if new != current:
            self.shares = None if len(set(new)) == 1 else new
            self.window_s = BALANCE_WINDOW_S
            if isinstance(self.balancer, CpuBalancer):
                self.window_steps = FIRST_WINDOW_STEPS
            if rank == 0:
                self._log_change(cfg, current, progress)
        elif isinstance(self.balancer, CpuBalancer):
            self.window_s = min(2.0 * self.window_s, BALANCE_WINDOW_MAX_S)
        self._warn_stragglers(slow, lo, rank)

    def _log_change(self, cfg: BatchConfig, old: tuple[int, ...], progress: float) -> None:
        rep = self.report
        assert rep is not None
        reason = getattr(self.balancer, "last_move", None)
        logger.info("batch shares %s -> %s (%s balancer%s, local batch %d on %d replicas): compute times "
                    "%s ms measured, %.1f ms predicted", list(old), list(rep.shares), rep.mode,
                    f", {reason}" if reason else "", cfg.local_bsz, cfg.replicas,
                    [round(t * 1e3, 2) for t in rep.step_times], rep.predicted_step_time * 1e3)
        payload = {"config": cfg.to_list(), "from": list(old), "to": list(rep.shares), "mode": rep.mode,
                   "reason": reason,
                   "step_times": list(rep.step_times),
                   "predicted_step_time": rep.predicted_step_time
                   if math.isfinite(rep.predicted_step_time) else None,
                   "stragglers": list(rep.stragglers), "progress": progress}
        logger.info("balance %s", json.dumps(payload, sort_keys=True, allow_nan=False))

    def _warn_stragglers(self, slow: tuple[int, ...], lo: int, rank: int) -> None:
        for r in slow:
            if r not in self.warned and rank == 0:
                logger.warning("replica %d is a straggler: its batch share fell to the minimum (%d); "
                               "consider removing it from the job", r, lo)
        self.warned = set(slow)

    # ---------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "shares": None if self.shares is None else list(self.shares),
                "key": None if self.key is None else list(self.key)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the shares (they apply only if the run resumes on the same replicas and batch)."""
        shares, key = state.get("shares"), state.get("key")
        if shares is not None and key is not None and self.enabled:
            self.shares = tuple(int(x) for x in shares)
            self.key = (int(key[0]), int(key[1]))
            self.warmup = WARMUP_STEPS


def memory_full(device_index: int | None) -> bool:
    """Whether this replica's CUDA device is above :data:`MEMORY_FRACTION` in use (False on CPU)."""
    if device_index is None:
        return False
    import torch

    free, total = torch.cuda.mem_get_info(device_index)
    return total > 0 and 1.0 - free / total > MEMORY_FRACTION


class StepTimer:
    """This replica's compute time of one step: every micro-step from the moment the user holds its
    batch, the final one only up to its last gradient bucket (the DDP hook notes the moment in
    ``StepInfo.compute_end``, and on CUDA records ``StepInfo.compute_event``), so the wait for the
    other replicas' all-reduce is not counted."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.total = 0.0
        self._t0 = 0.0
        self._ev0: Any = None

    def start(self, info: Any) -> None:
        import time

        info.compute_end = None
        if self.cuda:
            import torch

            self._ev0 = torch.cuda.Event(enable_timing=True)
            info.compute_event = torch.cuda.Event(enable_timing=True)
            self._ev0.record()
        self._t0 = time.perf_counter()

    def stop(self, info: Any, final: bool) -> None:
        """After the micro-step (the loader has synchronised the device)."""
        import time

        now = time.perf_counter()
        end = info.compute_end if final else None
        if end is None or end < self._t0:
            self.total += now - self._t0
        elif self.cuda and info.compute_event is not None:
            try:
                self.total += self._ev0.elapsed_time(info.compute_event) / 1e3
            except RuntimeError:            # the event was not recorded: fall back to the host clock
                self.total += end - self._t0
        else:
            self.total += end - self._t0
