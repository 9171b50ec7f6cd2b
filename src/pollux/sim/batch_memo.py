"""One simulation's memo of the agents' batch choices: the same question answered once (issue 38).

A simulated Pollux agent re-chooses its batch configuration at every re-allocation and epoch end
(:func:`pollux.sim.batch_config.adaptive_batch_config`), a vectorised search over 50 candidate
batches. The answer is a pure function of the job's goodput model (fitted parameters, gradient
statistics, M0), its placement (nodes, replicas), its batch limits and one flag — and jobs of one
application ask the same questions: their fits are shared (:mod:`pollux.sim.fit_memo`) and the
profile's gradient statistics depend only on the epoch and the batch. On the 960-job Philly workload
under Sia, 39,727 of 52,229 choices repeat an earlier one.

The key is the arguments themselves (frozen dataclasses of floats and ints, compared by value), so a
hit returns exactly what the search would: results do not depend on the memo, only the wall time
does. One memo serves one simulation (the engine makes it) and ends with it; ``max_entries`` bounds
it, least recently used first out.
"""

from __future__ import annotations

import functools

from pollux.goodput import BatchLimits, GoodputModel
from pollux.sim.batch_config import adaptive_batch_config

__all__ = ["DEFAULT_MAX_ENTRIES", "BatchChoiceMemo"]

#: Entries kept: a key is a model and limits (about twenty numbers), so this is a few tens of MB.
DEFAULT_MAX_ENTRIES = 50_000


class BatchChoiceMemo:
    """:func:`~pollux.sim.batch_config.adaptive_batch_config` remembered by its arguments (a
    :func:`functools.lru_cache` of its own); ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries!r}")
        self.max_entries = int(max_entries)
        self._choose = functools.lru_cache(maxsize=self.max_entries)(adaptive_batch_config)

    def __len__(self) -> int:
        return self._choose.cache_info().currsize

    @property
    def hits(self) -> int:
        return self._choose.cache_info().hits

    @property
    def misses(self) -> int:
        return self._choose.cache_info().misses

    def choose(self, model: GoodputModel | None, nodes: int, replicas: int, limits: BatchLimits,
               init_batch_size: int, start_at_max: bool) -> tuple[int, int, int]:
        """(M, m, s) as :func:`~pollux.sim.batch_config.adaptive_batch_config` answers it."""
        return self._choose(model, nodes, replicas, limits, init_batch_size, start_at_max)
