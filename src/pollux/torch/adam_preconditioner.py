"""The Adam pre-conditioner of the gradient statistics (SPEC §2), flattened per DDP bucket.

With an Adam-family optimiser the gradient noise is measured in the pre-conditioned space the
optimiser steps in: each squared norm becomes ``g·(P²g)`` with ``P = 1 / (sqrt(v̂) + eps)`` and
``v̂`` the bias-corrected second moment. It is used once the optimiser has taken
:data:`PRECOND_MIN_STEPS` steps, and refreshed from the optimiser's state after every step into
each bucket layout's ``pc2`` (:mod:`pollux.torch.grad_layouts`), reusing flat views of the state
tensors while they stay the same objects.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pollux.torch.grad_layouts import BucketLayout

__all__ = ["PRECOND_MIN_STEPS", "AdamPreconditioner", "adam_like"]

#: The Adam pre-conditioner is used once the optimiser has taken this many steps (SPEC §2).
PRECOND_MIN_STEPS = 5


def adam_like(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimiser keeps Adam's second moments (Adam, AdamW, or one named and shaped so)."""
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return True
    name = type(optimizer).__name__.lower()
    return name.startswith("adam") and all("betas" in g and "eps" in g for g in optimizer.param_groups)


class AdamPreconditioner:
    """Whether the pre-conditioner is in use, its version, and how each group's is computed."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.adam = adam_like(optimizer)
        self.active = False
        self.version = 0
        #: Per parameter group: (1 / bias correction, eps, state key), or None before its first step.
        self.groups: list[tuple[float, float, str] | None] = [None] * len(optimizer.param_groups)

    def pc2_of(self, lay: BucketLayout) -> torch.Tensor | None:
        """The layout's pre-conditioner while it is in use, else None (plain squared norms)."""
        return lay.pc2 if self.active else None

    def after_optimizer_step(self, layouts: Iterable[BucketLayout]) -> None:
        """Refresh the pre-conditioner from the optimiser state (Adam family only)."""
        if not self.adam:
            return
        steps = []
        for gi, group in enumerate(self.optimizer.param_groups):
            info = None
            for p in group["params"]:
                st = self.optimizer.state.get(p)
                if st and "step" in st:
                    t = float(st["step"])
                    beta2 = float(group["betas"][1])
                    bc2 = 1.0 - beta2 ** t if t > 0 else 1.0
                    key = "max_exp_avg_sq" if group.get("amsgrad", False) else "exp_avg_sq"
                    info = (1.0 / bc2, float(group["eps"]), key)
                    steps.append(t)
                    break
            self.groups[gi] = info
        active = bool(steps) and min(steps) >= PRECOND_MIN_STEPS
        if not active:
            self.active = False
            return
        self.active = True
        self.version += 1
        for lay in layouts:
            self.refresh(lay)

    def refresh_if_stale(self, lay: BucketLayout) -> None:
        """Bring a layout's pre-conditioner up to date (a layout built or missed since the last step)."""
        if self.active and lay.pc_version != self.version:
            self.refresh(lay)

    def refresh(self, lay: BucketLayout) -> None:
        if lay.pc2 is None:
            return
        state = self.optimizer.state
        for ri, (start, end, gi, params) in enumerate(lay.runs):
            info = self.groups[gi]
            seg = lay.pc2[start:end]
            if info is None:
                seg.fill_(1.0)
                continue
            inv_bc2, eps, key = info
            cached = lay.pc_sources[ri]
            first = state.get(params[0], {}).get(key)
            last = state.get(params[-1], {}).get(key)
            if cached is None or cached[1] != (id(first), id(last)):
                views = []
                complete = True
                for p in params:
                    src = state.get(p, {}).get(key)
                    if src is None:
                        complete = False
                        src = torch.zeros_like(p, dtype=torch.float32)
                    views.append(src.reshape(-1))
                cached = (views, (id(first), id(last)) if complete else (-1, -1))
                lay.pc_sources[ri] = cached
            torch.cat([v.to(seg.dtype) for v in cached[0]], out=seg)
            seg.mul_(inv_bc2).sqrt_().add_(eps).reciprocal_().square_()
        lay.pc_version = self.version
