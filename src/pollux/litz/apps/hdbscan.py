"""Approximate HDBSCAN on Litz (thesis §4.7): an NN-Descent kNN graph, then HDBSCAN on its edges.

**Executors own points.** The n points are cut into one contiguous block per executor; an executor
keeps the kNN lists of its block as its *state* (`get_state`/`set_state`: they move with it and go
into checkpoints), and reads the points themselves as *input* (all of them: a distance needs both
ends; see `hdbscan_data`). The parameter server holds what everyone must see, published by each
block's owner as additive differences of whole rows: `graph` (n × k neighbour ids) and `kind` (n × k:
whether an entry takes part in the next join, `nn_descent.WAITING/SAMPLED/OLD`). Ids are whole
numbers, so their sums are exact whatever the order the PS adds them in.

**An iteration is two synchronous rounds of micro-tasks** (`nn_descent` explains the algorithm):

1. *join*: each executor reads the published graph and kinds and runs the local join of its
   points' neighbourhoods; every proposal (x, y, d) goes to x's owner. With the d_max broadcast
   (`broadcast`, on by default) the executor drops the proposals x's owner would reject before they
   travel (thesis: −42 % run time on 4 machines). The published graph already broadcasts what
   d_max(x) needs, x's last neighbour: the executor recomputes d_max(x) = d(x, last(x)) for every
   point (n distances per join, bit for bit the owner's value) instead of reading a table of floats
   that additive updates, summed in another order, could round differently.
2. *merge*: each executor applies the proposals sent to it (the owner's rule: accepted if not
   beyond d_max(x)), draws the next iteration's sample and publishes its rows.

Proposals are variable-sized messages, which the PS (dense tables of additive updates) does not
carry; they travel as the join task's *result* and the merge task's *arguments*, through the
driver, which passes them on in sender order (an executor keeps those to itself in its state).
The iteration ends when the merges changed at most δ · n · k list entries, or after
`max_iterations`.

**Determinism.** Random choices are keyed per point, not per block, and a merge is a function of the
set of proposals; each round reads only what the previous round published. The graph after t
iterations, hence the labels, depend only on the data, the seed and the settings: not on the number
of executors, nor on where they ran or when they moved (the elastic tests compare a resized run with
an unresized one, label for label).

**Clustering.** When NN-Descent stops, the driver reads the graph from the PS, recomputes its
distances from the points (exact, whatever rounding additive PS updates may add) and runs
`hdbscan_tree.cluster_knn_graph`: core distances, the MST of mutual reachability on the kNN edges
(Kruskal on one machine; components joined as that module says; by default built again with a link
from each leaf cluster to its surroundings, `hdbscan_links`), the condensed tree with
`min_cluster_size`, excess-of-mass selection, labels (-1 noise). The run's result has the labels
(`labels`, a numpy array), the cluster count, the noise fraction and the time of each phase.

Config keys (defaults): data (None: a generated set; else a .npy or .csv file); n (10000), dim
(10), clusters (100), noise (0.2) — the generated set; seed (0); k (10, neighbours per list);
min_samples (None: k; scikit-learn's meaning, the point itself counted, so at most k + 1);
min_cluster_size (5); sample_rate (0.5: ρ, new neighbours per point and join, times k);
delta (0.001); max_iterations (30); broadcast (True); metric ("euclidean" | "cosine"); link_hops (2:
how far a leaf cluster looks for its link to the others, `hdbscan_tree`; 0: the plain kNN tree).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.litz.api import Application, Driver, DriverContext, Executor, TableSpec, TaskContext, TaskResult
from pollux.litz.apps import nn_descent as nnd
from pollux.litz.apps.hdbscan_data import PointSet, gaussian_clusters, load_points
from pollux.litz.apps.hdbscan_tree import DEFAULT_LINK_HOPS, cluster_knn_graph

METRICS = ("euclidean", "cosine")


@dataclass(frozen=True)
class HDBSCANConfig:
    """Every key of the module docstring, validated once."""

    data: str | None
    n: int
    dim: int
    clusters: int
    noise: float
    seed: int
    k: int
    min_samples: int
    min_cluster_size: int
    sample_rate: float
    delta: float
    max_iterations: int
    broadcast: bool
    metric: str
    link_hops: int

    @property
    def sample(self) -> int:
        """New neighbours per point and join, forward and reverse each: ⌈ρ · k⌉."""
        return max(1, math.ceil(self.sample_rate * self.k))

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> HDBSCANConfig:
        k = int(config.get("k", 10))
        if k < 1:
            raise ValueError(f"hdbscan config 'k' must be >= 1, got {k}")
        min_samples = k if config.get("min_samples") is None else int(config["min_samples"])
        if not 1 <= min_samples <= k + 1:
            raise ValueError(
                f"hdbscan config 'min_samples' must be in [1, k + 1 = {k + 1}], got {min_samples}"
            )
        mcs = int(config.get("min_cluster_size", 5))
        if mcs < 2:
            raise ValueError(f"hdbscan config 'min_cluster_size' must be >= 2, got {mcs}")
        rate = float(config.get("sample_rate", 0.5))
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"hdbscan config 'sample_rate' must be in (0, 1], got {rate}")
        delta = float(config.get("delta", 0.001))
        if not delta >= 0.0:
            raise ValueError(f"hdbscan config 'delta' must be >= 0, got {delta}")
        iterations = int(config.get("max_iterations", 30))
        if iterations < 1:
            raise ValueError(f"hdbscan config 'max_iterations' must be >= 1, got {iterations}")
        metric = str(config.get("metric", "euclidean"))
        if metric not in METRICS:
            raise ValueError(f"hdbscan config 'metric': unknown {metric!r} (known: {', '.join(METRICS)})")
        link_hops = int(config.get("link_hops", DEFAULT_LINK_HOPS))
        if link_hops < 0:
            raise ValueError(f"hdbscan config 'link_hops' must be >= 0, got {link_hops}")
        data = config.get("data")
        return cls(
            data=None if data is None else str(data),
            n=int(config.get("n", 10000)),
            dim=int(config.get("dim", 10)),
            clusters=int(config.get("clusters", 100)),
            noise=float(config.get("noise", 0.2)),
            seed=int(config.get("seed", 0)),
            k=k,
            min_samples=min_samples,
            min_cluster_size=mcs,
            sample_rate=rate,
            delta=delta,
            max_iterations=iterations,
            broadcast=bool(config.get("broadcast", True)),
            metric=metric,
            link_hops=link_hops,
        )


@dataclass(frozen=True)
class Prepared:
    """The points as the algorithm uses them: transposed, dim × n (`nn_descent.sq_distances` says
    why), float64, unit vectors for the cosine metric."""

    columns: np.ndarray
    truth: np.ndarray | None

    @property
    def n(self) -> int:
        return int(self.columns.shape[1])

    @property
    def points(self) -> np.ndarray:
        """n × dim (a view)."""
        return self.columns.T

    def distance(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Distances in the metric between points a[i] and b[i]."""
        sq = nnd.sq_distances(self.columns, a, b)
        return np.sqrt(sq) if metric == "euclidean" else 0.5 * sq

    def block_distance(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The matrix of distances in the metric between points a[i] and b[j], by one matrix product
        (|x|² + |y|² − 2 x·y): other rounding than `distance`, so it only chooses among pairs (the
        links between clusters, `hdbscan_links`), it gives no weight."""
        left, right = self.points[a], self.points[b]
        sq = (left * left).sum(axis=1)[:, None] + (right * right).sum(axis=1)[None, :]
        sq -= 2.0 * (left @ right.T)
        np.maximum(sq, 0.0, out=sq)
        return np.sqrt(sq) if metric == "euclidean" else 0.5 * sq


def point_set(cfg: HDBSCANConfig) -> PointSet:
    """The file's points, or the generated set."""
    return _point_set(cfg.data, cfg.n, cfg.dim, cfg.clusters, cfg.noise, cfg.seed)


def _point_set(data: str | None, n: int, dim: int, clusters: int, noise: float, seed: int) -> PointSet:
    if data is not None:
        return load_points(data)
    return gaussian_clusters(n, dim, clusters, noise, seed)


def prepare(cfg: HDBSCANConfig) -> Prepared:
    """The points of `cfg`, checked against k, cached per process (every executor of a worker and
    the driver share one copy)."""
    return _prepared(cfg.data, cfg.n, cfg.dim, cfg.clusters, cfg.noise, cfg.seed, cfg.metric, cfg.k)


@functools.lru_cache(maxsize=2)
def _prepared(data: str | None, n: int, dim: int, clusters: int, noise: float, seed: int, metric: str,
              k: int) -> Prepared:
    ps = _point_set(data, n, dim, clusters, noise, seed)
    points = ps.points
    where = data or "generated data"
    if points.shape[0] < k + 2:
        raise ValueError(f"hdbscan: {where} has {points.shape[0]} points; k = {k} needs at least k + 2")
    if metric == "cosine":
        norms = np.linalg.norm(points, axis=1)
        if (norms == 0).any():
            raise ValueError(f"hdbscan: {where}: point {int(np.flatnonzero(norms == 0)[0])} is zero, "
                             "which has no cosine distance")
        points = points / norms[:, None]
    columns = np.ascontiguousarray(points.T, dtype=np.float64)
    columns.setflags(write=False)
    return Prepared(columns, ps.truth)


def _as_ids(values: np.ndarray) -> np.ndarray:
    """Ids read from a float PS table (sums of whole numbers: exact)."""
    return np.rint(values).astype(np.int64)


class HDBSCANExecutor(Executor):
    """One block of points: their kNN lists (state) and what it last published of them."""

    def __init__(self, executor_id: int, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(executor_id, num_executors, config)
        self.cfg = HDBSCANConfig.from_mapping(config)
        self.lists: nnd.BlockLists | None = None
        self.shown: dict[str, np.ndarray] | None = None  # the rows as last published
        self.pending = nnd.Proposals.empty()  # this iteration's proposals to its own points

    def load_input(self) -> Prepared:
        return prepare(self.cfg)

    def _block(self) -> tuple[int, int, np.ndarray]:
        bounds = nnd.block_bounds(self.input.n, self.num_executors)
        return int(bounds[self.executor_id]), int(bounds[self.executor_id + 1]), bounds

    def get_state(self) -> Any:
        return {"lists": self.lists, "shown": self.shown, "pending": self.pending}

    def set_state(self, state: Any) -> None:
        if state is not None:
            self.lists, self.shown, self.pending = state["lists"], state["shown"], state["pending"]

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        kind = args["kind"]
        if kind == "init":
            return self._init(ctx)
        if kind == "join":
            return await self._join(ctx, int(args["t"]))
        if kind == "merge":
            return self._merge(ctx, int(args["t"]), args["inbox"])
        if kind == "ping":
            return {"kind": "ping"}
        raise ValueError(f"hdbscan: unknown task kind {kind!r}")

    def _publish(self, ctx: TaskContext, kinds: np.ndarray) -> None:
        """Write the block's rows of `graph` and `kind` as differences to what it last wrote."""
        assert self.lists is not None
        lo, hi, _ = self._block()
        rows = None if hi - lo == self.input.n else np.arange(lo, hi)  # whole tables: the PS's fast path
        now = {"graph": self.lists.idx.astype(np.float64), "kind": kinds.astype(np.float64)}
        before = self.shown or {name: np.zeros_like(values) for name, values in now.items()}
        for name, values in now.items():
            ctx.ps.update(name, values - before[name], rows)
        self.shown = now

    def _init(self, ctx: TaskContext) -> Any:
        lo, hi, _ = self._block()
        cfg = self.cfg
        self.lists = nnd.initial_lists(self.input.columns, lo, hi, cfg.k, cfg.seed)
        self._publish(ctx, nnd.take_sample(self.lists, cfg.sample, cfg.seed, 0, self.input.n))
        return {"kind": "init"}

    async def _join(self, ctx: TaskContext, t: int) -> Any:
        lo, hi, bounds = self._block()
        cfg = self.cfg
        graph = _as_ids(await ctx.ps.get("graph"))
        kinds = _as_ids(await ctx.ps.get("kind"))
        dmax = None
        if cfg.broadcast:  # d_max of every point, from its published last neighbour (module doc)
            dmax = nnd.sq_distances(self.input.columns, np.arange(self.input.n), graph[:, -1])
        proposals, tried = nnd.local_join(self.input.columns, graph, kinds, lo, hi, cfg.sample, cfg.seed, t,
                                          dmax)
        by_owner = nnd.split_by_owner(proposals, bounds)
        self.pending = by_owner.pop(self.executor_id, nnd.Proposals.empty())
        return {"kind": "join", "t": t, "messages": by_owner, "tried": tried,
                "sent": sum(len(p) for p in by_owner.values()),
                "bytes": sum(p.nbytes() for p in by_owner.values()), "kept": len(self.pending)}

    def _merge(self, ctx: TaskContext, t: int, inbox: Sequence[nnd.Proposals]) -> Any:
        assert self.lists is not None, "hdbscan executor merged before its init task"
        proposals = nnd.Proposals.concat([*inbox, self.pending])
        self.pending = nnd.Proposals.empty()
        changes = nnd.merge(self.lists, proposals, self.input.columns)
        cfg = self.cfg
        self._publish(ctx, nnd.take_sample(self.lists, cfg.sample, cfg.seed, t + 1, self.input.n))
        return {"kind": "merge", "t": t, "changes": changes, "received": len(proposals)}


class HDBSCANDriver(Driver):
    """Init, then join and merge rounds until NN-Descent converges, then the clustering."""

    def __init__(self, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(num_executors, config)
        self.cfg = HDBSCANConfig.from_mapping(config)
        self.phase = "init"
        self.t = 0
        self.waiting = 0
        self.inbox: dict[int, list[tuple[int, nnd.Proposals]]] = {}
        self.changes: list[int] = []
        self.round_changes = 0
        self.tried = 0
        self.sent = 0
        self.sent_bytes = 0
        self.kept = 0
        self.t_start = 0.0
        self.finished = False

    def state_dict(self) -> Any:
        return {k: v for k, v in vars(self).items() if k not in ("config", "cfg")}

    def tables(self) -> Sequence[TableSpec]:
        n, k = prepare(self.cfg).n, self.cfg.k
        if self.num_executors > n:
            raise ValueError(f"hdbscan: {self.num_executors} executors for {n} points: at most one per point")
        return [TableSpec("graph", (n, k)), TableSpec("kind", (n, k))]

    def hold_open(self) -> bool:
        """Whether to hold the job between two iterations (with no-op tasks); never, here. A test
        overrides it to keep a run going until its resizes have finished."""
        return False

    def _round(self, ctx: DriverContext, args: dict[str, Any]) -> None:
        self.waiting = ctx.num_executors
        for e in range(ctx.num_executors):
            ctx.dispatch(e, args)

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self.t_start = time.perf_counter()
        self._round(ctx, {"kind": "init"})

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        value = result.value
        if value["kind"] == "join":
            for dst, proposals in value["messages"].items():
                self.inbox.setdefault(int(dst), []).append((result.executor_id, proposals))
            self.tried += int(value["tried"])
            self.sent += int(value["sent"])
            self.sent_bytes += int(value["bytes"])
            self.kept += int(value["kept"])
        elif value["kind"] == "merge":
            self.round_changes += int(value["changes"])
        self.waiting -= 1
        if self.waiting > 0 or self.finished:
            return
        if value["kind"] == "join":
            self._merges(ctx)
        elif value["kind"] == "merge":
            self._iteration_done(ctx)
        else:  # init or ping
            self._next_join(ctx)

    def _merges(self, ctx: DriverContext) -> None:
        """Each executor gets the proposals for its points, in sender order."""
        self.waiting = ctx.num_executors
        for e in range(ctx.num_executors):
            inbox = [p for _, p in sorted(self.inbox.pop(e, []), key=lambda item: item[0])]
            ctx.dispatch(e, {"kind": "merge", "t": self.t, "inbox": inbox})

    def _iteration_done(self, ctx: DriverContext) -> None:
        n, cfg = prepare(self.cfg).n, self.cfg
        changed = self.round_changes
        self.changes.append(changed)
        self.round_changes = 0
        self.t += 1
        ctx.report(iteration=self.t, objective=changed / (n * cfg.k), changes=changed)
        if changed <= cfg.delta * n * cfg.k or self.t >= cfg.max_iterations:
            self._cluster(ctx)
        else:
            self._next_join(ctx)

    def _next_join(self, ctx: DriverContext) -> None:
        if self.phase != "init" and self.hold_open():
            self._round(ctx, {"kind": "ping"})
            return
        self.phase = "descent"
        self._round(ctx, {"kind": "join", "t": self.t})

    def _cluster(self, ctx: DriverContext) -> None:
        """The kNN graph from the PS, its exact distances, then HDBSCAN on it (module doc)."""
        cfg = self.cfg
        data = prepare(cfg)
        t_graph = time.perf_counter()
        idx = _as_ids(ctx.ps_get("graph"))
        rows = np.repeat(np.arange(data.n), cfg.k)
        dist = data.distance(cfg.metric, rows, idx.ravel()).reshape(idx.shape)
        clustering = cluster_knn_graph(idx, dist, data.points, cfg.min_samples, cfg.min_cluster_size,
                                       functools.partial(data.distance, cfg.metric), cfg.link_hops,
                                       functools.partial(data.block_distance, cfg.metric))
        t_end = time.perf_counter()
        self.finished = True
        ctx.finish({
            "objective": self.changes[-1] / (data.n * cfg.k),
            "iterations": self.t,
            "points": data.n,
            "clusters": clustering.num_clusters,
            "noise_fraction": clustering.noise_fraction,
            "graph_components": clustering.components,
            "links": clustering.links,
            "nn_descent_s": t_graph - self.t_start,
            "hdbscan_s": t_end - t_graph,
            "pairs_tried": self.tried,
            "proposals_sent": self.sent,
            "proposal_bytes_sent": self.sent_bytes,
            "proposals_kept": self.kept,
            "changes": list(self.changes),
            "broadcast": cfg.broadcast,
            "labels": clustering.labels,
        })


def hdbscan_app(**config: Any) -> Application:
    """The HDBSCAN application with `config` (keys in the module docstring)."""
    HDBSCANConfig.from_mapping(config)
    return Application("hdbscan", HDBSCANDriver, HDBSCANExecutor, dict(config))
