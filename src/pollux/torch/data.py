"""``AdaptiveDataLoader``: elastic, deterministic batches whose size follows the goodput model (SPEC §4, §8).

Each iteration of the loader is one epoch of training *progress*: it yields micro-batches until the
model's progress reaches ``(epoch+1)·N/M0`` scale-invariant iterations (N = dataset length), so with
S = 1 an epoch is exactly one pass. Every optimiser step is announced to the shared context; for the
non-final micro-steps of gradient accumulation the loader holds the model's ``no_sync`` context while
the user runs forward and backward, and the optimiser's ``step``/``zero_grad`` do nothing until the
final micro-step. Between steps it records step times, applies what the replicas agreed on (refit,
out-of-memory recovery, SIGTERM) and moves the global sample index.

Batch configuration: rank 0 chooses the local batch m and accumulation steps s — from the fitted
goodput model once a throughput fit exists and the gradient statistics are unbiased and numerous
enough (re-optimised at every refit, about every 30 s, within the guards of
:mod:`pollux.torch.decisions`), else the smallest configuration that reaches M0 — and broadcasts it.
Every change is logged on the ``pollux.torch`` logger with its evidence.

Probe steps: one replica without accumulation cannot measure unbiased gradient statistics from a
single gradient per step. While the batch is adaptive, such a replica splits some steps in two
micro-batches (every step until ``2 × MIN_UNBIASED`` unbiased estimates exist, then every
``PROBE_EVERY``-th): the update is the same (the mean gradient over the same examples), and the two
halves give an unbiased two-sample estimate. Their timings are profiled as the configuration they
are (local batch m/2 with one accumulation step), which also gives the throughput fit a second local
batch size.

Preemption: a SIGTERM agreed on the step that completes an epoch is honoured when the epoch ends
(after the user's end-of-epoch code), so a resumed job never re-enters an epoch with no data left.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from pollux.contract import ENV_BALANCE
from pollux.goodput import BatchLimits
from pollux.hints import build_hints
from pollux.torch import decisions
from pollux.torch.api import BatchConfig, StepInfo
from pollux.torch.context import AgentContext, get_context
from pollux.torch.decisions import DecisionRecord
from pollux.torch.loader_state import LoaderCheckpoint
from pollux.torch.microbatch import PlanBatchSampler, probe_due, record_times, split_batch
from pollux.torch.sampler import ElasticSampler
from pollux.torch.shares import LoaderBalance, StepTimer, env_mode, memory_full

logger = logging.getLogger("pollux.torch")

#: After an out-of-memory error the upper local batch bound becomes ``floor(m × OOM_BACKOFF)``.
OOM_BACKOFF = 0.75
_REJECTED_KWARGS = ("sampler", "batch_sampler", "drop_last", "batch_size")


class AdaptiveDataLoader:
    """A data loader whose global batch starts at ``batch_size`` (M0) and adapts with the job.

    ``dataset`` must be map-style (``__getitem__`` and ``__len__``). ``shuffle`` and ``seed`` define
    the per-pass permutations (seeded by ``(seed, pass)``). Other keyword arguments go to
    ``torch.utils.data.DataLoader`` (``num_workers``, ``collate_fn``, ``pin_memory``, ...); batching
    and sampling are the loader's own. The batch stays at M0 (split over the replicas) unless
    :meth:`autoscale_batch_size` is called.
    """

    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                 **kwargs: Any) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError("AdaptiveDataLoader needs a map-style dataset (with __getitem__ and __len__) "
                            "so that samples can be addressed by index and training can resume after a "
                            "restart; wrap the IterableDataset in a map-style Dataset (e.g. materialise "
                            "or index its records) or use a plain DataLoader")
        try:
            length = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError("AdaptiveDataLoader needs a map-style dataset with __len__") from None
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
        bad = [k for k in _REJECTED_KWARGS if k in kwargs]
        if bad:
            raise TypeError(f"AdaptiveDataLoader chooses batches itself; remove {', '.join(bad)}")
        self.dataset = dataset
        self.init_batch_size = int(batch_size)
        self.sampler = ElasticSampler(length, shuffle=shuffle, seed=seed)
        self._batch_sampler = PlanBatchSampler(self.sampler)
        self._dataloader = DataLoader(dataset, batch_sampler=self._batch_sampler, **kwargs)
        self._max_batch_size: int | None = None
        self._min_local = 1
        self._user_max_local: int | None = None
        self._oom_max_local: int | None = None
        self._accumulation = False
        self._config: BatchConfig | None = None
        self._config_key: tuple[Any, ...] | None = None
        self._it: Any = None
        self._it_next = -1
        self._it_cfg: BatchConfig | None = None
        self._it_shares: tuple[int, ...] | None = None
        self._warned_forced_accum = False
        self._last_decision: DecisionRecord | None = None
        self._probe_shapes: set[int] = set()
        self._deferred_note = -1
        ctx = get_context()
        self._ctx = ctx
        self._index = len(ctx.loaders)
        ctx.loaders.append(self)
        ctx.registry.register(f"pollux_loader{self._index}", self)
        self._balance = LoaderBalance(cuda=ctx.collective_device().type == "cuda")
        self._balance_registered = False
        if env_mode() is not None:
            self._set_balance(env_mode(), ENV_BALANCE)
        noted = ctx.oom_note()      # a previous run died of an out-of-memory error
        if noted is not None:
            self._oom_max_local = noted if self._oom_max_local is None else min(self._oom_max_local, noted)

    # ---------------------------------------------------------------- configuration

    def autoscale_batch_size(self, max_batch_size: int, local_bsz_bounds: tuple[int | None, int | None]
                             | None = None, gradient_accumulation: bool = False) -> None:
        """Let Pollux choose the batch size between M0 and ``max_batch_size``.

        ``local_bsz_bounds = (lo, hi)`` bounds the per-replica batch (either may be None); without
        an upper bound on a CUDA device, an out-of-memory error in the forward pass lowers it
        automatically. ``gradient_accumulation`` allows accumulation steps when the local batch
        would exceed the upper bound.
        """
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
        self._max_batch_size = int(max_batch_size)
        self._min_local = int(lo) if lo is not None else 1
        self._user_max_local = int(hi) if hi is not None else None
        self._accumulation = bool(gradient_accumulation)

    def balance_batches(self, mode: str | None = "auto") -> None:
        """Unequal per-replica batches (LB-BSP): each replica's share of every micro-step is sized at
        iteration boundaries so that all finish their compute together; the global batch is unchanged.

        ``mode``: "auto" (the GPU algorithm on CUDA, else the CPU one), "gpu", "cpu", or "off"/None.
        Without this call the mode comes from ``POLLUX_BALANCE`` (default off). See docs/agent.md.
        """
        self._set_balance(mode, "balance")

    def _set_balance(self, mode: str | None, name: str) -> None:
        self._balance.set_mode(mode, name=name)
        self._it = None
        if self._balance.enabled and not self._balance_registered:
            self._balance_registered = True
            self._ctx.registry.register(f"pollux_balance{self._index}", self._balance)

    # ---------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The loader's checkpoint (registered as ``pollux_loader<i>``): position, configuration, bounds."""
        return LoaderCheckpoint(self.sampler.state_dict(), self._config, self._config_key,
                                self._oom_max_local, self._last_decision).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = LoaderCheckpoint.from_dict(state)
        self.sampler.load_state_dict(saved.sampler)
        self._config, self._config_key = saved.config, saved.limits_key
        self._oom_max_local, self._last_decision = saved.oom_max_local, saved.last_decision

    # ---------------------------------------------------------------- configuration

    @property
    def adaptive(self) -> bool:
        return self._max_batch_size is not None and self._max_batch_size > self.init_batch_size

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size if self._max_batch_size is not None else self.init_batch_size

    @property
    def dataset_len(self) -> int:
        """Examples in the dataset (N)."""
        return self.sampler.dataset_len

    @property
    def user_max_local_bsz(self) -> int | None:
        """The upper local batch bound the user gave (None: none, so out-of-memory errors set one)."""
        return self._user_max_local

    @property
    def max_local_bsz(self) -> int | None:
        """Upper local batch bound in force: the user's, lowered by out-of-memory errors."""
        bounds = [b for b in (self._user_max_local, self._oom_max_local) if b is not None]
        return min(bounds) if bounds else None

    @property
    def min_local_bsz(self) -> int:
        hi = self.max_local_bsz
        return self._min_local if hi is None else min(self._min_local, hi)

    def limits(self) -> BatchLimits:
        """The batch limits handed to the goodput optimiser."""
        return BatchLimits(init_batch_size=self.init_batch_size, max_batch_size=self.max_batch_size,
                           min_local_bsz=self.min_local_bsz, max_local_bsz=self.max_local_bsz,
                           accumulation=self._accumulation)

    def _limits_key(self) -> tuple[Any, ...]:
        return (self.max_batch_size, self.min_local_bsz, self.max_local_bsz, self._accumulation)

    def _current(self) -> BatchConfig:
        k = self._ctx.replicas
        if self._config is not None and self._config.replicas == k:
            return self._config
        return self._default_config(k)

    @property
    def config(self) -> BatchConfig:
        """The batch configuration in force (or the one the next iteration starts with)."""
        return self._current()

    @property
    def local_bsz(self) -> int:
        """Per-replica micro-batch size m."""
        return self._current().local_bsz

    @property
    def accumulation_steps(self) -> int:
        """Gradient-accumulation steps s (micro-steps per optimiser step minus one)."""
        return self._current().accum_steps

    @property
    def current_batch_size(self) -> int:
        """Total batch M = K·m·(s+1) of the current configuration."""
        return self._current().batch_size

    batch_size = current_batch_size

    def __len__(self) -> int:
        """Approximate optimiser steps per pass at the current batch size."""
        return max(math.ceil(self.sampler.dataset_len / self.current_batch_size), 1)

    # ---------------------------------------------------------------- decisions (rank 0)

    def _default_config(self, k: int) -> BatchConfig:
        """The smallest configuration reaching M0 within the local bounds."""
        m0 = self.init_batch_size
        m, s = -(-m0 // k), 0
        hi = self.max_local_bsz
        if hi is not None and m > hi:
            if not self._accumulation and not self._warned_forced_accum:
                logger.warning("the initial batch size %d does not fit %d replicas with local batch "
                               "<= %d; using gradient accumulation although it was not enabled", m0, k, hi)
                self._warned_forced_accum = True
            s = -(-m0 // (k * hi)) - 1
            m = -(-m0 // (k * (s + 1)))
        return BatchConfig(k, max(m, self.min_local_bsz), s)

    def _step_time(self, ctx: AgentContext, config: BatchConfig) -> tuple[float, int] | None:
        """Measured (mean step time, steps) of ``config`` on the current nodes, if any."""
        return ctx.profiler.step_time(ctx.nodes, config.replicas, config.local_bsz, config.accum_steps)

    def _decide(self, ctx: AgentContext, reason: str, *, periodic: bool) -> BatchConfig:
        """Rank 0's choice of configuration on the current replicas (see :mod:`pollux.torch.decisions`)."""
        k, nodes = ctx.replicas, ctx.nodes
        current = self._config if self._config is not None and self._config.replicas == k else None
        default = self._default_config(k)
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
        reference = self._config.batch_size if self._config is not None else self.init_batch_size
        if not ctx.profiler.has_allocation(nodes, k):
            # No timed step on this allocation yet: its prediction would be the exploration prior.
            if current is not None:
                return current
            kept = decisions.keep_batch(self.limits(), k, reference) or default
            self._log_change(ctx, None, kept, reason, None, None,
                             note="keeping the total batch until this allocation is measured")
            return kept
        last = self._last_decision
        measured_last = None
        if last is not None and last.config.replicas == k:
            found = self._step_time(ctx, last.config)
            measured_last = None if found is None else found[0]
        here = self._step_time(ctx, base)
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
        left_meas = self._step_time(ctx, old) if old is not None else None
        if params is not None and evidence is not None:
            ref = ctx.profiler.max_local_bsz()
            model_new = predicted_new = decisions.predicted_step_time(params, nodes, new, ref)
            if old is not None:
                left_pred = decisions.predicted_step_time(params, nodes, old, ref)
            if left_meas is not None and left_pred is not None and left_pred > 0:
                # Anchored to the data: the model's ratio new/left times the measured step time left.
                predicted_new = model_new * left_meas[0] / left_pred
        if evidence is not None:
            self._last_decision = decisions.make_record(
                new, old if old is not None else self._config, evidence, m0,
                predicted_new if predicted_new is not None else math.nan)
        else:
            self._last_decision = None
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
        last = self._last_decision
        if last is None or last.checked or last.config.replicas != ctx.replicas:
            return
        found = self._step_time(ctx, last.config)
        if (found is None or found[1] < decisions.CHECK_AFTER_STEPS
                or not math.isfinite(last.predicted_step_s)):
            return
        decisions.log_step_time_check(last.config, last.predicted_step_s, found[0], found[1])
        self._last_decision = DecisionRecord(last.config, last.direction, last.log_pgns, last.log_pgns_se,
                                             last.predicted_step_s, checked=True)

    def _apply(self, ctx: AgentContext, choice: BatchConfig | None) -> None:
        """Every replica takes rank 0's ``choice`` (None on the other ranks) and lowered bound."""
        mine = [0, 0] if choice is None else [choice.local_bsz, choice.accum_steps]
        m, s, oom_hi = ctx.broadcast_ints([*mine, self._oom_max_local or 0])
        self._oom_max_local = oom_hi or None
        old = self._config
        self._config = BatchConfig(ctx.replicas, m, s)
        self._config_key = self._limits_key()
        if old is not None and old != self._config:
            ctx.fault_point("change")

    def _ensure_config(self, ctx: AgentContext) -> None:
        k = ctx.replicas
        ctx.profiler.note_replicas(k)
        choice: BatchConfig | None = None
        if ctx.rank == 0:
            config = self._config
            if config is not None and config.replicas == k and self._config_key == self._limits_key():
                choice = config          # resumed (or re-iterated) with the same replicas
            else:
                reason = "start" if config is None else (
                    f"replicas {config.replicas} -> {k}" if config.replicas != k else "batch limits changed")
                choice = self._decide(ctx, reason, periodic=False)
        self._apply(ctx, choice)          # rank 0's choice on every replica

    def _refit(self, ctx: AgentContext) -> None:
        choice: BatchConfig | None = None
        if ctx.rank == 0:
            fit = ctx.profiler.fit(previous=ctx.fit_params)
            ctx.fitter.mark()
            if fit is not None and fit.ok:
                ctx.fit_params = fit.params
            elif fit is not None:
                logger.warning("throughput fit failed, keeping the previous model: %s", fit.message)
            ctx.fault_point("refit")
            self._check_last_decision(ctx)
            choice = self._decide(ctx, "periodic refit", periodic=True)
            self._report_hints(ctx)
        self._apply(ctx, choice)

    def hints(self) -> dict[str, Any] | None:
        """The hints body this job would report now (None before the first throughput fit)."""
        ctx = self._ctx
        if ctx.fit_params is None:
            return None
        adp = ctx.adp
        stats = adp.grad_stats if adp is not None else None
        hi = self.max_local_bsz
        return build_hints(
            ctx.fit_params,
            stats if stats is not None else {"sqr": 1.0, "var": 1e-6},
            self.init_batch_size,
            self.max_batch_size,
            (self.min_local_bsz, hi if hi is not None else self.max_batch_size),
            self._accumulation,
            max(ctx.profiler.max_replicas_seen, ctx.replicas),
            adp.progress if adp is not None else 0.0,
            ctx.epoch_state.epoch,
            balance=None if self._balance.report is None else self._balance.report.as_hints(),
            gpu_type=ctx.env.gpu_type,
            types=ctx.type_hints((self.min_local_bsz, hi if hi is not None else self.max_batch_size)),
        )

    def _report_hints(self, ctx: AgentContext) -> None:
        if not ctx.reporter.enabled:
            return
        try:
            body = self.hints()
        except Exception as exc:
            logger.warning("could not build hints: %s", exc)
            return
        if body is not None:
            ctx.reporter.report_async(body)

    def _handle_oom(self, ctx: AgentContext, local_bsz: int) -> None:
        lowered = math.floor(local_bsz * OOM_BACKOFF)
        if lowered < 1 or lowered >= local_bsz:
            raise RuntimeError(f"out of memory at local batch size {local_bsz}: cannot lower it further")
        self._oom_max_local = lowered if self._oom_max_local is None else min(self._oom_max_local, lowered)
        if ctx.rank == 0:
            logger.warning("out of memory at local batch size %d: upper local batch bound lowered to %d",
                           local_bsz, lowered)
        choice = self._decide(ctx, "out of memory", periodic=False) if ctx.rank == 0 else None
        self._apply(ctx, choice)
        self._it = None

    # ---------------------------------------------------------------- iteration

    def _data_iter(self, start: int, cfg: BatchConfig, rank: int,
                   shares: tuple[int, ...] | None = None) -> Any:
        if self._it is None or self._it_next != start or self._it_cfg != cfg or self._it_shares != shares:
            self._batch_sampler.start_at(start, rank, cfg, shares)
            self._it = iter(self._dataloader)
            self._it_cfg, self._it_shares = cfg, shares
        return self._it

    def _sync_device(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def _probe_due(self, ctx: AgentContext, plan: Any, cfg: BatchConfig) -> bool:
        """Whether this single-replica step is split in two to measure unbiased statistics."""
        assert ctx.adp is not None
        return probe_due(self.adaptive, ctx.adp.unbiased_updates, ctx.adp.steps, plan, cfg)

    def _record_times(self, ctx: AgentContext, info: StepInfo, cfg: BatchConfig,
                      times: list[float]) -> None:
        record_times(ctx.profiler, ctx.nodes, info, cfg, times, self._probe_shapes)

    def __iter__(self) -> Iterator[Any]:
        ctx = get_context()
        adp = ctx.adp
        if adp is None:
            raise RuntimeError("create the AdaptiveDataParallel model before iterating an "
                               "AdaptiveDataLoader")
        ctx.active_loader = self
        self._ensure_config(ctx)
        n, m0 = self.dataset_len, self.init_batch_size
        epoch = ctx.epoch_state.epoch
        target = (epoch + 1) * n / m0
        tol = 1e-9 * max(1.0, target)
        rank = ctx.rank
        stepped_any = False
        consumed = 0
        if adp.progress >= target - tol and rank == 0:
            logger.warning("epoch %d has no training left (progress %.1f already reaches its end %.1f): "
                           "a step larger than a whole epoch, or an epoch iterated twice", epoch,
                           adp.progress, target)
        while adp.progress < target - tol:
            if consumed >= n and not stepped_any:
                logger.warning("a whole pass went by without an optimiser step; ending the epoch "
                               "(use a plain DataLoader for evaluation)")
                return
            cfg = self._config
            assert cfg is not None
            k, m = cfg.replicas, cfg.local_bsz
            bal = self._balance.active(k)
            shares = self._balance.shares_for(cfg, self.min_local_bsz, self.max_local_bsz) if bal else None
            plan = self.sampler.plan(self.sampler.position, k, rank, m, cfg.accum_steps, shares)
            it = self._data_iter(plan.start, cfg, rank, shares)
            batches: list[Any] | None = None
            sizes = plan.local_sizes
            probe = self._probe_due(ctx, plan, cfg)
            if probe:
                first = next(it)
                halves = split_batch(first, sizes[0])
                if halves is None:
                    probe, batches = False, [first]
                else:
                    batches = list(halves)
                    sizes = (sizes[0] // 2, sizes[0] - sizes[0] // 2)
            micro_steps = len(batches) if batches is not None else plan.micro_steps
            info = StepInfo(sid=ctx.new_sid(), replicas=k, micro_steps=micro_steps, local_bsz=m,
                            scale=plan.samples / m0, nominal_scale=plan.batch_size / m0,
                            fraction=plan.fraction, full=plan.full, micro_sizes=tuple(sizes), probe=probe,
                            shares=plan.shares, step_time=self._balance.outgoing_time(k))
            timer = StepTimer(self._balance.cuda) if bal else None
            if bal:
                info.memory_full = memory_full(torch.cuda.current_device() if self._balance.cuda else None)
            ctx.begin_step(info)
            if adp.progress + adp.expected_progress(info) >= target - tol:
                ctx.fault_point("epoch_end")
            times: list[float] = []
            completed = False
            try:
                for j in range(micro_steps):
                    batch = batches[j] if batches is not None else next(it)
                    info.micro = j
                    ctx.fault_point("step")
                    t0 = time.perf_counter()
                    if timer is not None:
                        timer.start(info)
                    if j < micro_steps - 1:
                        with adp.no_sync():
                            yield batch
                    else:
                        yield batch
                    self._sync_device()
                    times.append(time.perf_counter() - t0)
                    if timer is not None:
                        timer.stop(info, j == micro_steps - 1)
                completed = True
            finally:
                if not completed:     # the user left mid-step: the step is redone next time
                    info.finished = True
                    self._it = None
            self._it_next = plan.start + plan.advance
            outcome = ctx.finish_step()
            stepped_any = stepped_any or info.stepped
            consumed += plan.advance
            if outcome.oom:
                self._it = None     # redo the step's samples with the new configuration
            else:
                self.sampler.position = plan.start + plan.advance
                if plan.full and info.stepped:
                    self._record_times(ctx, info, cfg, times)
            if timer is not None:
                used = (plan.shares or (m,) * k) if plan.full and info.stepped and not outcome.oom else None
                self._balance.after_step(cfg, used, timer.total, outcome.step_times, self.min_local_bsz,
                                         self.max_local_bsz, rank, adp.progress)
                ctx.balance_report = self._balance.report
            if outcome.oom:                # with unequal shares the largest one ran out of memory
                self._handle_oom(ctx, max(plan.shares) if plan.shares and plan.full else m)
            if outcome.sigterm and ctx.registry.enabled:
                if adp.progress >= target - tol:
                    # The epoch's last step: preempt once the epoch has ended (its end-of-epoch code
                    # runs first, and the job resumes at the next epoch instead of an empty one).
                    if self._deferred_note != epoch and rank == 0:
                        logger.info("SIGTERM on the last step of epoch %d: preempting at the epoch's end",
                                    epoch)
                    self._deferred_note = epoch
                else:
                    ctx.preempt()
            if outcome.refit:
                self._refit(ctx)
        if not ctx.epoch_state.driver_active:
            ctx.epoch_state.epoch += 1
            ctx.end_epoch()
