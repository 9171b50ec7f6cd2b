"""``AdaptiveDataLoader``: elastic, deterministic batches whose size follows the goodput model (SPEC §4, §8).

Each iteration of the loader is one epoch of training *progress*: it yields micro-batches until the
model's progress reaches ``(epoch+1)·N/M0`` scale-invariant iterations (N = dataset length), so with
S = 1 an epoch is exactly one pass. Every optimiser step is announced to the shared context; for the
non-final micro-steps of gradient accumulation the loader holds the model's ``no_sync`` context while
the user runs forward and backward, and the optimiser's ``step``/``zero_grad`` do nothing until the
final micro-step. Between steps it records step times, applies what the replicas agreed on (refit,
out-of-memory recovery, SIGTERM) and moves the global sample index.

Batch configuration: the loader's :class:`~pollux.torch.tuner.BatchTuner` owns the limits and the
configuration in force (local batch m and accumulation steps s) and the decisions that change it:
rank 0 chooses from the fitted goodput model once a throughput fit exists and the gradient
statistics are unbiased and numerous enough (re-optimised at every refit, about every 30 s), else
the smallest configuration that reaches M0, and every replica takes the choice. The loader asks it
at the start of an iteration, at a refit and after an out-of-memory error.

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
from pollux.torch.api import BatchConfig, StepInfo
from pollux.torch.context import AgentContext, get_context
from pollux.torch.loader_state import LoaderCheckpoint
from pollux.torch.microbatch import PlanBatchSampler, probe_due, record_times, split_batch
from pollux.torch.sampler import ElasticSampler
from pollux.torch.shares import LoaderBalance, StepTimer, env_mode, memory_full
from pollux.torch.tensorboard import log_step
from pollux.torch.tuner import BatchTuner

logger = logging.getLogger("pollux.torch")

__all__ = ["AdaptiveDataLoader"]

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
        self.tuner = BatchTuner(self.init_batch_size)
        self._it: Any = None
        self._it_next = -1
        self._it_cfg: BatchConfig | None = None
        self._it_shares: tuple[int, ...] | None = None
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
            self.tuner.note_oom_bound(noted)

    # ---------------------------------------------------------------- configuration

    def autoscale_batch_size(self, max_batch_size: int, local_bsz_bounds: tuple[int | None, int | None]
                             | None = None, gradient_accumulation: bool = False) -> None:
        """Let Pollux choose the batch size between M0 and ``max_batch_size``.

        ``local_bsz_bounds = (lo, hi)`` bounds the per-replica batch (either may be None); without
        an upper bound on a CUDA device, an out-of-memory error in the forward pass lowers it
        automatically. ``gradient_accumulation`` allows accumulation steps when the local batch
        would exceed the upper bound.
        """
        self.tuner.autoscale(max_batch_size, local_bsz_bounds, gradient_accumulation)

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
        return LoaderCheckpoint(self.sampler.state_dict(), self.tuner.config, self.tuner.config_key,
                                self.tuner.oom_max_local, self.tuner.last_decision).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = LoaderCheckpoint.from_dict(state)
        self.sampler.load_state_dict(saved.sampler)
        self.tuner.config = saved.config
        self.tuner.config_key = saved.limits_key
        self.tuner.oom_max_local = saved.oom_max_local
        self.tuner.last_decision = saved.last_decision

    # ---------------------------------------------------------------- configuration

    @property
    def adaptive(self) -> bool:
        return self.tuner.adaptive

    @property
    def max_batch_size(self) -> int:
        return self.tuner.max_batch_size

    @property
    def dataset_len(self) -> int:
        """Examples in the dataset (N)."""
        return self.sampler.dataset_len

    @property
    def user_max_local_bsz(self) -> int | None:
        """The upper local batch bound the user gave (None: none, so out-of-memory errors set one)."""
        return self.tuner.user_max_local

    @property
    def max_local_bsz(self) -> int | None:
        """Upper local batch bound in force: the user's, lowered by out-of-memory errors."""
        return self.tuner.max_local_bsz

    @property
    def min_local_bsz(self) -> int:
        return self.tuner.min_local_bsz

    def limits(self) -> BatchLimits:
        """The batch limits handed to the goodput optimiser."""
        return self.tuner.limits()

    def _current(self) -> BatchConfig:
        return self.tuner.current(self._ctx.replicas)

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

    # ---------------------------------------------------------------- hints

    def hints(self) -> dict[str, Any] | None:
        """The hints body this job would report now (None before the first throughput fit)."""
        return self.tuner.hints(self._ctx, self._balance.report)

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
        self.tuner.ensure_config(ctx)
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
            cfg = self.tuner.config
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
            if info.stepped:
                log_step(ctx, sum(times))       # TensorBoard: one point per optimiser step (rank 0)
            if timer is not None:
                used = (plan.shares or (m,) * k) if plan.full and info.stepped and not outcome.oom else None
                self._balance.after_step(cfg, used, timer.total, outcome.step_times, self.min_local_bsz,
                                         self.max_local_bsz, rank, adp.progress)
                ctx.balance_report = self._balance.report
            if outcome.oom:                # with unequal shares the largest one ran out of memory
                self.tuner.handle_oom(ctx, max(plan.shares) if plan.shares and plan.full else m)
                self._it = None
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
                self.tuner.refit(ctx, self._balance.report)
        if not ctx.epoch_state.driver_active:
            ctx.epoch_state.epoch += 1
            ctx.end_epoch()
