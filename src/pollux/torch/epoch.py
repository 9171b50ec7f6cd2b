"""Epochs measured in training progress, resumable after a restart (SPEC §2, §8)."""

from __future__ import annotations

from collections.abc import Iterator

from pollux.torch.context import get_context


def current_epoch() -> int:
    """The epoch in progress (restored from the checkpoint after a restart)."""
    return get_context().epoch_state.epoch


def remaining_epochs_until(epochs: int) -> Iterator[int]:
    """Yield the epochs still to run, from the restored one up to ``epochs - 1``.

    After each epoch's body, the epoch counter advances and rank 0 saves a checkpoint (when a
    checkpoint directory is configured); a SIGTERM received by any replica is honoured there
    (checkpoint, then exit with status 143). An :class:`~pollux.torch.AdaptiveDataLoader` iterated
    inside the body ends when the model's progress reaches ``(epoch + 1)·N/M0``.
    """
    if isinstance(epochs, bool) or int(epochs) != epochs or epochs < 0:
        raise ValueError(f"epochs: expected a non-negative integer, got {epochs!r}")
    ctx = get_context()
    state = ctx.epoch_state
    state.driver_active = True
    try:
        while state.epoch < epochs:
            yield state.epoch
            state.epoch += 1
            ctx.end_epoch()
    finally:
        state.driver_active = False
