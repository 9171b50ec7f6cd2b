"""One simulation's memo of throughput fits: the same records fitted once (issue 38).

A simulated agent's records are exact functions of its application's profile (times its speed
factor) and the configurations it ran, and :func:`pollux.goodput.fit_throughput` is deterministic.
So jobs of one application that run the same configurations — every job of an application starts on
one GPU at its initial batch, and a type-aware policy bootstraps each job from the same 1-GPU
profile — ask for the very same fit. On workload-6 under Pollux, 1,331 of 2,419 fits are distinct;
the refits were the largest part of a simulation's wall time (``benchmarks/sim_profile.py``).

The key is the records, sorted, and the previous parameters (the fit's warm start). Sorting loses
nothing: the fit averages records by (nodes, replicas, m) through ``np.unique``, which sorts them,
so the order it is given them never reaches the optimiser. A hit therefore returns exactly what a
fresh fit would, bit for bit: results do not depend on the memo, only the wall time does.

One memo serves one simulation (the engine makes it): a run pays for its own fits, as a
``pollux simulate`` process would, and its memory ends with the run. ``max_entries`` bounds it
(least recently used first out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from pollux.goodput import fit_throughput
from pollux.goodput.records import ThroughputParams
from pollux.goodput.throughput_fit import ThroughputFit

__all__ = ["DEFAULT_MAX_ENTRIES", "FitMemo", "fit_records"]

#: A configuration run: (nodes, replicas, local batch m) -> (optimiser-step time, accumulation time).
Records = Mapping[tuple[int, int, int], tuple[float, float]]
FitKey = tuple[tuple[tuple[tuple[int, int, int], tuple[float, float]], ...], tuple[float, ...] | None]

#: Entries kept: a key is a few dozen floats, so this is some tens of MB at most.
DEFAULT_MAX_ENTRIES = 20_000


def fit_records(records: Records, previous: ThroughputParams | None) -> ThroughputFit:
    """:func:`pollux.goodput.fit_throughput` on a job's records (no memo)."""
    keys = np.array(list(records), dtype=np.float64)
    vals = np.array(list(records.values()), dtype=np.float64)
    return fit_throughput(keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0], vals[:, 1], previous=previous)


class FitMemo:
    """Fits keyed by (sorted records, previous parameters); ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries!r}")
        self.max_entries = int(max_entries)
        self._fits: OrderedDict[FitKey, ThroughputFit] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._fits)

    def fit(self, records: Records, previous: ThroughputParams | None) -> ThroughputFit:
        """The fit of ``records`` warm-started from ``previous``: remembered, or made and remembered."""
        key: FitKey = (tuple(sorted(records.items())),
                       None if previous is None else tuple(previous.as_array()))
        found = self._fits.get(key)
        if found is not None:
            self.hits += 1
            self._fits.move_to_end(key)
            return found
        self.misses += 1
        fit = fit_records(records, previous)
        self._fits[key] = fit
        if len(self._fits) > self.max_entries:
            self._fits.popitem(last=False)
        return fit
