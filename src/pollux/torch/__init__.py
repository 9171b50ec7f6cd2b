"""The Pollux agent: a PyTorch library used inside training scripts (SPEC §8).

```python
import pollux.torch as ptorch

ptorch.init_process_group("gloo")                      # or "nccl"; reads the environment
model = ptorch.AdaptiveDataParallel(model, optimizer, lr_scheduler)
loader = ptorch.AdaptiveDataLoader(dataset, batch_size=M0, shuffle=True)
loader.autoscale_batch_size(max_batch_size, local_bsz_bounds=(lo, hi), gradient_accumulation=True)
for epoch in ptorch.remaining_epochs_until(E):
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
```

Names are imported lazily, so ``import pollux.torch.profiling`` (torch-free) does not import torch.
See ``docs/agent.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "init_process_group": "pollux.torch.context",
    "get_context": "pollux.torch.context",
    "AgentEnv": "pollux.torch.env",
    "read_env": "pollux.torch.env",
    "AdaptiveDataParallel": "pollux.torch.parallel",
    "AdaptiveDataLoader": "pollux.torch.data",
    "ElasticSampler": "pollux.torch.sampler",
    "remaining_epochs_until": "pollux.torch.epoch",
    "current_epoch": "pollux.torch.epoch",
    "PREEMPT_EXIT_CODE": "pollux.torch.context",
    "Accumulator": "pollux.torch.accumulator",
    "BatchConfig": "pollux.torch.api",
}

__all__ = [*sorted(_EXPORTS), "register_state"]


def register_state(name: str, obj: Any) -> bool:
    """Checkpoint ``obj`` (with ``state_dict()``/``load_state_dict()``) under ``name``.

    If the checkpoint this run resumed from holds ``name``, the state is loaded into ``obj`` now and
    True is returned. Without a checkpoint directory nothing is saved or restored.
    """
    from pollux.torch.context import get_context

    return get_context().registry.register(name, obj)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pollux.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
