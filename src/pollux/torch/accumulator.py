"""Metrics summed over the replicas of a job, and kept across restarts (``pollux.torch.Accumulator``).

Each replica adds its own contributions locally (no communication)::

    metrics = ptorch.Accumulator()                 # before the training loop, on every replica
    for epoch in ptorch.remaining_epochs_until(E):
        for x, y in loader:
            ...
            metrics["loss_sum"] += loss.item() * len(y)
            metrics["count"] += len(y)
        totals = metrics.sum(reset=True)           # a collective: every replica, same point
        mean_loss = totals["loss_sum"] / totals["count"]

Reading the totals is a collective that every replica calls at the same point of the program: the
replicas agree on the union of their keys (``all_gather_object``) and sum the values in one float64
all-reduce. The accumulator is a checkpointed state: before every checkpoint save the replicas fold
their values into rank 0 (rank 0 then holds the global totals, the others hold nothing), rank 0
saves them, and after a restart rank 0 starts from the saved totals and the other replicas from zero.
The next read is therefore exact whatever the number of replicas of the resumed job.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pollux.torch.context import AgentContext, get_context

#: Auto names are ``pollux_accumulator<i>``, i counting the accumulators of a context in creation order.
AUTO_NAME_PREFIX = "pollux_accumulator"
STATE_VERSION = 1

Number = int | float

_auto_counts: weakref.WeakKeyDictionary[AgentContext, int] = weakref.WeakKeyDictionary()


def _union_keys(per_replica: Iterable[Iterable[tuple[str, bool]]]) -> list[tuple[str, bool]]:
    """Merge the replicas' ``(key, holds an int)`` lists: sorted keys, int only where every holder has one."""
    merged: dict[str, bool] = {}
    for entries in per_replica:
        for key, is_int in entries:
            merged[key] = merged.get(key, True) and bool(is_int)
    return sorted(merged.items())


class Accumulator:
    """A dict-like accumulator of per-replica numbers, summed over the replicas when read.

    ``name`` is the name of its state in the job's checkpoint (default ``pollux_accumulator0``,
    ``pollux_accumulator1``, ... in creation order); two accumulators of one job cannot share a name.
    Create accumulators once, before the training loop, in the same order on every replica.

    Local operations (no communication): ``acc[key] += value`` (a missing key reads as 0),
    ``acc[key] = value``, ``acc.update(mapping, **kw)`` (which *adds*), ``reset()``/``clear()``,
    ``local()``, ``key in acc``, ``len(acc)``, iteration (over this replica's keys). Values are Python
    or numpy reals, or one-element tensors (converted with ``.item()``); ints stay ints, booleans
    count as 0/1; non-finite values are refused.

    Collective (every replica, at the same point): ``sum(reset=False)`` returns the global totals.
    Before each checkpoint save the replicas fold their values into rank 0 (also a collective, run by
    the agent on every replica), so a replica's local values are its share since the last save only.
    """

    def __init__(self, name: str | None = None) -> None:
        ctx = get_context()
        if name is None:
            index = _auto_counts.get(ctx, 0)
            _auto_counts[ctx] = index + 1
            name = f"{AUTO_NAME_PREFIX}{index}"
        elif not isinstance(name, str) or not name:
            raise ValueError(f"Accumulator name: expected a non-empty string, got {name!r}")
        if name in ctx.registry:
            raise ValueError(f"Accumulator name {name!r} is already used by another state of this job; "
                             "give each Accumulator its own name")
        self._ctx = ctx
        self._name = name
        self._values: dict[str, Number] = {}
        self._restored = ctx.registry.register(name, self)
        ctx.before_save.append(self._fold_into_rank0)

    # ---------------------------------------------------------------- identity

    @property
    def name(self) -> str:
        """The accumulator's name in the checkpoint."""
        return self._name

    @property
    def restored(self) -> bool:
        """Whether its state was loaded from the checkpoint the job resumed from."""
        return self._restored

    def __repr__(self) -> str:
        return f"Accumulator({self._name!r}, local={self._values!r})"

    # ---------------------------------------------------------------- local operations

    def _check_key(self, key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(f"Accumulator {self._name!r}: keys must be strings, got {key!r}")
        return key

    def _number(self, key: str, value: Any) -> Number:
        raw = value
        if isinstance(value, torch.Tensor | np.ndarray):
            count = value.size if isinstance(value, np.ndarray) else value.numel()
            if count != 1:
                raise ValueError(f"Accumulator {self._name!r}: the value of {key!r} must be a number or a "
                                 f"one-element tensor, got one of shape {tuple(value.shape)}")
            value = value.item()
        if isinstance(value, bool | np.bool_):
            return int(value)
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"Accumulator {self._name!r}: the value of {key!r} is not finite "
                                 f"({number}); it would spoil the totals of every replica")
            return number
        raise TypeError(f"Accumulator {self._name!r}: the value of {key!r} must be a real number or a "
                        f"one-element tensor, got {type(raw).__name__} ({raw!r:.60})")

    def __getitem__(self, key: str) -> Number:
        """This replica's local value (0 for a key it never set): what ``acc[key] += x`` starts from."""
        return self._values.get(self._check_key(key), 0)

    def __setitem__(self, key: str, value: Any) -> None:
        key = self._check_key(key)
        self._values[key] = self._number(key, value)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def local(self) -> dict[str, Number]:
        """A copy of this replica's local values (not the totals: see :meth:`sum`)."""
        return dict(self._values)

    def update(self, other: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /, **kwargs: Any) -> None:
        """*Add* every value of ``other`` and ``kwargs`` to this replica's values (unlike ``dict.update``)."""
        items = list(other.items() if isinstance(other, Mapping) else other) + list(kwargs.items())
        converted = [(self._check_key(k), v) for k, v in items]
        added = [(k, self._number(k, v)) for k, v in converted]   # all checked before any is added
        for key, value in added:
            self._values[key] = self._values.get(key, 0) + value

    def reset(self) -> None:
        """Forget this replica's values (local). To restart a metric, every replica calls it at the same
        point; prefer ``sum(reset=True)`` at the *end* of an epoch's body (a reset at the start of the
        body would also wipe the partial totals an interrupted epoch was restored with)."""
        self._values.clear()

    clear = reset

    # ---------------------------------------------------------------- collectives

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _totals(self) -> dict[str, Number]:
        """The global totals (a collective on several replicas; a copy of the local values on one)."""
        if not self._distributed():
            return {key: self._values[key] for key in sorted(self._values)}
        entries = sorted((key, isinstance(value, int)) for key, value in self._values.items())
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, entries)
        keys = _union_keys(gathered)
        if not keys:
            return {}
        local = torch.tensor([float(self._values.get(key, 0)) for key, _ in keys], dtype=torch.float64,
                             device=self._ctx.collective_device())
        dist.all_reduce(local)
        return {key: (int(v) if is_int else v) for (key, is_int), v in zip(keys, local.tolist(), strict=True)}

    def sum(self, *, reset: bool = False) -> dict[str, Number]:
        """The totals over all replicas, as a new dict (key → sum); ``reset`` then clears the local values.

        A collective: every replica must call it at the same point. A key any replica holds is in the
        result; ints stay ints where every replica holding the key has an int.
        """
        totals = self._totals()
        if reset:
            self._values.clear()
        return totals

    def _fold_into_rank0(self) -> None:
        """Before a checkpoint save (on every replica): rank 0 takes the totals, the others drop theirs."""
        totals = self._totals()
        self._values = totals if self._ctx.rank == 0 else {}

    # ---------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The local values; at a checkpoint save (after the fold) rank 0's are the global totals."""
        return {"version": STATE_VERSION, "values": dict(self._values)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load saved totals: rank 0 takes them, the other replicas start from zero (they are global)."""
        if not isinstance(state, Mapping) or not isinstance(state.get("values"), Mapping):
            raise ValueError(f"Accumulator {self._name!r}: not an Accumulator state: {state!r:.100}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"Accumulator {self._name!r}: unsupported state version "
                             f"{state.get('version')!r}")
        values = {self._check_key(k): self._number(k, v) for k, v in state["values"].items()}
        self._values = values if self._ctx.rank == 0 else {}
