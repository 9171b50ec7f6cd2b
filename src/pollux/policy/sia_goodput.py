"""The goodputs behind Sia's configuration table: asked per (job, GPU type), memoised across rounds,
and computed for a whole round at once (issue 38).

Each job lists its candidate counts on each type it may run, and the table needs the job's best
goodput at each (:mod:`.sia_configs`). Those are a pure function of (model, limits, nodes, counts),
so :class:`GoodputCache` keeps them from round to round; what a round still has to compute — every
job in the first round, or a job whose model was refitted — goes to
:func:`pollux.goodput.batched.optimize_many` in one call, which gives the same numbers, bit for bit,
as one :func:`pollux.goodput.optimize` call per ask (1,896 asks in Sia's first round at 4,096 GPUs ×
1,000 jobs: measured in ``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, optimize
from pollux.goodput.batched import model_rows, optimize_many


@dataclass(frozen=True, slots=True)
class GoodputAsk:
    """The goodputs one (job, type) needs: ``model`` under ``limits`` on ``nodes[i]`` nodes with
    ``counts[i]`` GPUs (a job's candidates on the type, then the 1-GPU reference of the normaliser)."""

    model: GoodputModel
    limits: BatchLimits
    nodes: np.ndarray
    counts: np.ndarray

    def key(self) -> tuple:
        return (self.model, self.limits, self.nodes.tobytes(), self.counts.tobytes())


class GoodputCache:
    """Memo of goodput arrays keyed by (model, limits, nodes, counts): a pure function of its key.
    ``size`` 0 keeps nothing (every ask computed)."""

    def __init__(self, size: int) -> None:
        self.size = max(int(size), 0)
        self._data: OrderedDict = OrderedDict()

    def goodput(self, model: GoodputModel, limits: BatchLimits, nodes: np.ndarray,
                counts: np.ndarray) -> np.ndarray:
        """The goodput of one ask, from the memo or computed alone."""
        key = GoodputAsk(model, limits, nodes, counts).key()
        hit = self._lookup(key)
        if hit is not None:
            return hit
        out = np.asarray(optimize(model, nodes, counts, limits).goodput, dtype=np.float64)
        self._store(key, out)
        return out

    def goodput_many(self, asks: Sequence[GoodputAsk]) -> list[np.ndarray]:
        """The goodputs of ``asks`` in order: those not memoised computed together in one batch."""
        keys = [ask.key() for ask in asks]
        found: dict[tuple, np.ndarray] = {}
        todo: dict[tuple, GoodputAsk] = {}
        for key, ask in zip(keys, asks, strict=True):
            if key in found or key in todo:
                continue
            hit = self._lookup(key)
            if hit is not None:
                found[key] = hit
            else:
                todo[key] = ask
        if todo:
            found.update(zip(todo, self._compute(list(todo.values())), strict=True))
            for key in todo:
                self._store(key, found[key])
        return [found[key] for key in keys]

    @staticmethod
    def _compute(asks: list[GoodputAsk]) -> list[np.ndarray]:
        pairs: dict[tuple[GoodputModel, BatchLimits], int] = {}
        row_of = [pairs.setdefault((ask.model, ask.limits), len(pairs)) for ask in asks]
        sizes = [int(ask.counts.size) for ask in asks]
        rows = model_rows(list(pairs))
        flat = optimize_many(rows, np.repeat(row_of, sizes), np.concatenate([ask.nodes for ask in asks]),
                             np.concatenate([ask.counts for ask in asks]))
        return np.split(flat, np.cumsum(sizes)[:-1])

    def _lookup(self, key: tuple) -> np.ndarray | None:
        if not self.size:
            return None
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
        return hit

    def _store(self, key: tuple, value: np.ndarray) -> None:
        if not self.size:
            return
        self._data[key] = value
        while len(self._data) > self.size:
            self._data.popitem(last=False)
