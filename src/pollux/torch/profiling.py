"""Step-time profiling for the throughput fit (SPEC §3, §8), independent of torch.

The agent times every optimiser step: the mean time of its accumulation steps (forward/backward under
``no_sync``, when the step has any) and the time of the final, synchronised pass plus optimiser step.
:class:`StepProfiler` keeps running sums per configuration ``(nodes, replicas, local_bsz)`` and fits the
seven throughput parameters from their means with :func:`pollux.goodput.fit_throughput`;
:class:`PeriodicFitter` says when the next refit (and hint report) is due — every 30 s by default.

Warm-up: the first step of a configuration is slow (allocator growth, cuDNN autotuning, DDP bucket
rebuild, data-loader start-up) and would bias the means. The profiler therefore drops, for timing, the
first step after it was created or restored (a restart) and the first step after the configuration
changed — ``(nodes, replicas, local_bsz)`` or, when the caller passes it, ``accum_steps``. A caller
that knows better flags a step with ``record(..., warmup=True)``, calls :meth:`StepProfiler.restart`,
or calls :meth:`StepProfiler.skip_next` ahead of steps it knows are unrepresentative (say, a step that
also ran an evaluation or wrote a checkpoint). Replica counts are noted even for dropped steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.goodput import ThroughputFit, ThroughputParams, fit_throughput

#: Version of :meth:`StepProfiler.state_dict`'s layout.
STATE_VERSION = 1

Key = tuple[int, int, int]


@dataclass(slots=True)
class _Sums:
    optim_sum: float = 0.0
    optim_count: int = 0
    accum_sum: float = 0.0
    accum_count: int = 0


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        if isinstance(value, float | np.floating) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value}")
    return value


def _valid_time(value: float | None) -> float | None:
    """The time as a float if it is a finite positive number, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        t = float(value)
    except (TypeError, ValueError):
        return None
    return t if math.isfinite(t) and t > 0.0 else None


class StepProfiler:
    """Running means of step times per ``(nodes, replicas, local_bsz)``, and the throughput fit.

    Not thread-safe; the training loop owns it. See the module docstring for the warm-up rule.
    """

    def __init__(self) -> None:
        self._sums: dict[Key, _Sums] = {}
        self._max_replicas_seen = 0
        self._last_config: tuple[int, int, int, int | None] | None = None
        self._skip = 0

    # ---------------------------------------------------------------- recording

    def record(
        self,
        nodes: int,
        replicas: int,
        local_bsz: int,
        accum_time: float | None,
        optim_time: float,
        *,
        accum_steps: int | None = None,
        warmup: bool = False,
        side: bool = False,
    ) -> bool:
        """Record one optimiser step; return whether its times were kept.

        ``accum_time`` is the mean time of the step's accumulation passes (None when it had none),
        ``optim_time`` the time of its final pass, all-reduce and optimiser update, in seconds.
        ``accum_steps`` (optional) lets a change of accumulation steps count as a configuration
        change. A step is dropped for timing when it is a warm-up step (detected, or flagged by
        ``warmup=True``), when :meth:`skip_next` asked for it, or when ``optim_time`` is not a
        finite positive number (an invalid ``accum_time`` alone is ignored, keeping ``optim_time``).
        ``nodes > replicas`` or non-positive counts raise ``ValueError``: they are the caller's bug,
        not a measurement. ``side=True`` records a step run in another configuration between the
        regular ones (a probe step) without counting it as a configuration change: the caller then
        does its own warm-up bookkeeping.
        """
        nodes = _positive_int("nodes", nodes)
        replicas = _positive_int("replicas", replicas)
        local_bsz = _positive_int("local_bsz", local_bsz)
        if nodes > replicas:
            raise ValueError(f"nodes: {nodes} nodes for only {replicas} replicas")
        if accum_steps is not None:
            accum_steps = int(accum_steps)
        self.note_replicas(replicas)
        if not side:
            config = (nodes, replicas, local_bsz, accum_steps)
            warmup = warmup or config != self._last_config
            self._last_config = config
        if warmup:
            return False
        if self._skip > 0 and not side:
            self._skip -= 1
            return False
        optim = _valid_time(optim_time)
        if optim is None:
            return False
        sums = self._sums.setdefault((nodes, replicas, local_bsz), _Sums())
        sums.optim_sum += optim
        sums.optim_count += 1
        accum = _valid_time(accum_time)
        if accum is not None:
            sums.accum_sum += accum
            sums.accum_count += 1
        return True

    def skip_next(self, steps: int = 1) -> None:
        """Drop the next ``steps`` recorded steps for timing (in addition to any warm-up step)."""
        self._skip += max(int(steps), 0)

    def restart(self) -> None:
        """Treat the next step as the first after a restart (it is dropped as warm-up)."""
        self._last_config = None

    def note_replicas(self, replicas: int) -> None:
        """Raise :attr:`max_replicas_seen` to ``replicas`` if it is larger."""
        self._max_replicas_seen = max(self._max_replicas_seen, int(replicas))

    @property
    def max_replicas_seen(self) -> int:
        """Most replicas this job has run on (over records, :meth:`note_replicas` and restores)."""
        return self._max_replicas_seen

    @max_replicas_seen.setter
    def max_replicas_seen(self, value: int) -> None:
        value = int(value)
        if value < 0:
            raise ValueError(f"max_replicas_seen: must be >= 0, got {value}")
        self._max_replicas_seen = value

    # ---------------------------------------------------------------- queries

    def __len__(self) -> int:
        """Number of configurations with at least one kept step."""
        return len(self._sums)

    @property
    def num_steps(self) -> int:
        """Number of steps kept for timing, over all configurations."""
        return sum(s.optim_count for s in self._sums.values())

    def step_time(self, nodes: int, replicas: int, local_bsz: int, accum_steps: int = 0
                  ) -> tuple[float, int] | None:
        """Measured seconds per optimiser step of a configuration and the steps behind the figure.

        ``s`` accumulation passes plus the final pass and update; None when that configuration (or,
        with ``accum_steps > 0``, its accumulation passes) was never timed.
        """
        sums = self._sums.get((int(nodes), int(replicas), int(local_bsz)))
        if sums is None or sums.optim_count == 0:
            return None
        t = sums.optim_sum / sums.optim_count
        if accum_steps > 0:
            if sums.accum_count == 0:
                return None
            t += accum_steps * sums.accum_sum / sums.accum_count
        return t, sums.optim_count

    def has_allocation(self, nodes: int, replicas: int) -> bool:
        """Whether any step on ``nodes`` nodes with ``replicas`` replicas was timed."""
        return any(k[0] == int(nodes) and k[1] == int(replicas) for k in self._sums)

    def max_local_bsz(self) -> int | None:
        """The largest local batch with a timed step (None before any)."""
        return max((k[2] for k in self._sums), default=None)

    def records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(nodes, replicas, local_bsz, optim_mean, accum_mean)``, one entry per configuration.

        Sorted by key; ``accum_mean`` is NaN where no accumulation step was timed. Empty arrays
        when nothing was kept.
        """
        keys = sorted(self._sums)
        nodes = np.array([k[0] for k in keys], dtype=np.int64)
        replicas = np.array([k[1] for k in keys], dtype=np.int64)
        local_bsz = np.array([k[2] for k in keys], dtype=np.int64)
        optim = np.array([self._sums[k].optim_sum / self._sums[k].optim_count for k in keys],
                         dtype=np.float64)
        accum = np.array([self._sums[k].accum_sum / self._sums[k].accum_count
                          if self._sums[k].accum_count else np.nan for k in keys], dtype=np.float64)
        return nodes, replicas, local_bsz, optim, accum

    def fit(self, previous: ThroughputParams | None = None, **kwargs: Any) -> ThroughputFit | None:
        """Fit the throughput parameters to the recorded means; None when nothing was recorded.

        ``previous`` is kept if the optimiser fails (``ok=False``). Extra keyword arguments go to
        :func:`pollux.goodput.fit_throughput` (``initial``, ``ftol``). The fit does not warm-start
        from ``previous`` by default: parameters pinned at their floor by an earlier fit would start
        where their gradient vanishes.
        """
        if not self._sums:
            return None
        nodes, replicas, local_bsz, optim, accum = self.records()
        return fit_throughput(nodes, replicas, local_bsz, optim, accum, previous=previous, **kwargs)

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly state: the running sums and the most replicas seen."""
        return {
            "version": STATE_VERSION,
            "max_replicas_seen": self._max_replicas_seen,
            "records": [
                {"nodes": k[0], "replicas": k[1], "local_bsz": k[2],
                 "optim_sum": s.optim_sum, "optim_count": s.optim_count,
                 "accum_sum": s.accum_sum, "accum_count": s.accum_count}
                for k, s in sorted(self._sums.items())
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the next step counts as the first after a restart.

        Raises ``ValueError`` on a malformed state, leaving the profiler unchanged.
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"profiler state: expected a dict with version {STATE_VERSION}")
        sums: dict[Key, _Sums] = {}
        try:
            for i, rec in enumerate(state["records"]):
                key = (_positive_int("nodes", rec["nodes"]), _positive_int("replicas", rec["replicas"]),
                       _positive_int("local_bsz", rec["local_bsz"]))
                entry = _Sums(float(rec["optim_sum"]), int(rec["optim_count"]),
                              float(rec["accum_sum"]), int(rec["accum_count"]))
                ok = (entry.optim_count >= 1 and entry.accum_count >= 0 and key[0] <= key[1]
                      and math.isfinite(entry.optim_sum) and entry.optim_sum > 0.0
                      and math.isfinite(entry.accum_sum) and entry.accum_sum >= 0.0
                      and (entry.accum_count == 0) == (entry.accum_sum == 0.0))
                if not ok or key in sums:
                    raise ValueError(f"record {i} is invalid or duplicated: {rec!r}")
                sums[key] = entry
            max_seen = int(state["max_replicas_seen"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"profiler state: {exc}") from None
        if max_seen < 0:
            raise ValueError(f"profiler state: max_replicas_seen must be >= 0, got {max_seen}")
        self._sums = sums
        self._max_replicas_seen = max(max_seen, max((k[1] for k in sums), default=0))
        self._last_config = None
        self._skip = 0


class PeriodicFitter:
    """Says when the periodic refit-and-report is due (every ``interval_s`` seconds, SPEC §3).

    ``due()`` is True before the first :meth:`mark` and then once ``interval_s`` has passed since the
    last one; the caller fits, reports, and calls :meth:`mark`. ``clock`` returns seconds (monotonic).
    """

    def __init__(self, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        interval = float(interval_s)
        if not math.isfinite(interval) or interval < 0.0:
            raise ValueError(f"interval_s: must be a finite number >= 0, got {interval_s!r}")
        self.interval_s = interval
        self._clock = clock
        self._last: float | None = None

    def due(self) -> bool:
        return self._last is None or self._clock() - self._last >= self.interval_s

    def mark(self) -> None:
        """Record that a fit happened now."""
        self._last = self._clock()

    def remaining(self) -> float:
        """Seconds until the next fit is due (0 when due)."""
        if self._last is None:
            return 0.0
        return max(self.interval_s - (self._clock() - self._last), 0.0)

    def reset(self) -> None:
        """Make the next :meth:`due` True (for instance right after a rescale)."""
        self._last = None
