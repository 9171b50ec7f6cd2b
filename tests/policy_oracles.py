"""Test-only helpers of the policy tests: reference solvers (oracles) — slow, plain versions the fast
paths are checked against — and random inputs. Nothing in ``src/`` uses them."""

from __future__ import annotations

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.policy.base import Cluster, JobView
from pollux.policy.pollux.fill import SINGLE, SPREAD, FillState, spread_order
from pollux.policy.pollux.problem import PolluxProblem


def option_table(prob: PolluxProblem, a: np.ndarray, j: int, st: FillState):
    """Per k = 1 … kmax more GPUs for job j: (nodes after, mode, speedup after, feasible), keeping
    the placement (on its own nodes, on one node, spread) with the best speedup (ties in that
    order), exactly as :func:`place_growth` will build it. The spread is only worked out where the
    job's table says more nodes could beat the other two. None if the job cannot grow."""
    row = a[j]
    mine = np.flatnonzero(row)
    r = int(row[mine].sum())
    kmax = min(int(prob.max_replicas[j]) - r, st.total_free)
    if kmax <= 0:
        return None
    lo, hi = r + 1, r + kmax + 1            # replica counts after growth (≤ max_replicas ≤ rt_max)
    tab = prob.tables.table[j]
    nn = mine.size
    # Own nodes: a prefix of k (as many as their free GPUs); one node: a prefix too.
    val = np.full(kmax, -1.0)
    n_new = np.full(kmax, nn, dtype=np.int64)
    mode = np.zeros(kmax, dtype=np.int64)   # IN_PLACE
    if nn:
        own_free = int(st.free[mine].sum())
        host_max = max(st.max_free, int((st.free[mine] + row[mine]).max()))
        kin = min(own_free, kmax)
        if kin > 0:
            val[:kin] = tab[min(nn, prob.tables.nt_max), lo:lo + kin]
    else:
        host_max = st.max_free
    ks = min(max(host_max - r, 0), kmax)
    if ks > 0:
        v_si = tab[1, lo:lo + ks]
        use = v_si > val[:ks]
        val[:ks][use] = v_si[use]
        mode[:ks][use] = SINGLE
        n_new[:ks][use] = 1
    better = prob.tables.best_any_nodes[j, lo:hi] > val
    if better.any():
        _, avail, keep = spread_order(prob, row, mine, st, j)
        cum = np.cumsum(avail)
        need = np.arange(lo, hi) - (r if keep else 0)
        ok = need <= (cum[-1] if cum.size else 0)
        m = np.minimum(np.searchsorted(cum, need) + 1, max(cum.size, 1))
        if keep:
            n_sp = np.maximum(m, nn)
        else:
            n_sp = np.cumsum(avail > 0)[m - 1] if cum.size else m
        ok &= (n_sp <= prob.max_nodes) & better
        v_sp = tab[np.minimum(n_sp, prob.tables.nt_max), np.arange(lo, hi)]
        use = ok & (v_sp > val)
        val[use] = v_sp[use]
        mode[use] = SPREAD
        n_new[use] = n_sp[use]
    feasible = (val >= 0) & (n_new >= 1) & (n_new <= prob.max_nodes)
    if prob.min_replicas[j] > lo:
        feasible[: prob.min_replicas[j] - lo] = False
    return n_new, mode, val, feasible


def growth_options(prob: PolluxProblem, a: np.ndarray, j: int,
                   st: FillState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every feasible growth of job j: (k more GPUs, nodes after, placement mode, speedup after)."""
    opt = option_table(prob, a, j, st)
    if opt is None:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e, np.zeros(0)
    n_new, mode, val, ok = opt
    k = np.arange(1, ok.size + 1)
    return k[ok], n_new[ok], mode[ok], val[ok]


def estimate_oracle(prob: PolluxProblem, a: np.ndarray, free: np.ndarray, owner: np.ndarray,
                    u_now: np.ndarray) -> np.ndarray:
    """:func:`pollux.policy.pollux.fill.estimates` job by job and k by k, as its docstring reads:
    the best gain per GPU over k = 1 … kmax of the best of growing in place (its own nodes' free
    GPUs), onto one node (the roomiest node, its own counting its GPUs) or spread over the nodes
    without a distributed job, most free first."""
    room_all = [int(prob.max_replicas[j] - a[j].sum()) if prob.movable[j] else 0
                for j in range(prob.num_jobs)]
    kmax = min(max(room_all, default=0), int(free.sum()))
    if kmax <= 0:
        return np.zeros(prob.num_jobs)
    elig = sorted((int(free[n]) for n in range(prob.num_nodes) if not prob.interference or owner[n] < 0),
                  reverse=True)
    cum = np.cumsum(elig)
    table, nt, rt = prob.tables.table, prob.tables.nt_max, prob.tables.rt_max
    out = np.full(prob.num_jobs, -np.inf)
    for j in range(prob.num_jobs):
        mine = [n for n in range(prob.num_nodes) if a[j, n] > 0]
        r = int(a[j].sum())
        own_free = sum(int(free[n]) for n in mine)
        host = max([int(free.max())] + [int(free[n] + a[j, n]) for n in mine])
        for k in range(1, kmax + 1):
            rk = r + k
            if k > room_all[j] or rk < prob.min_replicas[j]:
                continue
            rc = min(rk, rt)
            vals = [-1.0]
            if r > 0 and k <= own_free:
                vals.append(table[j, min(len(mine), nt), rc])
            if rk <= host:
                vals.append(table[j, min(1, nt), rc])
            extra = max(k - own_free if r > 0 else rk, 1)
            if cum.size and extra <= cum[-1]:
                spread = (len(mine) if r > 0 else 0) + int(np.argmax(cum >= extra)) + 1
                if spread <= prob.max_nodes:
                    vals.append(table[j, min(spread, nt), rc])
            if max(vals) < 0:
                continue
            x = max(vals) * prob.pen[j] + 1e-3
            u = np.log(x) if prob.p == 0 else (-(x**prob.p) if prob.p < 0 else x**prob.p)
            out[j] = max(out[j], (u - u_now[j]) / k)
    return out


def random_model(rng: np.random.Generator) -> tuple[GoodputModel, BatchLimits]:
    def lu(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    params = ThroughputParams(
        alpha_grad=lu(1e-3, 0.3), beta_grad=lu(1e-6, 5e-2), alpha_local=lu(1e-3, 0.3),
        beta_local=lu(1e-5, 2e-2), alpha_node=lu(1e-2, 1.5), beta_node=lu(1e-4, 2e-2),
        gamma=float(rng.uniform(1.0, 3.0)),
    )
    m0 = float(rng.choice([8, 12, 20, 128, 200, 256]))
    limits = BatchLimits(m0, max_batch_size=32 * m0, min_local_bsz=max(1.0, m0 / 4),
                         max_local_bsz=2 * m0, accumulation=True)
    return GoodputModel(params, GradStats(lu(1e-4, 10.0), lu(1e-2, 50.0)), m0), limits


def random_mixed_round(rng: np.random.Generator, cluster: Cluster,
                       count: int) -> tuple[list[JobView], dict[str, dict[str, int]]]:
    """``count`` jobs ``j0…`` with random models, ages, restarts and service; every other one runs on
    1–3 GPUs of the roomiest node (where some are left). Returns the jobs and that allocation."""
    free = cluster.capacity().copy()
    jobs, alloc = [], {}
    for i in range(count):
        model, limits = random_model(rng)
        row: dict[str, int] = {}
        if i % 2 == 0:
            n = int(np.argmax(free))
            take = int(min(free[n], rng.integers(1, 4)))
            if take:
                row = {cluster.nodes[n]: take}
                free[n] -= take
                alloc[f"j{i}"] = row
        jobs.append(JobView(id=f"j{i}", submit_time=0.0, age_s=float(rng.uniform(30, 3000)),
                            restarts=int(rng.integers(0, 3)), attained_service=float(rng.uniform(0, 1e4)),
                            allocation=row, model=model, limits=limits,
                            max_replicas_seen=int(rng.choice([1, 2, 4, 8]))))
    return jobs, alloc
