"""Micro-batch helpers of :class:`pollux.torch.data.AdaptiveDataLoader`: splitting a collated batch
in two halves (probe steps), when a step is a probe and how its times are profiled, and feeding the
DataLoader a replica's micro-batch indices.

Re-exported by :mod:`pollux.torch.data`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from pollux.torch.api import BatchConfig, StepInfo
from pollux.torch.decisions import MIN_UNBIASED
from pollux.torch.profiling import StepProfiler
from pollux.torch.sampler import ElasticSampler, StepPlan

#: After the first ``2 × MIN_UNBIASED`` unbiased estimates, one single-replica step in this many is a probe.
PROBE_EVERY = 4


def split_batch(batch: Any, size: int) -> tuple[Any, Any] | None:
    """Split a collated batch of ``size`` examples into two halves along the first dimension.

    Tensors and lists/tuples of per-example values whose first dimension is ``size`` are split;
    None when some part of the batch cannot be split that way (then the step is not a probe).
    """
    half = size // 2
    ok = [True]

    def cut(x: Any, first: bool) -> Any:
        if isinstance(x, torch.Tensor):
            if x.dim() >= 1 and x.shape[0] == size:
                return x[:half] if first else x[half:]
            ok[0] = False
            return x
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(cut(v, first) for v in x))
        if isinstance(x, dict):
            return type(x)((k, cut(v, first)) for k, v in x.items())
        if isinstance(x, list | tuple):
            if x and all(not isinstance(v, torch.Tensor | list | tuple | dict) for v in x):
                if len(x) != size:
                    ok[0] = False
                    return x
                return type(x)(x[:half] if first else x[half:])
            return type(x)(cut(v, first) for v in x)
        ok[0] = False
        return x

    if size < 2:
        return None
    a, b = cut(batch, True), cut(batch, False)
    return (a, b) if ok[0] else None


class PlanBatchSampler:
    """Feeds the DataLoader this replica's micro-batch indices from a segment of step plans."""

    def __init__(self, sampler: ElasticSampler) -> None:
        self.sampler = sampler
        self.start, self.rank, self.config = 0, 0, BatchConfig(1, 1, 0)
        self.shares: tuple[int, ...] | None = None

    def start_at(self, start: int, rank: int, config: BatchConfig,
                 shares: tuple[int, ...] | None = None) -> None:
        """The next iteration yields ``rank``'s micro-batches of the steps from sample ``start`` on
        (with the replicas' unequal ``shares`` of each micro-step, if given)."""
        self.start, self.rank, self.config, self.shares = int(start), int(rank), config, shares

    def __iter__(self) -> Iterator[list[int]]:
        cfg = self.config
        for plan in self.sampler.iter_plans(self.start, cfg.replicas, self.rank, cfg.local_bsz,
                                            cfg.accum_steps, self.shares):
            for micro in plan.micro_batches:
                yield list(micro)


def probe_due(adaptive: bool, unbiased_updates: int, steps: int, plan: StepPlan, cfg: BatchConfig) -> bool:
    """Whether this single-replica step is split in two to measure unbiased statistics."""
    if (not adaptive or cfg.replicas != 1 or cfg.accum_steps != 0 or not plan.full
            or plan.micro_steps != 1):
        return False
    if len(plan.micro_batches[0]) < 2:
        return False
    if unbiased_updates < 2 * MIN_UNBIASED:
        return True
    return steps % PROBE_EVERY == 0


def record_times(profiler: StepProfiler, nodes: int, info: StepInfo, cfg: BatchConfig,
                 times: list[float], probe_shapes: set[int]) -> None:
    """Profile a step's micro-step times (a probe step as the configuration it is: m/2, one
    accumulation step; the first probe of a shape only warms it up)."""
    if not info.probe:
        accum = sum(times[:-1]) / (len(times) - 1) if len(times) > 1 else None
        profiler.record(nodes, cfg.replicas, cfg.local_bsz, accum, times[-1],
                        accum_steps=cfg.accum_steps)
        return
    half = info.micro_sizes[0]
    if len(set(info.micro_sizes)) != 1 or len(times) != 2:
        return
    if half not in probe_shapes:
        probe_shapes.add(half)
        return
    profiler.record(nodes, cfg.replicas, half, times[0], times[1], side=True)
