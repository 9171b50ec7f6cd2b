"""The shared vocabulary of SCAR: parameter blocks, models of the rework experiments, strategies.

A *block* is the unit that is lost, checkpointed and recovered together (a row of an MLR weight
matrix, a user's factor row, a document's topic counts, a layer or a shard of a CNN). Everything the
experiments do is vectorised over a leading *trial* axis: a state is ``{name: array(trials, rows,
...)}`` and 100 seeded trials run in lock-step as one population.

The same `select_blocks` decides which blocks a partial checkpoint saves, in the pure-numpy
experiments and in the live controller on ``pollux.litz``, so that "the top-r blocks by distance"
means one thing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

State = dict[str, np.ndarray]

#: Checkpoint strategies of thesis §5.4.2 / §5.5.4.
STRATEGIES = ("priority", "round", "random", "full")


class ScarError(ValueError):
    """A bad SCAR setting; the message names the field."""


@dataclass(frozen=True)
class BlockLayout:
    """How a state splits into blocks: per tensor, the block id of each row (axis 1, after trials).

    Tensors absent from `rows` (e.g. a step counter) belong to no block: they are never lost and
    never restored. Optimiser moments name the same block ids as their parameters, so they fail and
    recover with them.
    """

    rows: dict[str, np.ndarray]
    num_blocks: int

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ScarError(f"BlockLayout.num_blocks: must be >= 1, got {self.num_blocks}")
        for name, ids in self.rows.items():
            ids = np.asarray(ids)
            if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= self.num_blocks)):
                raise ScarError(
                    f"BlockLayout.rows[{name!r}]: block ids must be 1-D in [0, {self.num_blocks})"
                )

    def row_mask(self, name: str, blocks: np.ndarray) -> np.ndarray:
        """(trials, rows) bool: rows of `name` in the chosen `blocks` ((trials, num_blocks) bool)."""
        return blocks[:, self.rows[name]]


def apply_blocks(target: State, source: State, layout: BlockLayout, blocks: np.ndarray) -> State:
    """A copy of `target` whose rows in `blocks` ((trials, num_blocks) bool) come from `source`."""
    out = {k: v.copy() for k, v in target.items()}
    for name in layout.rows:
        mask = layout.row_mask(name, blocks)
        shape = mask.shape + (1,) * (out[name].ndim - 2)
        out[name] = np.where(mask.reshape(shape), source[name], out[name])
    return out


@dataclass(frozen=True)
class Protocol:
    """A model's settings of the thesis's rework protocol (§5.5.3–5.5.4).

    The convergence threshold is the unperturbed run's loss after `converge_iterations`; full
    checkpoints are taken every `checkpoint_interval` iterations (a partial one of fraction r every
    r · interval); the failure iteration is drawn from a geometric distribution of mean `failure_mean`.
    """

    converge_iterations: int = 100
    checkpoint_interval: int = 20
    failure_mean: float = 50.0

    def __post_init__(self) -> None:
        for name in ("converge_iterations", "checkpoint_interval"):
            if int(getattr(self, name)) < 1:
                raise ScarError(f"Protocol.{name}: must be >= 1, got {getattr(self, name)}")
        if self.failure_mean <= 1:
            raise ScarError(f"Protocol.failure_mean: must be > 1, got {self.failure_mean}")


class ReworkModel(ABC):
    """A model of the rework-cost experiments (thesis §5.5): deterministic, vectorised over trials.

    `step` must not draw randomness of its own beyond what the iteration number fixes (a minibatch
    schedule by iteration is fine), so that two trials with the same state stay identical and a
    trial's rework comes only from its failure.
    """

    name: str = "model"
    #: Named partitionings into blocks; the first is the default.
    layouts: dict[str, BlockLayout]
    #: Tensors whose distance the prioritised checkpoints rank (default: every blocked tensor).
    distance_tensors: tuple[str, ...] = ()
    protocol: Protocol = Protocol()

    @abstractmethod
    def init_state(self, trials: int) -> State:
        """The starting state, identical for every trial."""

    @abstractmethod
    def step(self, state: State, iteration: int) -> State:
        """One training iteration (iteration counts from 0), for all trials at once."""

    @abstractmethod
    def loss(self, state: State) -> np.ndarray:
        """(trials,) objective that convergence is judged on (lower is better)."""

    def block_distance(self, current: State, saved: State, layout: BlockLayout) -> np.ndarray:
        """(trials, num_blocks) distance of each block from its saved copy: L2 over its rows."""
        names = self.distance_tensors or tuple(layout.rows)
        trials = next(iter(current.values())).shape[0]
        out = np.zeros((trials, layout.num_blocks))
        for name in names:
            diff = (current[name] - saved[name]).reshape(trials, current[name].shape[1], -1)
            sq = np.einsum("trk,trk->tr", diff, diff)
            np.add.at(out.T, layout.rows[name], sq.T)
        return np.sqrt(out)


@dataclass
class SelectionState:
    """What a strategy remembers between checkpoints: the round-robin cursor, its generator."""

    cursor: int = 0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


def select_blocks(
    distances: np.ndarray, fraction: float, strategy: str, state: SelectionState
) -> np.ndarray:
    """(…, num_blocks) bool: the blocks a partial checkpoint of `fraction` saves.

    `priority` takes exactly ``k = ceil(fraction · num_blocks)`` blocks of largest distance (ties by
    lower block id, so the choice is deterministic); `round` the next k blocks in id order, cyclic;
    `random` k blocks drawn without replacement from `state.rng`; `full` every block. `distances`
    may carry leading axes (trials); each row is selected on its own.
    """
    if strategy not in STRATEGIES:
        raise ScarError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not 0.0 < fraction <= 1.0:
        raise ScarError(f"fraction: must be in (0, 1], got {fraction}")
    d = np.asarray(distances, dtype=float)
    n = d.shape[-1]
    k = min(n, int(np.ceil(fraction * n - 1e-9)))
    out = np.zeros(d.shape, dtype=bool)
    if strategy == "full" or k >= n:
        out[...] = True
        return out
    if strategy == "priority":
        # stable argsort of -d: largest first, ties by lower block id
        order = np.argsort(-d, axis=-1, kind="stable")[..., :k]
        np.put_along_axis(out, order, True, axis=-1)
    elif strategy == "round":
        ids = (state.cursor + np.arange(k)) % n
        out[..., ids] = True
        state.cursor = int((state.cursor + k) % n)
    else:
        keys = state.rng.random(d.shape)
        order = np.argsort(keys, axis=-1, kind="stable")[..., :k]
        np.put_along_axis(out, order, True, axis=-1)
    return out
