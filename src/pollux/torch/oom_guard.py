"""Out-of-memory recovery in ``AdaptiveDataParallel``'s forward pass: when it applies, and fault injection.

The pure helpers (recognising the error, the placeholder pass) are in :mod:`pollux.torch.oom`. What is
here is the per-wrapper part: the device the model is on, the count of synthetic errors still to
raise (``inject_oom``), and what absorbing an error does to the step. It is a class of its own so that
the wrapper's ``forward`` reads as the pass itself, with the recovery decisions named beside it.
"""

from __future__ import annotations

import logging

from pollux.torch.api import StepInfo
from pollux.torch.context import AgentContext
from pollux.torch.oom import free_memory, synthetic_oom

logger = logging.getLogger("pollux.torch")


class ForwardOomGuard:
    """Out-of-memory recovery in the forward pass of one wrapper: when it applies, and fault injection.

    ``on_cuda``: whether the wrapped model is on a CUDA device (where real out-of-memory errors
    happen). ``pending_injections``: synthetic errors the next forward passes still raise.
    """

    def __init__(self, ctx: AgentContext, on_cuda: bool) -> None:
        self._ctx = ctx
        self.on_cuda = on_cuda
        self.pending_injections = 0

    def recoverable(self, info: StepInfo) -> bool:
        """Out-of-memory recovery applies to loader-driven steps without a user upper local bound,
        on CUDA (or when faults are injected)."""
        loader = self._ctx.active_loader
        if not info.managed or loader is None or loader.user_max_local_bsz is not None:
            return False
        return self.on_cuda or self.pending_injections > 0 or self._ctx.fault_oom_above is not None

    def inject(self, times: int) -> None:
        """Have the next ``times`` forward passes (where recovery applies) raise a synthetic CUDA OOM."""
        self.pending_injections += max(int(times), 0)

    def maybe_inject(self, local_bsz: int) -> None:
        """Raise a synthetic OOM if one is pending, or if ``local_bsz`` is above
        ``POLLUX_FAULT_OOM_ABOVE``."""
        if self.pending_injections > 0:
            self.pending_injections -= 1
            raise synthetic_oom(local_bsz)
        limit = self._ctx.fault_oom_above
        if limit is not None and local_bsz > limit:
            raise synthetic_oom(local_bsz)

    def absorb(self, local_bsz: int) -> None:
        """After an out-of-memory error at ``local_bsz``: mark the step (every replica will skip its
        update once the flag is reduced) and free the failed pass's memory."""
        logger.warning("out of memory in the forward pass at local batch size %d (rank %d): "
                       "skipping this step", local_bsz, self._ctx.rank)
        self._ctx.oom_in_step = True
        free_memory()
