"""This replica's squared gradient norms of a step, taken before the all-reduce (SPEC §2).

The unbiased estimators need, beside the norm of the reduced gradient, the norms of the gradients
each replica (and each micro-step) computed on its own. Without accumulation they are read from
each bucket before it is reduced (:meth:`LocalNorms.add_bucket`); with accumulation a hook on every
parameter reads each micro-step's gradient before autograd sums it into ``.grad``, weighted when
the micro-batches have unequal sizes. The norms are summed over the replicas by the control packet
of the *next* step (:mod:`pollux.torch.control_packet`), so there are two buffers: the step's own,
being filled, and the previous step's, being sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pollux.torch.adam_preconditioner import AdamPreconditioner
from pollux.torch.api import StepInfo
from pollux.torch.grad_layouts import BucketLayout, BucketLayouts
from pollux.torch.squared_norm import squared_norm

__all__ = ["LocalNorms"]


class LocalNorms:
    """The local norms per parameter group of this step and the previous one, and the micro-step hooks."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device,
                 preconditioner: AdamPreconditioner, bucket_layouts: BucketLayouts) -> None:
        self.optimizer = optimizer
        self.preconditioner = preconditioner
        self.bucket_layouts = bucket_layouts
        num_groups = len(optimizer.param_groups)
        #: This step's norms (being filled) and the previous step's (sent with this step's packet).
        self.current = torch.zeros(num_groups, dtype=torch.float64, device=device)
        self.previous = torch.zeros(num_groups, dtype=torch.float64, device=device)
        #: 1.0 when ``previous`` holds the norms of the step whose reduced norms await them, else 0.0
        #: (the packet's marker: the sum tells whether every replica sent valid ones).
        self.marker = 0.0
        self.current_sid = -1
        #: A micro-step's gradient was measured without its pre-conditioner (its layout not known
        #: yet): the step has no consistent estimate.
        self.invalid = False
        self.step: StepInfo | None = None
        self.micro_weights: tuple[float, ...] | None = None
        self.micro_handles: list[Any] = []
        self.micro_active = False

    def start_step(self, info: StepInfo, micro: bool, awaiting_sid: int | None) -> None:
        """Swap the buffers and arm the micro-step hooks; ``awaiting_sid``: the step whose reduced
        norms wait for their local norms (None: none waits)."""
        self.step = info
        # Micro-batches of unequal size (a probe step splitting an odd local batch) are weighted so
        # that the accumulated gradient is still the mean over the whole batch.
        sizes = info.micro_sizes
        if micro and sizes and len(set(sizes)) > 1:
            total = float(sum(sizes))
            self.micro_weights = tuple(len(sizes) * b / total for b in sizes)
        else:
            self.micro_weights = None
        if micro and not self.micro_handles:
            self._register_micro_hooks()
        self.micro_active = micro
        # The previous step's local norms travel with this step's first bucket.
        self.current, self.previous = self.previous, self.current
        self.marker = 1.0 if awaiting_sid is not None and awaiting_sid == self.current_sid else 0.0
        self.current_sid = info.sid
        self.current.zero_()
        self.invalid = False

    def end_step(self) -> None:
        self.micro_active = False

    def add_bucket(self, lay: BucketLayout, buf: torch.Tensor) -> None:
        """Add the norms of a bucket's gradient, before it is reduced, to its groups' norms."""
        pc2 = self.preconditioner.pc2_of(lay)
        for start, end, gi, _ in lay.runs:
            self.current[gi] += squared_norm(buf[start:end], None if pc2 is None else pc2[start:end],
                                             lay, start)

    def _register_micro_hooks(self) -> None:
        for gi, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self.micro_handles.append(p.register_hook(self._micro_hook(gi, p)))

    def _micro_hook(self, gi: int, param: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor | None]:
        pid = id(param)

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if not self.micro_active or grad.is_sparse:
                return None
            weights = self.micro_weights
            if weights is not None and self.step is not None:
                grad = grad * weights[min(self.step.micro, len(weights) - 1)]
            with torch.no_grad():
                g = grad.reshape(-1)
                if g.dtype not in (torch.float32, torch.float64):
                    g = g.float()
                if self.preconditioner.active:
                    pc = self.bucket_layouts.param_pc2.get(pid)
                    if pc is None:
                        self.invalid = True   # layout not known yet: no consistent P this step
                        value = torch.dot(g, g)
                    else:
                        value = torch.dot(g, g * pc.to(g.dtype))
                else:
                    value = torch.dot(g, g)
                self.current[gi] += value
            return grad if weights is not None else None

        return hook
