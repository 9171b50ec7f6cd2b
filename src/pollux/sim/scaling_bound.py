"""The cheapest node schedule for one job that knows its own true profile: a lower bound on the
node-hours any autoscaler can reach in the simulator's cloud at a given completion time.

Why it exists: a cost target such as "25 % fewer node-hours, at most 6 % later" can be out of reach
of *every* rule on a given profile, however well tuned. Telling that apart from a weak rule needs a
bound, not another rule. The bound here is computed for a schedule that is better informed and less
constrained than any real one, so no real schedule can beat it:

* the job runs on whole packed nodes (``gpus_per_node`` GPUs each), ``N`` = 1..``max_nodes``, one
  ``N`` per epoch. The trace's gradient statistics are constant within an epoch, so a change of size
  in the middle of an epoch never beats the same change at one of its ends (the cost is linear in
  where the switch falls);
* at each ``N`` and epoch it runs the configuration with the highest *true* progress rate: the batch
  candidates of SPEC §4 and the initial batch on every GPU, the profile's step times, the efficiency
  at the candidate batch. That is the best any fitted model could choose;
* each change of size, and the first start, costs ``restart_s`` without progress, billed at the new
  size only; each added node is billed ``provision_s`` before it runs (asked for ahead, so the job
  never waits for it);
* no exploration cap, no fitting, no scheduling interval.

For a weight ``μ`` (node-seconds per second of completion), dynamic programming over the epochs finds
the schedule minimising ``node_seconds + μ·completion`` exactly, at value ``D(μ)``. Every schedule
finishing by ``T`` then costs at least ``D(μ) − μ·T`` (Lagrangian duality), for every ``μ``; the
bound is the largest of these over a grid of weights. The cheapest of the minimising schedules that
finishes by ``T`` is reported beside it: a schedule that reaches the bound's neighbourhood, to show
what the bound asks of a rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pollux.goodput.efficiency import gain
from pollux.goodput.model import accumulation_plan, batch_candidates
from pollux.sim.profiles import AppProfile, placement_parts, placement_shape

__all__ = ["ScalingBound", "Schedule", "bound_at", "cheapest_schedule", "epoch_rates", "epoch_times",
           "epoch_work", "gpu_rates"]

#: Weights μ tried by :func:`bound_at`, in node-seconds per second of completion.
DEFAULT_WEIGHTS = np.geomspace(1e-2, 1e4, 241)


@dataclass(frozen=True)
class Schedule:
    """Nodes per epoch, and what running it costs and takes under the bound's accounting
    (``starts``: the second each epoch begins, its restart included)."""

    nodes: tuple[int, ...]
    completion_s: float
    node_seconds: float
    starts: tuple[float, ...]

    def change_points(self) -> list[tuple[int, int]]:
        """``(epoch, nodes)`` at the first epoch and wherever the size changes."""
        return [(e, n) for e, n in enumerate(self.nodes) if e == 0 or n != self.nodes[e - 1]]

    def change_times(self) -> list[tuple[float, int]]:
        """``(seconds, nodes)`` at the start and wherever the size changes."""
        return [(self.starts[e], n) for e, n in self.change_points()]


@dataclass(frozen=True)
class ScalingBound:
    """At most ``completion_limit_s``: no schedule uses fewer than ``node_seconds_bound``;
    ``cheapest`` is the best schedule found within the limit (None when none was)."""

    completion_limit_s: float
    node_seconds_bound: float
    cheapest: Schedule | None


def epoch_work(profile: AppProfile) -> np.ndarray:
    """Progress each epoch takes (scale-invariant iterations, SPEC §2), shape (epochs,)."""
    ends = np.asarray(profile.epoch_ends, dtype=np.float64)
    return np.diff(np.concatenate([[0.0], ends]))


def _rows_at(x: np.ndarray, xs: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table`` (rows at the sorted ``xs``) interpolated linearly at each ``x``, clamped outside
    ``xs``, as :meth:`AppProfile.grad_stats` does per epoch; shape (len(x), table columns)."""
    if xs.size == 1:
        return np.repeat(table[:1], x.size, axis=0)
    xc = np.clip(x, xs[0], xs[-1])
    i = np.clip(np.searchsorted(xs, xc, side="right") - 1, 0, xs.size - 2)
    t = (xc - xs[i]) / (xs[i + 1] - xs[i])
    return (1.0 - t)[:, None] * table[i] + t[:, None] * table[i + 1]


def _run_rates(profile: AppProfile, nodes: np.ndarray, replicas: np.ndarray,
               local_step: Callable) -> np.ndarray:
    """Best true progress rate per epoch of each placement shape, shape (shapes, epochs).

    ``local_step(i, m)`` gives (step, sync) of shape ``i`` at local batches ``m`` (shape (51,)); each
    shape tries the SPEC §4 batch candidates for its replica count (what a Pollux job chooses from)
    and the initial batch on every GPU (what a job with a fixed batch per GPU runs, Or et al.'s and
    a static trial's), with the efficiency at each candidate's batch."""
    meta = profile.meta
    limits = meta.limits(accumulation=True)
    cand, ok = batch_candidates(replicas, limits)
    per_gpu = np.minimum(meta.init_batch_size * replicas, float(limits.max_batch))
    cand = np.concatenate([cand, per_gpu[:, None]], axis=1)
    total, local, accum, fits = accumulation_plan(cand, replicas[:, None], limits)
    out = np.zeros((nodes.size, meta.epochs))
    for i in np.flatnonzero(ok):
        step, sync = local_step(i, local[i])
        t_iter = step + accum[i] * (step - sync)
        good = fits[i] & np.isfinite(t_iter)
        if not good.any():
            continue
        batch = total[i][good]
        sqr = _rows_at(batch, profile.batch_sizes, profile.grad_sqr)        # (candidates, epochs)
        var = _rows_at(batch, profile.batch_sizes, profile.grad_var)
        out[i] = (gain(batch[:, None] / meta.init_batch_size, sqr, var) / t_iter[good][:, None]).max(axis=0)
    return out


def _shape_rates(profile: AppProfile, max_nodes: int, gpus_per_node: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes, GPUs, best rate per epoch) of every placement the simulator could give the job on at
    most ``max_nodes`` nodes: each (nodes, GPUs) shape at the profile's interpolation, and each
    measured placement at its measured step times. A spread placement is sometimes faster in the
    profiles than a packed one, so packed placements alone would not bound every schedule."""
    shapes = [(n, k) for n in range(1, max_nodes + 1) for k in range(n, n * gpus_per_node + 1)]
    nodes = np.array([n for n, _ in shapes], dtype=np.float64)
    replicas = np.array([k for _, k in shapes], dtype=np.float64)
    by_shape = _run_rates(profile, nodes, replicas,
                          lambda i, m: profile.step_times_nk(nodes[i], replicas[i], m))
    keys = [key for key in profile.measured_placements
            if len(placement_parts(key)) <= max_nodes and max(placement_parts(key)) <= gpus_per_node]
    if keys:
        key_nodes = np.array([placement_shape(key)[0] for key in keys], dtype=np.float64)
        key_replicas = np.array([placement_shape(key)[1] for key in keys], dtype=np.float64)
        measured = _run_rates(profile, key_nodes, key_replicas,
                              lambda i, m: tuple(np.array(v) for v in zip(
                                  *(profile.step_time(keys[i], float(x)) for x in m), strict=True)))
        nodes = np.concatenate([nodes, key_nodes])
        replicas = np.concatenate([replicas, key_replicas])
        by_shape = np.concatenate([by_shape, measured])
    return nodes, replicas, by_shape


def epoch_rates(profile: AppProfile, max_nodes: int, gpus_per_node: int) -> np.ndarray:
    """True best progress per second of the job on at most ``N`` nodes, in each epoch.

    Shape (epochs, max_nodes + 1); column 0 (no node) is 0. Every placement on at most ``N`` nodes is
    tried (a node may be left partly idle)."""
    nodes, _, by_shape = _shape_rates(profile, max_nodes, gpus_per_node)
    rates = np.zeros((profile.meta.epochs, max_nodes + 1))
    for n in range(1, max_nodes + 1):
        rates[:, n] = by_shape[nodes <= n].max(axis=0)
    return rates


def gpu_rates(profile: AppProfile, max_gpus: int, gpus_per_node: int) -> np.ndarray:
    """True best progress per second of the job on at most ``k`` GPUs of a cluster of ``max_gpus``
    (nodes of ``gpus_per_node``), in each epoch: shape (epochs, max_gpus + 1), column 0 is 0."""
    _, replicas, by_shape = _shape_rates(profile, -(-max_gpus // gpus_per_node), gpus_per_node)
    rates = np.zeros((profile.meta.epochs, max_gpus + 1))
    for k in range(1, max_gpus + 1):
        rates[:, k] = by_shape[replicas <= k].max(axis=0)
    return rates


def epoch_times(rates: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Seconds each epoch takes at each size 1.. of ``rates`` (shape (epochs, sizes)); infinite at a
    size the profile cannot run (rate 0)."""
    per_size = rates[:, 1:]
    runs = per_size > 0
    return np.where(runs, work[:, None] / np.where(runs, per_size, 1.0), np.inf)


def _switch_costs(nodes: np.ndarray, weight: float, restart_s: float, provision_s: float) -> np.ndarray:
    """Cost (node-seconds + weight·seconds) of moving from size P (rows) to size N (columns)."""
    grow = np.maximum(nodes[None, :] - nodes[:, None], 0)
    cost = (nodes[None, :] + weight) * restart_s + grow * provision_s
    np.fill_diagonal(cost, 0.0)
    return cost


def _evaluate(path: tuple[int, ...], rates: np.ndarray, work: np.ndarray, start_nodes: int,
              restart_s: float, provision_s: float) -> Schedule:
    """The completion and node-seconds of running ``path`` (nodes per epoch), by the bound's rules."""
    seconds = 0.0
    node_seconds = 0.0
    previous = start_nodes
    starts = []
    for e, n in enumerate(path):
        starts.append(seconds)
        if e == 0 or n != previous:
            seconds += restart_s
            node_seconds += n * restart_s + max(n - previous, 0) * provision_s
        run = work[e] / rates[e, n]
        seconds += run
        node_seconds += n * run
        previous = n
    return Schedule(tuple(int(n) for n in path), seconds, node_seconds, tuple(starts))


def cheapest_schedule(rates: np.ndarray, work: np.ndarray, weight: float, *, start_nodes: int = 1,
                      restart_s: float = 30.0, provision_s: float = 120.0) -> tuple[float, Schedule]:
    """``(D(weight), schedule)``: the schedule minimising node-seconds + ``weight``·completion, exactly
    (dynamic programming over epochs and sizes), starting from ``start_nodes`` nodes held."""
    epochs, width = rates.shape
    nodes = np.arange(1, width)
    run_time = epoch_times(rates, work)
    switch = _switch_costs(nodes, weight, restart_s, provision_s)
    first = switch.copy()
    np.fill_diagonal(first, (nodes + weight) * restart_s)          # the first start pays a restart
    value = np.full(nodes.size, np.inf)
    value[start_nodes - 1] = 0.0
    choices = np.zeros((epochs, nodes.size), dtype=np.int64)
    for e in range(epochs):
        moves = value[:, None] + (first if e == 0 else switch)
        choices[e] = np.argmin(moves, axis=0)
        value = moves[choices[e], np.arange(nodes.size)] + (nodes + weight) * run_time[e]
    last = int(np.argmin(value))
    path = [last]
    for e in range(epochs - 1, 0, -1):
        path.append(int(choices[e][path[-1]]))
    sizes = tuple(int(nodes[i]) for i in reversed(path))
    return float(value[last]), _evaluate(sizes, rates, work, start_nodes, restart_s, provision_s)


def bound_at(rates: np.ndarray, work: np.ndarray, completion_limit_s: float, *, start_nodes: int = 1,
             restart_s: float = 30.0, provision_s: float = 120.0,
             weights: np.ndarray = DEFAULT_WEIGHTS) -> ScalingBound:
    """The node-seconds no schedule finishing within ``completion_limit_s`` can go below (see the
    module docstring), and the cheapest schedule found that finishes within it."""
    bound = 0.0
    cheapest: Schedule | None = None
    for weight in weights:
        value, schedule = cheapest_schedule(rates, work, float(weight), start_nodes=start_nodes,
                                            restart_s=restart_s, provision_s=provision_s)
        bound = max(bound, value - float(weight) * completion_limit_s)
        if schedule.completion_s <= completion_limit_s and (
                cheapest is None or schedule.node_seconds < cheapest.node_seconds):
            cheapest = schedule
    return ScalingBound(completion_limit_s, bound, cheapest)
