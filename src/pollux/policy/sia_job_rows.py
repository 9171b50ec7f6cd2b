"""One job's rows of Sia's configuration table, and their memo across rounds (issue 38).

Most jobs a round lists are unchanged since the previous round: a queued job keeps its model, its
limits and its (empty) allocation for hours. Its rows of the table — the candidate counts per type,
their normalised goodputs, which ones change its configuration, the normaliser — are a pure function
of a small record, :class:`RowInputs`, which :func:`pollux.policy.sia_configs.build_configs` builds
for every job and every round. The rows are computed from that record *alone*, so that a memo keyed
by it cannot return rows that the job's current state would not give: everything the computation
reads is in the key by construction.

What varies every round and is not in the key: the job's age (its re-allocation factor ``f``, one
vectorised call per round over all jobs) and the free GPUs of each type, of which the key holds only
what the rows can see (:attr:`TypeInput.upper`, the free GPUs capped by the job's largest possible
candidate count).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel
from pollux.policy.sia_goodput import GoodputAsk


class TypeInput(NamedTuple):
    """What a job's rows on one GPU type depend on.

    ``model``/``limits`` are the job's on the type (``model`` None: no goodput model yet). ``upper``
    is the most GPUs of the type the job may get this round (the free GPUs and ``max_replicas``),
    capped by the largest count the job could list at all (:func:`candidate_bound`): above that,
    more free GPUs change nothing, and the key stays the same while a queued job waits.

    A named tuple rather than a frozen dataclass: every job's inputs are built and compared every
    round (223,000 times in Sia's 960-job run), and a tuple is made and compared in C.
    """

    model: GoodputModel | None
    limits: BatchLimits | None
    upper: int


class RowInputs(NamedTuple):
    """Everything one job's rows are computed from (and so the memo's key; a named tuple for the
    reason given on :class:`TypeInput`).

    ``current`` is (type index, GPUs, nodes) of the job's current allocation on one type, or None.
    ``fixed`` is the job's rigid count (only when the policy runs jobs rigidly; else None).
    ``per_type[t]`` is None where the job cannot run on type t this round (no profile there, fewer
    GPUs free than its fewest, or no nodes of the type).
    """

    current: tuple[int, int, int] | None
    min_replicas: int
    max_replicas: int
    max_replicas_seen: int
    fixed: int | None
    per_type: tuple[TypeInput | None, ...]


def effective_limits(given: TypeInput) -> BatchLimits | None:
    """The limits a job's goodputs on a type are computed under: its own, or the fixed batch M0 of
    its model when it reported none."""
    if given.model is not None and given.limits is None:
        return BatchLimits(given.model.init_batch_size)
    return given.limits


def count_key(inputs: RowInputs) -> tuple:
    """Everything in ``inputs`` that a job's candidate counts depend on: all of it but the goodput
    models themselves (whether there is one, and the limits they run under, do count). Two inputs
    with equal keys plan the same counts; only the goodputs asked for differ."""
    per_type = tuple(None if given is None else (given.model is None, effective_limits(given), given.upper)
                     for given in inputs.per_type)
    return (inputs.current, inputs.min_replicas, inputs.max_replicas, inputs.max_replicas_seen,
            inputs.fixed, per_type)


@dataclass(frozen=True, slots=True)
class TypePlan:
    """One type of a job's rows before the goodputs are known: its candidate counts, which of them
    fit this round, and the goodputs to ask for (None for a job without a model: G = GPUs / fewest)."""

    gtype: int
    counts: np.ndarray
    fits: np.ndarray
    ask: GoodputAsk | None


@dataclass(frozen=True, slots=True)
class RowPlan:
    """A job's rows up to the goodputs: :func:`pollux.policy.sia_configs.plan_rows` makes it,
    :func:`pollux.policy.sia_configs.assemble_rows` finishes it with the answers to its
    :attr:`asks` — split so that a round's asks go to the optimiser together."""

    current: tuple[int, int, int] | None
    types: tuple[TypePlan, ...]

    @property
    def asks(self) -> list[GoodputAsk]:
        return [plan.ask for plan in self.types if plan.ask is not None]

    def with_models(self, inputs: RowInputs) -> RowPlan:
        """The same counts asking for the goodputs of the models in ``inputs``, whose
        :func:`count_key` must equal that of the inputs this plan was made from."""
        types = []
        for plan in self.types:
            ask = plan.ask
            if ask is not None:
                given = inputs.per_type[plan.gtype]
                assert given is not None and given.model is not None
                ask = GoodputAsk(given.model, ask.limits, ask.nodes, ask.counts)
            types.append(TypePlan(plan.gtype, plan.counts, plan.fits, ask))
        return RowPlan(self.current, tuple(types))


@dataclass(frozen=True, slots=True)
class JobRows:
    """One job's rows of the table, in table order (types ascending, counts ascending per type).

    ``goodput`` is already normalised by ``norm`` (0 when the job has no rows). ``counts`` is the
    job's entry of :attr:`pollux.policy.sia_configs.ConfigTable.counts`; it is shared between
    the tables of the rounds that reuse these rows and must not be changed.
    """

    gtype: np.ndarray
    count: np.ndarray
    goodput: np.ndarray
    changed: np.ndarray
    counts: dict[int, tuple[int, ...]]
    norm: float

    @property
    def size(self) -> int:
        return int(self.count.size)


def candidate_bound(current: tuple[int, int, int] | None, min_replicas: int, max_replicas_seen: int,
                    fixed: int | None, explore_factor: int) -> int:
    """The largest count a job could list on any type, whatever the free GPUs.

    Its candidates are counts up to its exploration cap (at most ``explore_factor ×`` the most GPUs
    it has held, at least 1, raised to ``min_replicas``), its ``min_replicas``, its current count and,
    for a rigid job, its fixed count. Free GPUs beyond this bound cannot change its rows.
    """
    held = current[1] if current is not None else 0
    rigid = fixed if fixed is not None else 0
    return max(int(explore_factor) * int(max_replicas_seen), 1, int(min_replicas), held, rigid)


class RowMemo:
    """The rows of the jobs of recent rounds, one entry per job id, the least recently used dropped
    past ``size`` entries.

    An entry is reused only when the job's :class:`RowInputs` equal the stored ones; a job whose
    inputs changed replaces its entry. The memo is valid for one table context (the GPU types, the
    node size of each type, the rigidity and exploration options): :meth:`bind` empties it when the
    context differs from the one it was filled under.

    An entry also keeps the plan its rows were assembled from: a job whose inputs changed only in
    their goodput models (a running job's gradient statistics move at every epoch, a refit moves its
    throughput model; 19,379 of the 22,832 misses in Sia's 960-job run) plans the same counts, so
    :meth:`plan` hands that plan back for its new models, and only the goodputs are computed again.
    """

    def __init__(self, size: int) -> None:
        self.size = max(int(size), 0)
        self._data: OrderedDict[str, tuple[RowInputs, JobRows, tuple, RowPlan]] = OrderedDict()
        self._context: tuple | None = None
        self.hits = 0
        self.misses = 0
        #: Misses whose stored plan served again (:meth:`plan`).
        self.replans = 0

    def bind(self, context: tuple) -> None:
        """Use the memo for tables of ``context``; entries of another context are dropped."""
        if context != self._context:
            self._data.clear()
            self._context = context

    def get(self, job_id: str, inputs: RowInputs) -> JobRows | None:
        """The stored rows of ``job_id`` if they were computed from equal inputs; else None."""
        entry = self._data.get(job_id)
        if entry is None or entry[0] != inputs:
            self.misses += 1
            return None
        self._data.move_to_end(job_id)
        self.hits += 1
        return entry[1]

    def plan(self, job_id: str, inputs: RowInputs, key: tuple) -> RowPlan | None:
        """The stored plan of ``job_id`` for the models of ``inputs`` when it was made from inputs of
        the same :func:`count_key` ``key``; else None."""
        entry = self._data.get(job_id)
        if entry is None or entry[2] != key:
            return None
        self.replans += 1
        return entry[3].with_models(inputs)

    def put(self, job_id: str, inputs: RowInputs, rows: JobRows, key: tuple, plan: RowPlan) -> None:
        """Keep ``rows``, made by ``plan`` from ``inputs`` (whose :func:`count_key` is ``key``)."""
        if not self.size:
            return
        self._data[job_id] = (inputs, rows, key, plan)
        self._data.move_to_end(job_id)
        while len(self._data) > self.size:
            self._data.popitem(last=False)
