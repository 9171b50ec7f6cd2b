"""The squared norm of a gradient slice, plain or in the Adam pre-conditioned space (SPEC §2).

Both the local norms (:mod:`pollux.torch.local_norms`, before the all-reduce) and the norms of the
reduced gradient (:mod:`pollux.torch.gradstats`, after it) are taken this one way, so that the two
sides of every estimate are measured in the same space and precision.
"""

from __future__ import annotations

import torch

from pollux.torch.grad_layouts import BucketLayout

__all__ = ["squared_norm"]


def squared_norm(x: torch.Tensor, pc2: torch.Tensor | None, lay: BucketLayout | None = None,
                 start: int = 0) -> torch.Tensor:
    """``|x|²``, or ``x·(P²x)`` with the pre-conditioner (the product goes to ``lay.scratch``).

    The product with the pre-conditioner is written into the layout's reused scratch buffer when a
    layout is given (a fresh bucket-sized allocation every step costs page faults); ``start`` is
    the offset of ``x`` in the bucket.
    """
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
