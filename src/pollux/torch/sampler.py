"""Deterministic, elastic sampling: which examples each replica trains on at each step (SPEC §8).

The data stream is a sequence of passes over the dataset; pass ``p`` visits the dataset in the order of
a permutation seeded by ``(seed, p)``. A *global sample index* ``g`` addresses the stream (pass
``g // N``, position ``g % N`` of that pass, N = dataset length). A step at total batch
``M = K·m·(s+1)`` takes the next M stream positions; they form ``s+1`` consecutive chunks of ``K·m``
(one per micro-step), and replica ``r`` of ``K`` takes positions ``r, r+K, r+2K, …`` of each chunk. With
equal local batches the average of the replicas' mean gradients is the mean gradient of the whole
chunk, whatever K is. Everything is a pure function of the global sample index, so a job restarted
with another replica count resumes exactly where it stopped.

Unequal shares (LB-BSP, :mod:`pollux.torch.shares`): when the replicas' micro-batches differ in size
(``shares = (x_0, …, x_{K−1})`` with ``Σ x_r = K·m``), replica ``r`` takes the *contiguous* positions
``[x_0 + … + x_{r−1}, x_0 + … + x_r)`` of each chunk instead. This is again a pure function of the
position and the shares, so every position of a full step is trained exactly once whatever the
shares were, and the state stays the global sample index alone. Equal shares use the strided rule.

Pass boundaries: a step never straddles two passes. Where fewer than M positions are left in a pass,
the step takes them all (a *tail* step, with as many micro-steps as needed and equal local batches
across replicas; with unequal shares and a single micro-step, the tail is split in the shares'
proportions instead, contiguously like a full step, so the pass's last step does not wait for the
straggler either); the ``< K`` positions that cannot be shared equally are skipped, and a full step that
leaves fewer than K positions behind skips them too, so every step belongs to one pass and a pass is
visited exactly once except for those (fewer than K) skipped positions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.balance.splits import proportional_shares


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One optimiser step as seen by one replica.

    ``start`` is the global sample index of the step's first position and ``advance`` how far the
    position moves (trained positions plus skipped ones). ``micro_batches`` holds this replica's
    dataset indices per micro-step, all replicas having equal local batches within a micro-step.
    ``samples`` is the number of examples trained on by all replicas together. ``full`` is True for a
    regular step at the configured batch (the only steps whose gradient statistics are measured).
    ``fraction = advance / M`` weighs the step's progress. ``shares`` are the replicas' unequal
    micro-batch sizes when the step used them (None: equal local batches).
    """

    start: int
    advance: int
    samples: int
    replicas: int
    rank: int
    batch_size: int
    micro_batches: tuple[tuple[int, ...], ...]
    full: bool
    shares: tuple[int, ...] | None = None

    @property
    def micro_steps(self) -> int:
        return len(self.micro_batches)

    @property
    def local_sizes(self) -> tuple[int, ...]:
        return tuple(len(mb) for mb in self.micro_batches)

    @property
    def fraction(self) -> float:
        return self.advance / self.batch_size


def check_shares(shares: tuple[int, ...], replicas: int, local_bsz: int) -> None:
    """``shares`` must be ``replicas`` positive integers summing to ``replicas × local_bsz``."""
    if (len(shares) != replicas or any(isinstance(x, bool) or int(x) != x or x < 1 for x in shares)
            or sum(int(x) for x in shares) != replicas * local_bsz):
        raise ValueError(f"shares: expected {replicas} positive integers summing to "
                         f"{replicas * local_bsz} (replicas x local batch), got {tuple(shares)!r}")


def tail_shares(shares: tuple[int, ...], total: int) -> tuple[int, ...] | None:
    """A tail step's split of ``total`` positions in the proportions of a full step's ``shares``
    (each at least 1; None when they come out equal or ``total`` is too small to give every replica
    one)."""
    if total < len(shares):
        return None
    out = tuple(int(x) for x in proportional_shares(total, np.asarray(shares, dtype=np.float64), 1))
    return None if len(set(out)) == 1 else out


class ElasticSampler:
    """The stream of passes and the step plans over it; its state is the global sample index."""

    _CACHE = 3  # permutations kept (a step touches one pass; restarts rarely go back)

    def __init__(self, dataset_len: int, shuffle: bool = True, seed: int = 0) -> None:
        if isinstance(dataset_len, bool) or int(dataset_len) != dataset_len or dataset_len < 1:
            raise ValueError(f"dataset_len: expected a positive integer, got {dataset_len!r}")
        self.dataset_len = int(dataset_len)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.position = 0
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    # ---------------------------------------------------------------- the stream

    def permutation(self, pass_index: int) -> np.ndarray:
        """Dataset order of pass ``pass_index`` (identity without shuffling)."""
        if not self.shuffle:
            return np.arange(self.dataset_len, dtype=np.int64)
        perm = self._perms.get(pass_index)
        if perm is None:
            rng = np.random.default_rng([self.seed, int(pass_index)])
            perm = rng.permutation(self.dataset_len).astype(np.int64)
            self._perms[pass_index] = perm
            while len(self._perms) > self._CACHE:
                self._perms.popitem(last=False)
        else:
            self._perms.move_to_end(pass_index)
        return perm

    def indices(self, start: int, positions: np.ndarray) -> np.ndarray:
        """Dataset indices of stream positions ``start + positions`` (all within one pass)."""
        n = self.dataset_len
        p = start // n
        return self.permutation(p)[(start - p * n) + positions]

    # ---------------------------------------------------------------- step plans

    def plan(self, position: int, replicas: int, rank: int, local_bsz: int, accum_steps: int = 0,
             shares: tuple[int, ...] | None = None) -> StepPlan:
        """The step that starts at global sample index ``position`` (see the module docstring).

        ``shares`` (optional) are the replicas' micro-batch sizes of a full step, summing to
        ``replicas × local_bsz``; a tail step of one micro-step is split in their proportions (its
        ``shares`` are then the tail's own sizes), one of several micro-steps ignores them.
        """
        k, m, s = int(replicas), int(local_bsz), int(accum_steps)
        if k < 1 or not 0 <= rank < k or m < 1 or s < 0:
            raise ValueError(f"invalid step configuration: replicas={replicas}, rank={rank}, "
                             f"local_bsz={local_bsz}, accum_steps={accum_steps}")
        if shares is not None:
            check_shares(shares, k, m)
            if len(set(shares)) == 1:
                shares = None
        n = self.dataset_len
        if n < k:
            raise ValueError(f"the dataset has {n} examples, fewer than the {k} replicas")
        batch = k * m * (s + 1)
        start = int(position)
        skipped = 0
        left = n - start % n
        if left < k:
            # Too few positions left to give every replica one (after a rescale): skip to the next pass.
            skipped, start, left = left, start + left, n
        if left >= batch:
            rest = left - batch
            advance = batch + (rest if 0 < rest < k else 0)
            sizes = [m] * (s + 1)
            full = True
        else:
            # Tail of the pass: equal local batches, as many micro-steps of at most m as needed.
            per_replica = left // k
            chunks = -(-per_replica // m)
            base, extra = divmod(per_replica, chunks)
            sizes = [base + (1 if j < extra else 0) for j in range(chunks)]
            advance = left
            full = False
            if shares is not None:
                shares = tail_shares(shares, k * per_replica) if chunks == 1 else None
        micro = []
        chunk_start = 0
        if shares is not None:
            offset = int(sum(shares[:rank]))
            step = int(sum(shares))
            for _ in sizes:
                pos = chunk_start + offset + np.arange(shares[rank], dtype=np.int64)
                micro.append(tuple(self.indices(start, pos).tolist()))
                chunk_start += step
        else:
            for size in sizes:
                pos = chunk_start + rank + k * np.arange(size, dtype=np.int64)
                micro.append(tuple(self.indices(start, pos).tolist()))
                chunk_start += k * size
        return StepPlan(start=int(position), advance=int(advance + skipped), samples=int(chunk_start),
                        replicas=k, rank=int(rank), batch_size=batch, micro_batches=tuple(micro),
                        full=full, shares=tuple(int(x) for x in shares) if shares else None)

    def iter_plans(self, position: int, replicas: int, rank: int, local_bsz: int,
                   accum_steps: int = 0, shares: tuple[int, ...] | None = None) -> Iterator[StepPlan]:
        """Successive step plans from ``position`` on (endless)."""
        while True:
            plan = self.plan(position, replicas, rank, local_bsz, accum_steps, shares)
            yield plan
            position += plan.advance

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        return {"position": int(self.position), "dataset_len": self.dataset_len, "shuffle": self.shuffle,
                "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["dataset_len"]) != self.dataset_len:
            raise ValueError(f"sampler state: saved for a dataset of {state['dataset_len']} examples, "
                             f"this one has {self.dataset_len}")
        if bool(state["shuffle"]) != self.shuffle or int(state["seed"]) != self.seed:
            raise ValueError("sampler state: saved with another shuffle/seed setting")
        position = int(state["position"])
        if position < 0:
            raise ValueError(f"sampler state: negative position {position}")
        self.position = position
