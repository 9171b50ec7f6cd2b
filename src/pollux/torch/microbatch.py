"""Micro-batch helpers of :class:`pollux.torch.data.AdaptiveDataLoader`: splitting a collated batch
in two halves (probe steps) and feeding the DataLoader a replica's micro-batch indices.

Re-exported by :mod:`pollux.torch.data`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

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


class _PlanBatchSampler:
    """Feeds the DataLoader this replica's micro-batch indices from a segment of step plans."""

    def __init__(self, sampler: ElasticSampler) -> None:
        self.sampler = sampler
        self.segment: tuple[int, int, int, int, int] = (0, 1, 0, 1, 0)

    def __iter__(self) -> Iterator[list[int]]:
        start, k, rank, m, s = self.segment
        for plan in self.sampler.iter_plans(start, k, rank, m, s):
            for micro in plan.micro_batches:
                yield list(micro)

