"""Out-of-memory recovery in the forward pass: recognising the error, and the placeholder pass.

An out-of-memory error absorbed by :class:`~pollux.torch.parallel.AdaptiveDataParallel` still has to
let the replica take part in the step's all-reduces (or its peers would wait forever): the forward
pass is run again on one example and its output broadcast to the batch's shape, so the user's loss
and backward run as usual; every replica then skips the update (``docs/agent.md``, out-of-memory
recovery). The helpers here are pure functions over (nested) tensors.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch


def is_oom(exc: BaseException) -> bool:
    """A CUDA out-of-memory error (``torch.OutOfMemoryError`` or a RuntimeError saying so)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def synthetic_oom(local_bsz: int) -> BaseException:
    """The error fault injection raises (``inject_oom``, ``POLLUX_FAULT_OOM_ABOVE``)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or RuntimeError
    return oom_type(f"CUDA out of memory at local batch size {local_bsz} "
                    "(synthetic: pollux.torch fault injection)")


def tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """``fn`` applied to every leaf of nested tuples (named ones too), lists and dicts."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(tree_map(fn, x) for x in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(tree_map(fn, x) for x in obj)
    if isinstance(obj, dict):
        return type(obj)((k, tree_map(fn, v)) for k, v in obj.items())
    return fn(obj)


def first_batch_dim(obj: Any) -> int | None:
    """The first dimension of the first tensor (of at least one dimension) in ``obj``."""
    found: list[int] = []

    def visit(x: Any) -> Any:
        if not found and isinstance(x, torch.Tensor) and x.dim() >= 1:
            found.append(int(x.shape[0]))
        return x

    tree_map(visit, obj)
    return found[0] if found else None


def free_memory() -> None:
    """Release what the failed pass left behind (Python garbage, then the CUDA cache)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def placeholder_forward(forward: Callable[..., Any], local_bsz: int, inputs: Any, kwargs: Any) -> Any:
    """Run ``forward`` on one example and broadcast its output to the batch's shape.

    Tensors whose first dimension is ``local_bsz`` are cut to their first example; outputs with a
    first dimension of 1 are expanded back to ``local_bsz`` (others pass through unchanged).
    """
    def shrink(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == local_bsz:
            return x[:1]
        return x

    def grow(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == 1 and local_bsz > 1:
            return x.expand(local_bsz, *x.shape[1:]).contiguous()
        return x

    small_inputs, small_kwargs = tree_map(shrink, (inputs, kwargs))
    return tree_map(grow, forward(*small_inputs, **small_kwargs))
