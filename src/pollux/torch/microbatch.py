"""Micro-batch helpers of :class:`pollux.torch.data.AdaptiveDataLoader`: splitting a collated batch
in two halves (probe steps) and feeding the DataLoader a replica's micro-batch indices.

Re-exported by :mod:`pollux.torch.data`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from pollux.torch.api import BatchConfig
from pollux.torch.sampler import ElasticSampler


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

    def start_at(self, start: int, rank: int, config: BatchConfig) -> None:
        """The next iteration yields ``rank``'s micro-batches of the steps from sample ``start`` on."""
        self.start, self.rank, self.config = int(start), int(rank), config

    def __iter__(self) -> Iterator[list[int]]:
        cfg = self.config
        for plan in self.sampler.iter_plans(self.start, cfg.replicas, self.rank, cfg.local_bsz,
                                            cfg.accum_steps):
            for micro in plan.micro_batches:
                yield list(micro)
