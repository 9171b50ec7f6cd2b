"""The greedy fill of the Pollux search (SPEC §5, step 1 of :mod:`pollux.policy.pollux`).

:func:`greedy` grows one feasible matrix by the best objective gain per GPU until nothing gains (a lazy
greedy: jobs sit in a priority queue keyed by their best gain per GPU over jumps of k = 1, 2, … GPUs,
each placed the best of three ways — grow on its own nodes, move onto one node, or spread over nodes
without another distributed job). :class:`.fill_state.FillState` holds the free GPUs and
distributed-job owners of the nodes while one matrix fills. Every function reads the problem and
never changes it (apart from the tables' memo of rows as lists, and :func:`greedy`'s memo of its
fills, ``prob.fills``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math

import numpy as np

from pollux.policy.pollux.fill_state import FillState, row_lists
from pollux.policy.pollux.problem import SPEEDUP_EPS, PolluxProblem, _utility, scalar_utility

#: Placement modes of the greedy fill: grow on its own nodes, move onto one node, spread over nodes.
IN_PLACE, SINGLE, SPREAD = 0, 1, 2


def place_growth(prob: PolluxProblem, a: np.ndarray, j: int, k: int, mode: int,
                 st: FillState) -> np.ndarray | None:
    """New row of job j with k more GPUs, or None, by placement ``mode``: IN_PLACE grows on its
    own nodes (most free first); SINGLE moves it onto one node (the tightest fit, or with
    ``st.loose`` the roomiest; its own nodes preferred on ties); SPREAD see :func:`spread_order`.
    """
    row = a[j]
    mine = np.flatnonzero(row)
    r = int(row[mine].sum())
    total = r + k
    free = st.free
    if mode == IN_PLACE:
        if r == 0 or int(free[mine].sum()) < k:
            return None
        new = row.copy()
        need = k
        for n in mine[np.argsort(-free[mine], kind="stable")]:
            t = min(need, int(free[n]))
            new[n] += t
            need -= t
            if need == 0:
                break
        return new
    if mode == SINGLE:
        node = st.single_node(total, mine, row, st.loose)
        if node < 0:
            return None
        new = np.zeros_like(row)
        new[node] = total
        return new
    order, avail, keep = spread_order(prob, row, mine, st, j)
    base = row.copy() if keep else np.zeros_like(row)
    need = total - (r if keep else 0)
    cum = np.cumsum(avail)
    if cum.size == 0 or cum[-1] < need:
        return None
    m = int(np.searchsorted(cum, need)) + 1
    add = avail[:m].copy()
    add[-1] -= int(cum[m - 1]) - need
    base[order[:m]] += add
    if np.count_nonzero(base) > prob.max_nodes:
        return None
    return base


def spread_order(prob: PolluxProblem, row: np.ndarray, mine: np.ndarray, st: FillState,
                  j: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Nodes a job spreads over, in fill order, what each offers it, and whether it keeps its GPUs.

    The job keeps its GPUs when none of its nodes hosts another distributed job; then its own
    nodes come first (their free GPUs), then the others by most free GPUs among nodes without a
    distributed job. Otherwise it moves: the same order, its own nodes offering ``free + its
    GPUs`` where no other distributed job sits. Only the first ``max_nodes`` other nodes matter.
    """
    free, owner = st.free, st.owner
    if prob.interference:
        elig_mine = (owner[mine] < 0) | (owner[mine] == j)
    else:
        elig_mine = np.ones(mine.size, dtype=bool)
    keep = mine.size > 0 and bool(elig_mine.all())
    offer = free[mine] if keep else free[mine] + row[mine]
    offer *= elig_mine
    sort = np.argsort(-offer, kind="stable")
    mine, offer = mine[sort], offer[sort]
    cand = np.array(st.spread_prefix(prob.max_nodes + mine.size), dtype=np.int64)
    if mine.size:
        cand = cand[row[cand] == 0]
    cand = cand[: prob.max_nodes]
    return np.concatenate([mine, cand]), np.concatenate([offer, free[cand]]), keep


def best_option(prob: PolluxProblem, a: np.ndarray, j: int, st: FillState,
                 u_now: float) -> tuple[float, int, int]:
    """Best objective gain per GPU of growing job j: (gain, k more GPUs, mode); k = 0 if none.

    The same choice as :func:`option_table` (tested to agree), as a plain loop over k: the
    greedy calls this thousands of times on short rows, where numpy's per-call cost dominates.
    """
    mine_l, rm_l = st.row_lists(j, a[j])
    nn = len(mine_l)
    if nn:
        free_l = st.free_list()
        fm_l = [free_l[n] for n in mine_l]
        r, own_free = sum(rm_l), sum(fm_l)
        host_own = max(f + x for f, x in zip(fm_l, rm_l, strict=True))
    else:
        r = own_free = host_own = 0
    kmax = min(int(prob.max_replicas[j]) - r, st.total_free)
    if kmax <= 0:
        return 0.0, 0, 0
    rows, best_any = prob.tables.as_lists(j)
    host_max = max(st.max_free, host_own)
    t_in = rows[min(nn, prob.tables.nt_max)]
    t_one = rows[1] if prob.tables.nt_max >= 1 else None
    pen, p, eps = float(prob.pen[j]), prob.p, SPEEDUP_EPS
    min_r, max_nodes, nt_max = int(prob.min_replicas[j]), prob.max_nodes, prob.tables.nt_max
    spread = None
    best_g, best_k, best_mode = -math.inf, 0, 0
    # No k can gain more than reaching the job's best speedup anywhere: stop once k is so large
    # that even that, spread over k GPUs, cannot beat the best found.
    top = prob.top_utility()[j] - u_now
    for k in range(max(1, min_r - r), kmax + 1):
        if top <= best_g * k:
            break
        tot = r + k
        v, mode = -1.0, IN_PLACE
        if nn and k <= own_free:
            v = t_in[tot]
        if t_one is not None and tot <= host_max and t_one[tot] > v:
            v, mode = t_one[tot], SINGLE
        if best_any[tot] > v:
            if spread is None:
                spread = _spread_sums(prob, mine_l, rm_l, st, j)
            cum_l, pos_l, keep = spread
            need = tot - (r if keep else 0)
            if cum_l and need <= cum_l[-1]:
                m = bisect.bisect_left(cum_l, need) + 1
                n_sp = max(m, nn) if keep else pos_l[m - 1]
                if n_sp <= max_nodes:
                    vs = rows[min(n_sp, nt_max)][tot]
                    if vs > v:
                        v, mode = vs, SPREAD
        if v < 0.0:
            continue
        x = v * pen + eps
        if p == -1.0:
            u = -1.0 / x
        elif p == 0.0:
            u = math.log(x)
        elif p < 0.0:
            u = -(x**p)
        else:
            u = x**p
        g = (u - u_now) / k
        if g > best_g:
            best_g, best_k, best_mode = g, k, mode
    if best_k == 0:
        return 0.0, 0, 0
    return best_g, best_k, best_mode


def _spread_sums(prob: PolluxProblem, mine: list[int], rm: list[int], st: FillState,
                 j: int) -> tuple[list[int], list[int], bool]:
    """What :func:`spread_order` offers job j, summed: the running total of GPUs over the nodes in
    fill order, the running count of nodes that offer any, and whether the job keeps its GPUs.

    The same order and offers as :func:`spread_order` (ties broken alike; tested to agree), on
    Python lists: :func:`best_option` needs it for most jobs it weighs, on rows of a few nodes.
    A job without GPUs is offered what every such job is offered: that answer is kept until the
    free GPUs change.
    """
    if not mine:
        return st.memo("spread_sums", lambda: _spread_sums_of(prob, st, [], [], False))
    free = st.free_list()
    if prob.interference:
        owner = st.owner_list()
        elig = [owner[n] < 0 or owner[n] == j for n in mine]
    else:
        elig = [True] * len(mine)
    keep = bool(mine) and all(elig)
    offer = [(free[n] if keep else free[n] + x) if e else 0
             for n, x, e in zip(mine, rm, elig, strict=True)]
    return _spread_sums_of(prob, st, mine, offer, keep)


def _spread_sums_of(prob: PolluxProblem, st: FillState, mine: list[int], offer: list[int],
                    keep: bool) -> tuple[list[int], list[int], bool]:
    """:func:`_spread_sums` given what the job's own nodes offer."""
    free = st.free_list()
    # Most offered first; sorted() is stable, so ties keep the node order (as argsort's "stable").
    avail = sorted(offer, key=lambda v: -v)
    others = st.spread_prefix(prob.max_nodes + len(mine))
    if mine:
        own = set(mine)
        others = [n for n in others if n not in own]
    avail += [free[n] for n in others[: prob.max_nodes]]
    return (list(itertools.accumulate(avail)),
            list(itertools.accumulate(1 if v > 0 else 0 for v in avail)), keep)


def estimates(prob: PolluxProblem, a: np.ndarray, free: np.ndarray, owner: np.ndarray,
              u_now: np.ndarray) -> np.ndarray:
    """Approximate best gain per GPU of every job's growth, vectorised (the greedy's first queue).

    Like :func:`options` but with the spread estimated from the cluster-wide free GPUs on nodes
    without a distributed job; the greedy re-evaluates each job exactly before using it.
    """
    # Per job sums over the cells it holds, read from those cells alone: at 4,096 GPUs a matrix has
    # a million cells and a few thousand of them hold GPUs. (The flat indices split by divmod are
    # np.nonzero's, several times faster than its two-dimensional form.)
    jobs_i, nodes_i = np.divmod(np.flatnonzero(a), a.shape[1])
    held = a[jobs_i, nodes_i]
    r = np.bincount(jobs_i, weights=held, minlength=prob.num_jobs).astype(np.int64)
    room = np.where(prob.movable, prob.max_replicas - r, 0)
    kmax = int(min(room.max(initial=0), free.sum()))
    if kmax <= 0:
        return np.zeros(prob.num_jobs)
    nn = np.bincount(jobs_i, minlength=prob.num_jobs)
    own_free = np.bincount(jobs_i, weights=free[nodes_i], minlength=prob.num_jobs)
    host_own = np.zeros(prob.num_jobs, dtype=np.int64)
    np.maximum.at(host_own, jobs_i, free[nodes_i] + held)
    host_max = np.maximum(free.max(), host_own)
    elig_free = np.sort(free[owner < 0])[::-1] if prob.interference else np.sort(free)[::-1]
    cum = np.cumsum(elig_free)
    cum_total = int(cum[-1]) if cum.size else 0
    k = np.arange(1, kmax + 1)[None, :]
    rk = r[:, None] + k
    rc = np.minimum(rk, prob.tables.rt_max)
    rows = np.arange(prob.num_jobs)[:, None]
    inplace = (r[:, None] > 0) & (k <= own_free[:, None])
    single = rk <= host_max[:, None]
    extra = np.maximum(np.where(r[:, None] > 0, k - own_free[:, None], rk), 1)
    n_sp = np.where(r[:, None] > 0, nn[:, None], 0) + np.searchsorted(cum, extra) + 1
    spread = (extra <= cum_total) & (n_sp <= prob.max_nodes)
    val = np.maximum.reduce([
        np.where(inplace, prob.lookup(rows, nn[:, None], rc), -1.0),
        np.where(single, prob.lookup(rows, 1, rc), -1.0),
        np.where(spread, prob.lookup(rows, n_sp, rc), -1.0),
    ])
    ok = (k <= room[:, None]) & (val >= 0) & (rk >= prob.min_replicas[:, None])
    gain = (_utility(np.maximum(val, 0.0) * prob.pen[:, None], prob.p) - u_now[:, None]) / k
    return np.where(ok, gain, -np.inf).max(axis=1)


#: Largest matrix (jobs × nodes entries) whose fills are remembered, and most fills remembered per
#: problem: a round of a 4,096-GPU cluster with 1,000 jobs has 8 MB matrices and repeats few fills.
MEMO_MAX_ENTRIES = 1 << 16
MEMO_MAX_FILLS = 64


def greedy(prob: PolluxProblem, a: np.ndarray, loose: bool = False) -> np.ndarray:
    """Grow a feasible matrix by best objective gain per GPU until nothing gains (lazy greedy).

    Each movable job's best jump (k = 1… more GPUs, placed by :func:`place_growth`, gain per GPU of its
    objective term u(SPEEDUP) — FITNESS_p is monotone in Σ u) sits in a priority queue; the top
    one is re-evaluated against the current free capacity and applied if it still beats the
    next one, else re-queued with its fresh value. Jumps let a job pay its re-allocation
    penalty once for several GPUs.

    The fill depends only on the problem, the matrix and ``loose``, so a fill asked for again in the
    same round is answered from ``prob.fills``: the starts and the local search's refills often
    coincide (about 3 fills in 10 on workload-6). A repeat gets a copy of the fill kept, so a caller
    that changes its matrix cannot change a later answer.
    """
    a = np.array(a, dtype=np.int64, copy=True)
    if a.size > MEMO_MAX_ENTRIES:
        return _fill(prob, a, loose)
    key = (a.tobytes(), bool(loose))
    done = prob.fills.get(key)
    if done is None:
        done = _fill(prob, a, loose)
        if len(prob.fills) < MEMO_MAX_FILLS:
            prob.fills[key] = done
    return done.copy()


def _fill(prob: PolluxProblem, a: np.ndarray, loose: bool) -> np.ndarray:
    """:func:`greedy` itself, on ``a`` (a fresh int64 copy, grown in place and returned)."""
    if prob.num_jobs == 0 or prob.total_gpus == 0:
        return a
    p = prob.p
    owner = prob.owners(a) if prob.interference else np.full(prob.num_nodes, -1)
    st = FillState(prob.cap - a.sum(axis=0), owner, prob.interference, loose)
    if st.total_free <= 0:
        return a
    u_arr = _utility(prob.matrix_speedups(a), p)
    est = estimates(prob, a, st.free, owner, u_arr)
    u_now: list[float] = u_arr.tolist()
    # Entries: (-gain per GPU, job, k, state version it was computed at; -1 = an estimate).
    gains = est.tolist()
    heap = [(-gains[j], j, 0, 0, -1) for j in np.flatnonzero(est > 0.0).tolist()]
    heapq.heapify(heap)
    while heap and st.total_free > 0:
        _, j, k, mode, version = heapq.heappop(heap)
        if version != st.version:
            g, k, mode = best_option(prob, a, j, st, u_now[j])
            if k == 0 or g <= 0.0:
                continue
            if heap and g < -heap[0][0] * (1.0 - 1e-12):
                heapq.heappush(heap, (-g, j, k, mode, st.version))
                continue
        new = place_growth(prob, a, j, k, mode, st)
        if new is None:
            continue
        lists = row_lists(new)
        s = prob.speedup_at(j, len(lists[0]), sum(lists[1]), bool((new != prob.cur[j]).any()))
        u_new = scalar_utility(s, p)
        if u_new <= u_now[j]:
            continue
        st.update(j, a[j], new, lists)
        a[j] = new
        u_now[j] = u_new
        g, k, mode = best_option(prob, a, j, st, u_new)
        if k and g > 0.0:
            heapq.heappush(heap, (-g, j, k, mode, st.version))
    return a
