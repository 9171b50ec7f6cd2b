"""The speedup tables of one Pollux round (SPEC §4–5) and the one lookup into them.

Each job's table holds its SPEEDUP on n nodes and r GPUs, from :func:`pollux.goodput.speedup_table`
(a job without a model gets the linear-scaling prior), multiplied by the d·num_nodes factor. The
tables are built once per round, each only as large as its job's replica cap (or its pinned row)
requires, and stacked into one array so that a whole population is looked up in one indexing
operation (:meth:`SpeedupTables.lookup`). A table is a pure function of (model, limits, fair share,
size), so the policy memoises the unscaled ones across rounds without changing any result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, fair_share, speedup_table
from pollux.policy.base import Cluster, JobView


def fair_and_scale(cluster: Cluster, num_jobs: int) -> tuple[tuple[int, int], float]:
    """The fair share (nodes, replicas) and the d·num_nodes factor of the tables (SPEC §4).

    A non-uniform cluster is treated as one pool of its total GPUs: d = 1/total, fair = ceil(total/J)
    replicas on 1 node (the reference quirk). A cluster without GPUs scales every table to 0.
    """
    num_nodes = cluster.num_nodes
    total = int(cluster.capacity().sum())
    if num_nodes and total > 0:
        if len(set(cluster.gpus)) == 1:
            fair = fair_share(num_nodes, int(cluster.gpus[0]), num_jobs)
        else:
            fair = fair_share(1, total, num_jobs)
        return fair, num_nodes / total
    return (1, 1), 0.0


def table_sizes(max_replicas: np.ndarray, pinned: np.ndarray, cur: np.ndarray, max_nodes: int,
                num_nodes: int) -> list[tuple[int, int]]:
    """Per job, the largest (nodes, replicas) its table must cover.

    The search never gives a job more than its replica cap, nor spreads it over more than
    ``max_nodes`` nodes; but a pinned job keeps its current row, which may exceed both, and its
    speedup there must still be read.
    """
    cur_replicas = cur.sum(axis=1)
    cur_nodes = (cur > 0).sum(axis=1)
    sizes = []
    for j in range(len(max_replicas)):
        cap = int(max_replicas[j])
        replicas = max(cap, int(cur_replicas[j])) if pinned[j] else cap
        nodes = min(max_nodes, num_nodes, replicas)
        if pinned[j]:
            nodes = max(nodes, int(cur_nodes[j]))
        sizes.append((nodes, replicas))
    return sizes


class SpeedupTables:
    """Every job's speedup table of one round, stacked as one ``(jobs, nodes + 1, replicas + 1)``
    array (zero beyond a job's own size), with the one lookup into it.

    ``cache`` is the policy's memo of unscaled tables across rounds (least recently used first,
    at most ``cache_size`` entries; none when ``cache_size`` is 0). ``round_jobs`` is the number of
    jobs in the round when ``jobs`` are only some of them (default: all of them).
    """

    def __init__(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        sizes: Sequence[tuple[int, int]],
        cache: OrderedDict | None = None,
        cache_size: int = 0,
        round_jobs: int | None = None,
    ) -> None:
        # The fair share counts every job of the round, also those a search leaves out (.prune).
        self.fair, self.scale = fair_and_scale(cluster, len(jobs) if round_jobs is None else round_jobs)
        self.nt_max = max((nodes for nodes, _ in sizes), default=0)
        self.rt_max = max((replicas for _, replicas in sizes), default=0)
        table = np.zeros((len(jobs), self.nt_max + 1, self.rt_max + 1))
        # Jobs without a model share the linear prior: one table per size, written to all at once
        # (an overloaded round holds hundreds of such jobs, all waiting).
        linear: dict[tuple[int, int], list[int]] = {}
        for j, (job, (nt, rt)) in enumerate(zip(jobs, sizes, strict=True)):
            if rt <= 0 or nt <= 0 or self.scale == 0.0:
                continue
            if job.model is None:
                linear.setdefault((nt, rt), []).append(j)
                continue
            table[j, : nt + 1, : rt + 1] = self._build(job.model, job.limits, nt, rt, cache, cache_size)
        for (nt, rt), rows in linear.items():
            table[rows, : nt + 1, : rt + 1] = self._linear(nt, rt)
        self.table = table
        # Best speedup at each replica count over any node count: bounds what a spread can reach.
        self.best_any_nodes = table.max(axis=1)
        # The flat view and each job's offset in it, so that a lookup is one fancy index.
        self.flat = table.reshape(-1)
        self.base = np.arange(len(jobs), dtype=np.int64) * ((self.nt_max + 1) * (self.rt_max + 1))
        # Per job, its table and best-over-nodes row as Python lists (the greedy's fast path).
        self._lists: dict[int, tuple[list[list[float]], list[float]]] = {}

    def lookup(self, jobs: np.ndarray | int, nodes: np.ndarray | int,
               replicas: np.ndarray | int) -> np.ndarray:
        """SPEEDUP of ``jobs`` (indices, broadcast with the counts) on ``nodes`` nodes and ``replicas``
        GPUs (counts beyond a table read its last entry)."""
        return self.flat[self.base[jobs] + np.minimum(nodes, self.nt_max) * (self.rt_max + 1)
                         + np.minimum(replicas, self.rt_max)]

    def as_lists(self, j: int) -> tuple[list[list[float]], list[float]]:
        """Job j's table and its best-over-nodes row as Python lists, built once: the greedy reads
        single entries thousands of times, where indexing a list is much cheaper than numpy."""
        got = self._lists.get(j)
        if got is None:
            got = (self.table[j].tolist(), self.best_any_nodes[j].tolist())
            self._lists[j] = got
        return got

    def _linear(self, nt: int, rt: int) -> np.ndarray:
        """The scaled table of a job without a model up to ``nt`` nodes and ``rt`` replicas: the
        linear-scaling prior, ``replicas / fair replicas`` wherever ``1 ≤ nodes ≤ replicas``."""
        r = np.arange(rt + 1, dtype=np.float64)
        n = np.arange(nt + 1)[:, None]
        tab = np.where((n >= 1) & (n <= r[None, :]), r[None, :] / self.fair[1], 0.0)
        return tab * self.scale

    def _build(self, model: GoodputModel, limits: BatchLimits | None, nt: int, rt: int,
               cache: OrderedDict | None, cache_size: int) -> np.ndarray:
        """The scaled table of a job with ``model`` and ``limits`` up to ``nt`` nodes and ``rt``
        replicas (jobs without a model get :meth:`_linear`)."""
        if limits is None:
            limits = BatchLimits(model.init_batch_size)
        key = (model, limits, self.fair, nt, rt)
        if cache is not None and cache_size > 0:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit * self.scale
        # The throughput model (SPEC §3) sees the node count only as "one node or more": entries for
        # 3+ nodes equal those for 2 wherever n ≤ r. Build the table up to 2 nodes and copy (several
        # times cheaper; tests check it against the full table).
        built = min(nt, 2)
        tab = speedup_table(model, limits, built, rt, self.fair, replica_cap=rt)
        if nt > built:
            r = np.arange(rt + 1)
            n = np.arange(built + 1, nt + 1)[:, None]
            tab = np.concatenate([tab, np.where(r[None, :] >= n, tab[built][None, :], 0.0)])
        if cache is not None and cache_size > 0:
            cache[key] = tab
            while len(cache) > cache_size:
                cache.popitem(last=False)
        return tab * self.scale
