"""The agent's records and the small interfaces its parts meet through.

:class:`~pollux.torch.context.AgentContext` sits between the model wrapper
(:class:`~pollux.torch.parallel.AdaptiveDataParallel`) and the data loaders
(:class:`~pollux.torch.data.AdaptiveDataLoader`). It and they talk only through the protocols below —
:class:`ModelWrapper` and :class:`BatchLoader`, public methods and properties only — so that each side
can change its insides (or be replaced by a fake in a test) without the others reaching into it. The
records are what passes between them:

* :class:`BatchConfig` — a batch configuration (replicas K, local batch m, accumulation steps s),
  chosen by rank 0 and applied by every replica;
* :class:`StepInfo` — one optimiser step in progress, announced by the loader;
* :class:`SyncOutcome` — what the replicas agreed on at the end of a step.

This module imports neither torch nor the other agent modules at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pollux.goodput import GradStats
    from pollux.torch.decisions import Evidence


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """A batch configuration: ``replicas`` K, per-replica micro-batch ``local_bsz`` m and
    ``accum_steps`` s (micro-steps per optimiser step minus one); the total batch is K·m·(s+1).

    Checkpoints and the ``decision {JSON}`` log lines store it as the list ``[K, m, s]``
    (:meth:`to_list`, :meth:`from_seq`), as they did when it was a bare tuple.
    """

    replicas: int
    local_bsz: int
    accum_steps: int = 0

    def __post_init__(self) -> None:
        for name, value, least in (("replicas", self.replicas, 1), ("local_bsz", self.local_bsz, 1),
                                   ("accum_steps", self.accum_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"BatchConfig.{name}: expected an integer >= {least}, got {value!r}")

    @property
    def micro_steps(self) -> int:
        """Micro-batches per optimiser step (s + 1)."""
        return self.accum_steps + 1

    @property
    def batch_size(self) -> int:
        """The total batch M = K·m·(s+1)."""
        return self.replicas * self.local_bsz * (self.accum_steps + 1)

    def to_list(self) -> list[int]:
        """``[K, m, s]``: the form stored in checkpoints and logged."""
        return [self.replicas, self.local_bsz, self.accum_steps]

    @classmethod
    def from_seq(cls, values: Sequence[Any]) -> BatchConfig:
        """From ``[K, m, s]`` or ``(K, m, s)`` (checkpoints written before this record existed)."""
        if isinstance(values, BatchConfig):
            return values
        if len(values) != 3:
            raise ValueError(f"batch configuration: expected [replicas, local_bsz, accum_steps], "
                             f"got {values!r}")
        k, m, s = (int(v) for v in values)
        return cls(k, m, s)


@dataclass(slots=True)
class StepInfo:
    """One optimiser step in progress (announced by the loader, or implicit without one).

    ``scale`` is the trained batch over M0, ``nominal_scale`` the configured batch over M0 (they
    differ only for the tail step of a pass), ``fraction`` the share of a full step's progress the step
    is worth. ``micro`` is the index of the micro-step whose batch the user holds.
    ``micro_sizes`` are this replica's micro-batch sizes; ``probe`` marks a single-replica step split
    in two micro-batches to measure unbiased gradient statistics (same update as the unsplit step).
    ``shares`` are the replicas' unequal micro-batch sizes (LB-BSP; None: equal local batches): each
    replica's gradient is then weighted by its share of the batch. ``step_time`` is the compute time
    this replica measured for the previous step, sent to the others with this step's control packet
    when balancing is on (None: nothing sent), with ``memory_full`` (device memory above 95 %).
    ``compute_end`` is when the last gradient bucket of the current micro-step was ready (set by the
    DDP hook while balancing; the compute time excludes the wait for the other replicas), and
    ``compute_event`` a CUDA event the hook records then (on CUDA the host reaches the hook early).
    """

    sid: int
    replicas: int
    micro_steps: int
    local_bsz: int
    scale: float = 1.0
    nominal_scale: float = 1.0
    fraction: float = 1.0
    full: bool = True
    managed: bool = True
    micro: int = 0
    nonfinal_step_called: bool = False
    stepped: bool = False
    skipped: bool = False
    scaler_scale: float = 1.0
    finished: bool = False
    micro_sizes: tuple[int, ...] = ()
    probe: bool = False
    shares: tuple[int, ...] | None = None
    step_time: float | None = None
    memory_full: bool = False
    compute_end: float | None = None
    compute_event: Any = None

    @property
    def final(self) -> bool:
        return self.micro >= self.micro_steps - 1

    @property
    def accumulating(self) -> bool:
        return self.managed and not self.final


@dataclass(slots=True)
class SyncOutcome:
    """What the replicas agreed on at the end of a step (from the flags all-reduce)."""

    reduced: bool = False
    sigterm: bool = False
    refit: bool = False
    oom: bool = False
    nonfinite: bool = False
    #: The replicas' compute times of the previous step (seconds, by rank) followed by their
    #: memory-full flags (1.0: above 95 %), when balancing sent them.
    step_times: tuple[float, ...] | None = None


class ModelWrapper(Protocol):
    """What the context and the loaders use of the model wrapper (``AdaptiveDataParallel``).

    The step hooks (:meth:`begin_step`, :meth:`finish_sync`, :meth:`discard_gradients`,
    :meth:`release_process_group`) are called by the context only, in this order within a step;
    training scripts never call them.
    """

    @property
    def progress(self) -> float: ...

    @property
    def steps(self) -> int: ...

    @property
    def stats_ready(self) -> bool: ...

    @property
    def decision_ready(self) -> bool: ...

    @property
    def unbiased_updates(self) -> int: ...

    @property
    def grad_stats(self) -> GradStats: ...

    @property
    def gain(self) -> float: ...

    @property
    def pgns(self) -> float: ...

    @property
    def lr_factor(self) -> float: ...

    def evidence(self) -> Evidence: ...

    def expected_progress(self, info: StepInfo) -> float: ...

    def no_sync(self) -> AbstractContextManager[Any]: ...

    def begin_step(self, info: StepInfo) -> None: ...

    def finish_sync(self, info: StepInfo) -> SyncOutcome: ...

    def discard_gradients(self) -> None: ...

    def release_process_group(self) -> None: ...


class BatchLoader(Protocol):
    """What the context and the model wrapper use of a data loader (``AdaptiveDataLoader``)."""

    @property
    def init_batch_size(self) -> int: ...

    @property
    def dataset_len(self) -> int: ...

    @property
    def current_batch_size(self) -> int: ...

    @property
    def local_bsz(self) -> int: ...

    @property
    def accumulation_steps(self) -> int: ...

    @property
    def user_max_local_bsz(self) -> int | None: ...
