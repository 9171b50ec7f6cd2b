"""Searches of the Pollux problem (SPEC §5): greedy fill, destroy-and-refill local search and
the genetic operators, as methods on top of :class:`~pollux.policy.pollux_problem.PolluxProblemCore`.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from pollux.policy.pollux_problem import (
    IN_PLACE,
    RESET_PROB,
    SINGLE,
    SPEEDUP_EPS,
    SPREAD,
    ZERO_ELEM_PROB,
    ZERO_ROW_PROB,
    PolluxProblemCore,
    _FillState,
    _utility,
)


class PolluxSearch(PolluxProblemCore):
    """Greedy fill, local search and genetic search of :class:`pollux.policy.pollux.PolluxProblem`."""

    # ----------------------------------------------------------------------------------------
    # Greedy marginal-gain fill of one matrix
    # ----------------------------------------------------------------------------------------

    def _owners(self, a: np.ndarray) -> np.ndarray:
        """Per node, the distributed job on it (-1 when none); the first one wins on a conflict."""
        owner = np.full(self.num_nodes, -1, dtype=np.int64)
        dist = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
        for j in dist[::-1]:
            owner[a[j] > 0] = j
        return owner

    def _place(self, a: np.ndarray, j: int, k: int, mode: int, st: _FillState) -> np.ndarray | None:
        """New row of job j with k more GPUs, or None, by placement ``mode``: IN_PLACE grows on its
        own nodes (most free first); SINGLE moves it onto one node (the tightest fit, or with
        ``st.loose`` the roomiest; its own nodes preferred on ties); SPREAD see :meth:`_spread_order`.
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
        order, avail, keep = self._spread_order(row, mine, st, j)
        base = row.copy() if keep else np.zeros_like(row)
        need = total - (r if keep else 0)
        cum = np.cumsum(avail)
        if cum.size == 0 or cum[-1] < need:
            return None
        m = int(np.searchsorted(cum, need)) + 1
        add = avail[:m].copy()
        add[-1] -= int(cum[m - 1]) - need
        base[order[:m]] += add
        if np.count_nonzero(base) > self.max_nodes:
            return None
        return base

    def _spread_order(self, row: np.ndarray, mine: np.ndarray, st: _FillState,
                      j: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Nodes a job spreads over, in fill order, what each offers it, and whether it keeps its GPUs.

        The job keeps its GPUs when none of its nodes hosts another distributed job; then its own
        nodes come first (their free GPUs), then the others by most free GPUs among nodes without a
        distributed job. Otherwise it moves: the same order, its own nodes offering ``free + its
        GPUs`` where no other distributed job sits. Only the first ``max_nodes`` other nodes matter.
        """
        free, owner = st.free, st.owner
        if self.interference:
            elig_mine = (owner[mine] < 0) | (owner[mine] == j)
        else:
            elig_mine = np.ones(mine.size, dtype=bool)
        keep = mine.size > 0 and bool(elig_mine.all())
        offer = free[mine] if keep else free[mine] + row[mine]
        offer *= elig_mine
        sort = np.argsort(-offer, kind="stable")
        mine, offer = mine[sort], offer[sort]
        glob = st.spread_order()
        cand = glob[: self.max_nodes + mine.size]
        if mine.size:
            cand = cand[row[cand] == 0]
        cand = cand[: self.max_nodes]
        return np.concatenate([mine, cand]), np.concatenate([offer, free[cand]]), keep

    def _option_table(self, a: np.ndarray, j: int, st: _FillState):
        """Per k = 1 … kmax more GPUs for job j: (nodes after, mode, speedup after, feasible), keeping
        the placement (on its own nodes, on one node, spread) with the best speedup (ties in that
        order), exactly as :meth:`_place` will build it. The spread is only worked out where the
        job's table says more nodes could beat the other two. None if the job cannot grow."""
        row = a[j]
        mine = np.flatnonzero(row)
        r = int(row[mine].sum())
        kmax = min(int(self.max_replicas[j]) - r, st.total_free)
        if kmax <= 0:
            return None
        lo, hi = r + 1, r + kmax + 1            # replica counts after growth (≤ max_replicas ≤ rt_max)
        tab = self.table[j]
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
                val[:kin] = tab[min(nn, self.nt_max), lo:lo + kin]
        else:
            host_max = st.max_free
        ks = min(max(host_max - r, 0), kmax)
        if ks > 0:
            v_si = tab[1, lo:lo + ks]
            use = v_si > val[:ks]
            val[:ks][use] = v_si[use]
            mode[:ks][use] = SINGLE
            n_new[:ks][use] = 1
        better = self.best_any_nodes[j, lo:hi] > val
        if better.any():
            _, avail, keep = self._spread_order(row, mine, st, j)
            cum = np.cumsum(avail)
            need = np.arange(lo, hi) - (r if keep else 0)
            ok = need <= (cum[-1] if cum.size else 0)
            m = np.minimum(np.searchsorted(cum, need) + 1, max(cum.size, 1))
            if keep:
                n_sp = np.maximum(m, nn)
            else:
                n_sp = np.cumsum(avail > 0)[m - 1] if cum.size else m
            ok &= (n_sp <= self.max_nodes) & better
            v_sp = tab[np.minimum(n_sp, self.nt_max), np.arange(lo, hi)]
            use = ok & (v_sp > val)
            val[use] = v_sp[use]
            mode[use] = SPREAD
            n_new[use] = n_sp[use]
        feasible = (val >= 0) & (n_new >= 1) & (n_new <= self.max_nodes)
        if self.min_replicas[j] > lo:
            feasible[: self.min_replicas[j] - lo] = False
        return n_new, mode, val, feasible

    def _options(self, a: np.ndarray, j: int,
                 st: _FillState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every feasible growth of job j: (k more GPUs, nodes after, placement mode, speedup after)."""
        opt = self._option_table(a, j, st)
        if opt is None:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e, np.zeros(0)
        n_new, mode, val, ok = opt
        k = np.arange(1, ok.size + 1)
        return k[ok], n_new[ok], mode[ok], val[ok]

    def _best_option(self, a: np.ndarray, j: int, st: _FillState,
                     u_now: float) -> tuple[float, int, int]:
        """Best objective gain per GPU of growing job j: (gain, k more GPUs, mode); k = 0 if none.

        The same choice as :meth:`_option_table` (tested to agree), as a plain loop over k: the
        greedy calls this thousands of times on short rows, where numpy's per-call cost dominates.
        """
        row = a[j]
        mine = np.flatnonzero(row)
        nn = int(mine.size)
        if nn:
            rm, fm = row[mine], st.free[mine]
            r, own_free, host_own = int(rm.sum()), int(fm.sum()), int((fm + rm).max())
        else:
            r = own_free = host_own = 0
        kmax = min(int(self.max_replicas[j]) - r, st.total_free)
        if kmax <= 0:
            return 0.0, 0, 0
        rows, best_any = self._lists(j)
        host_max = max(st.max_free, host_own)
        t_in = rows[min(nn, self.nt_max)]
        t_one = rows[1] if self.nt_max >= 1 else None
        pen, p, eps = float(self.pen[j]), self.p, SPEEDUP_EPS
        min_r, max_nodes, nt_max = int(self.min_replicas[j]), self.max_nodes, self.nt_max
        spread = None
        best_g, best_k, best_mode = -math.inf, 0, 0
        # No k can gain more than reaching the job's best speedup anywhere: stop once k is so large
        # that even that, spread over k GPUs, cannot beat the best found.
        top = float(_utility(np.asarray(max(best_any) * pen), p)) - u_now
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
                    _, avail, keep = self._spread_order(row, mine, st, j)
                    cum = np.cumsum(avail)
                    spread = (cum.tolist(), np.cumsum(avail > 0).tolist(), keep)
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

    def _lists(self, j: int) -> tuple[list[list[float]], list[float]]:
        """Job j's speedup table and its best-over-nodes row as Python lists (cached)."""
        got = self._list_cache.get(j)
        if got is None:
            got = (self.table[j].tolist(), self.best_any_nodes[j].tolist())
            self._list_cache[j] = got
        return got

    def _estimates(self, a: np.ndarray, free: np.ndarray, owner: np.ndarray, u_now: np.ndarray) -> np.ndarray:
        """Approximate best gain per GPU of every job's growth, vectorised (the greedy's first queue).

        Like :meth:`_options` but with the spread estimated from the cluster-wide free GPUs on nodes
        without a distributed job; the greedy re-evaluates each job exactly before using it.
        """
        r = a.sum(axis=1)
        room = np.where(self.movable, self.max_replicas - r, 0)
        kmax = int(min(room.max(initial=0), free.sum()))
        if kmax <= 0:
            return np.zeros(self.num_jobs)
        nn = np.count_nonzero(a, axis=1)
        own = a > 0
        own_free = np.einsum("jn,n->j", own.astype(np.float32), free.astype(np.float32))
        host_max = np.maximum(free.max(), np.where(own, free + a, 0).max(axis=1))
        elig_free = np.sort(free[owner < 0])[::-1] if self.interference else np.sort(free)[::-1]
        cum = np.cumsum(elig_free)
        cum_total = int(cum[-1]) if cum.size else 0
        k = np.arange(1, kmax + 1)[None, :]
        rk = r[:, None] + k
        rc = np.minimum(rk, self.rt_max)
        rows = np.arange(self.num_jobs)[:, None]
        inplace = (r[:, None] > 0) & (k <= own_free[:, None])
        single = rk <= host_max[:, None]
        extra = np.maximum(np.where(r[:, None] > 0, k - own_free[:, None], rk), 1)
        n_sp = np.where(r[:, None] > 0, nn[:, None], 0) + np.searchsorted(cum, extra) + 1
        spread = (extra <= cum_total) & (n_sp <= self.max_nodes)
        val = np.maximum.reduce([
            np.where(inplace, self.table[rows, np.minimum(nn, self.nt_max)[:, None], rc], -1.0),
            np.where(single, self.table[rows, min(1, self.nt_max), rc], -1.0),
            np.where(spread, self.table[rows, np.minimum(n_sp, self.nt_max), rc], -1.0),
        ])
        ok = (k <= room[:, None]) & (val >= 0) & (rk >= self.min_replicas[:, None])
        gain = (_utility(np.maximum(val, 0.0) * self.pen[:, None], self.p) - u_now[:, None]) / k
        return np.where(ok, gain, -np.inf).max(axis=1)

    def greedy(self, a: np.ndarray, loose: bool = False) -> np.ndarray:
        """Grow a feasible matrix by best objective gain per GPU until nothing gains (lazy greedy).

        Each movable job's best jump (k = 1… more GPUs, placed by :meth:`_place`, gain per GPU of its
        objective term u(SPEEDUP) — FITNESS_p is monotone in Σ u) sits in a priority queue; the top
        one is re-evaluated against the current free capacity and applied if it still beats the
        next one, else re-queued with its fresh value. Jumps let a job pay its re-allocation
        penalty once for several GPUs.
        """
        a = np.array(a, dtype=np.int64, copy=True)
        if self.num_jobs == 0 or self.total_gpus == 0:
            return a
        p = self.p
        owner = self._owners(a) if self.interference else np.full(self.num_nodes, -1)
        st = _FillState(self.cap - a.sum(axis=0), owner, self.interference, loose)
        if st.total_free <= 0:
            return a
        u_now = _utility(self.matrix_speedups(a), p)
        est = self._estimates(a, st.free, owner, u_now)
        # Entries: (-gain per GPU, job, k, state version it was computed at; -1 = an estimate).
        heap = [(-float(est[j]), int(j), 0, 0, -1) for j in np.flatnonzero(est > 0.0)]
        heapq.heapify(heap)
        while heap and st.total_free > 0:
            _, j, k, mode, version = heapq.heappop(heap)
            if version != st.version:
                g, k, mode = self._best_option(a, j, st, float(u_now[j]))
                if k == 0 or g <= 0.0:
                    continue
                if heap and g < -heap[0][0] * (1.0 - 1e-12):
                    heapq.heappush(heap, (-g, j, k, mode, st.version))
                    continue
            new = self._place(a, j, k, mode, st)
            if new is None:
                continue
            nr, nnew = int(new.sum()), int(np.count_nonzero(new))
            s = self.table[j, min(nnew, self.nt_max), min(nr, self.rt_max)]
            if not np.array_equal(new, self.cur[j]):
                s *= self.pen[j]
            u_new = float(_utility(s, p))
            if u_new <= u_now[j]:
                continue
            st.update(j, a[j], new)
            a[j] = new
            u_now[j] = u_new
            g, k, mode = self._best_option(a, j, st, u_new)
            if k and g > 0.0:
                heapq.heappush(heap, (-g, j, k, mode, st.version))
        return a

    def repair_one(self, matrix: np.ndarray) -> np.ndarray:
        """Feasible int64 copy of one ``(jobs, nodes)`` matrix."""
        return self.unstack(self.repair(self.stack([matrix])), 0)

    def _shrink_losses(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every job: the node it would give one GPU back from (its largest share), the row
        after that, and the objective loss u(now) − u(after) (inf for jobs that cannot give)."""
        node = np.argmax(a, axis=1)
        after = a.copy()
        rows = np.arange(self.num_jobs)
        after[rows, node] -= 1
        r = after.sum(axis=1)
        after[(r < self.min_replicas) | (r <= 0)] = 0
        loss = _utility(self.matrix_speedups(a), self.p) - _utility(self.matrix_speedups(after), self.p)
        loss = np.where(self.movable & (a.sum(axis=1) > 0), loss, np.inf)
        return node, after, loss

    def _insert(self, a: np.ndarray, j: int, row: np.ndarray) -> np.ndarray:
        """Give job j exactly ``row`` (when within its caps), evicting what stands in the way: other
        distributed jobs on its nodes if it is distributed, then GPUs of the lowest-priority
        movable jobs on nodes over capacity. The result is feasible if ``a`` was."""
        r, nodes = int(row.sum()), np.flatnonzero(row)
        if r == 0 or r > self.max_replicas[j] or r < self.min_replicas[j] or nodes.size > self.max_nodes:
            return a
        a = a.copy()
        a[j] = row
        if self.interference:
            others = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
            others = others[others != j]
            if nodes.size > 1:
                clash = others[(a[np.ix_(others, nodes)] > 0).any(axis=1)]
            else:
                clash = others[:0]
            if (self.pinned[clash]).any():
                return self._undo(a, j)
            a[np.ix_(clash, nodes)] = 0
        over = np.flatnonzero(a.sum(axis=0) > self.cap)
        for n in over:
            excess = int(a[:, n].sum() - self.cap[n])
            for i in np.flatnonzero(a[:, n])[::-1]:
                if i == j or self.pinned[i]:
                    continue
                t = min(excess, int(a[i, n]))
                a[i, n] -= t
                excess -= t
                if excess == 0:
                    break
            if excess > 0:
                return self._undo(a, j)
        low = (a.sum(axis=1) < self.min_replicas) & self.movable
        a[low] = 0
        return a

    def _undo(self, a: np.ndarray, j: int) -> np.ndarray:
        a[j] = 0
        return self.repair_one(a)

    def local_search(self, a: np.ndarray, rng: np.random.Generator, iterations: int, fraction: float,
                     max_jobs: int = 32, restore: int = 32) -> tuple[np.ndarray, float, float]:
        """Destroy-and-refill on one matrix; keeps each result that is fitter.

        Each round picks 1 … ``2·fraction`` of the movable jobs (at most ``max_jobs``; half of them,
        rounded up, among the running jobs whose objective term loses least by giving one GPU back)
        and applies to each, at random, one of: give one GPU back, return to its current row
        (evicting what stands in the way, see :meth:`_insert`), or drop to nothing. Then
        :meth:`greedy` refills. Shrinking lets capacity move to where it gains more — the greedy
        only ever grows. Finally :meth:`restore` tries up to ``restore`` moved jobs back on their
        current rows. Returns (matrix, fitness, unpenalised fitness).
        """
        best = np.array(a, dtype=np.int64)
        bf, br = self.fitness_pair(best)
        mov = np.flatnonzero(self.movable)
        if mov.size == 0:
            return best, bf, br
        top = min(max(2, round(2 * fraction * mov.size)), max(int(max_jobs), 1), mov.size)
        losses = None
        for _ in range(iterations):
            if losses is None:
                losses = self._shrink_losses(best)
            _, after, loss = losses
            size = int(rng.integers(1, top + 1))
            donors = np.flatnonzero(np.isfinite(loss))
            donors = donors[np.argsort(loss[donors], kind="stable")][: 2 * size]
            n_don = min((size + 1) // 2, donors.size)
            pick = rng.choice(donors, size=n_don, replace=False) if n_don else donors
            rest = np.setdiff1d(mov, pick)
            pick = np.concatenate([pick, rng.choice(rest, size=min(size - n_don, rest.size), replace=False)])
            op = rng.integers(0, 3, size=pick.size)
            cand = best.copy()
            cand[pick[op == 0]] = after[pick[op == 0]]
            cand[pick[op == 1]] = 0
            for j in pick[op == 2]:
                cand = self._insert(cand, int(j), self.cur[j])
            cand = self.greedy(cand, loose=bool(rng.random() < 0.5))
            f, fr = self.fitness_pair(cand)
            if (f, fr) > (bf, br):
                best, bf, br = cand, f, fr
                losses = None
        if restore > 0:
            return self.restore(best, bf, br, restore)
        return best, bf, br

    def restore(self, a: np.ndarray, bf: float, br: float, max_jobs: int) -> tuple[np.ndarray, float, float]:
        """Try to put moved jobs back on their current rows (most promising first), refilling after
        each; keeps each fitter result. Catches a job moved only because another took its place."""
        best = a
        cur_u = _utility(self.matrix_speedups(self.cur, penalised=False), self.p)
        now_u = _utility(self.matrix_speedups(best), self.p)
        moved = np.flatnonzero(self.movable & (self.cur.sum(axis=1) > 0) & (best != self.cur).any(axis=1))
        moved = moved[np.argsort(now_u[moved] - cur_u[moved], kind="stable")][: max(int(max_jobs), 1)]
        for j in moved:
            if np.array_equal(best[j], self.cur[j]):
                continue
            cand = self.greedy(self._insert(best, int(j), self.cur[j]))
            f, fr = self.fitness_pair(cand)
            if (f, fr) > (bf, br):
                best, bf, br = cand, f, fr
        return best, bf, br

    # ----------------------------------------------------------------------------------------
    # Genetic search, vectorised over the population
    # ----------------------------------------------------------------------------------------

    def _keys(self, pop: np.ndarray) -> np.ndarray:
        """One bytes key per individual, for exact duplicate detection."""
        dtype = np.uint8 if self.gpn <= 255 else np.uint16
        flat = np.ascontiguousarray(pop.transpose(1, 0, 2), dtype=dtype).reshape(pop.shape[1], -1)
        return flat.view(np.dtype((np.void, flat.shape[1] * flat.itemsize))).ravel()

    def select(self, pop: np.ndarray, fit: np.ndarray, raw: np.ndarray,
               size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The best ``size`` distinct individuals, fittest first (ties: unpenalised fitness, then index)."""
        order = np.lexsort((np.arange(pop.shape[1]), -raw, -fit))
        if pop.shape[0] * pop.shape[2]:
            _, first = np.unique(self._keys(pop)[order], return_index=True)
            keep = order[np.sort(first)][:size]
        else:
            keep = order[:1]
        return pop[:, keep, :], fit[keep], raw[keep]

    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SPEC §5 mutation of a population; modifies ``pop`` in place and returns it."""
        nj, q, nn = pop.shape
        rows = pop.reshape(-1, nn)
        # Reset a row to the job's current allocation.
        ri = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < RESET_PROB)
        if ri.size:
            rows[ri] = self._cur32[ri // q]
        # For ~10 % of rows, zero each element with probability 0.1.
        zi = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < ZERO_ROW_PROB)
        if zi.size:
            rows[zi] *= rng.random((zi.size, nn), dtype=np.float32) >= ZERO_ELEM_PROB
        # Growth: element (j, n) grows to a uniform value in [value, max feasible] with probability
        # p1 + p2 − p1·p2 on nodes the job uses (p2 = 1/#such nodes), p1 elsewhere (p1 = 1/#nodes
        # where the job fits one more replica).
        free = np.maximum(self._cap32 - self._col_sums(pop), 0.0)                      # (q, N)
        room = np.maximum(self._rep_limit_grow[:, None] - self._row_sums(pop), 0.0)   # (J, q)
        has_free = free > 0
        n_free = has_free.sum(axis=1)
        # Rows (job, individual) that may grow: the job has room and its individual a free GPU.
        ri = np.flatnonzero((room > 0) & (n_free > 0)[None, :])
        if ri.size == 0:
            return pop
        rq = ri % q
        cand = has_free[rq]                                         # (R, N): nodes with a free GPU
        used = rows[ri] > 0
        np.logical_and(used, cand, out=used)
        p1 = (1.0 / n_free[rq]).astype(np.float32)[:, None]           # 1/#nodes that fit one more
        p2 = 1.0 / np.maximum(used.astype(np.float32) @ self._ones_n, 1.0)[:, None]
        prob = used * (p2 - p1 * p2)                                  # p1 + p2 − p1·p2 where used
        prob += p1
        prob *= cand
        u = rng.random(prob.shape, dtype=np.float32)
        gi = np.flatnonzero(u < prob)
        if gi.size:
            # Given growth, u/prob is uniform on [0, 1): reuse it for the new value.
            r_i, n_i = np.divmod(gi, nn)
            v = np.minimum(u.reshape(-1)[gi] / prob.reshape(-1)[gi], np.float32(0.999999))
            hi = np.minimum(free[rq[r_i], n_i], room.reshape(-1)[ri[r_i]])
            pop.reshape(-1)[ri[r_i] * nn + n_i] += np.floor(v * (hi + 1.0))
        return pop

    def crossover(self, pop: np.ndarray, fit: np.ndarray, raw: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
        """Binary tournaments pick parent pairs; single-point crossover over the job axis."""
        size = pop.shape[1]
        nj = pop.shape[0]
        pairs = max((size + 1) // 2, 1)
        a = rng.integers(size, size=(2, 2 * pairs))
        better = (fit[a[0]] > fit[a[1]]) | ((fit[a[0]] == fit[a[1]]) & (raw[a[0]] >= raw[a[1]]))
        win = np.where(better, a[0], a[1])
        pa, pb = win[:pairs], win[pairs:]
        cut = rng.integers(1, nj, size=pairs) if nj > 1 else np.ones(pairs, dtype=np.int64)
        head = np.arange(nj)[:, None] < cut[None, :]                  # (J, pairs)
        sel = np.concatenate([np.where(head, pa, pb), np.where(head, pb, pa)], axis=1)
        return pop[np.arange(nj)[:, None], sel]

    def genetic(self, seeds: np.ndarray, rng: np.random.Generator, population: int, generations: int,
                patience: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Run the GA from ``seeds`` ``(jobs, k, nodes)``; returns (population, fitness, raw, generations)."""
        seeds = self.repair(seeds)
        fit, raw = self.evaluate(seeds)
        pop, fit, raw = self.select(seeds, fit, raw, population)
        if pop.shape[1] < population:
            # Fill the initial population with mutants of the seeds.
            have = pop.shape[1]
            idx = np.arange(population - have) % have
            extra = self.repair(self.mutate(pop[:, idx, :], rng))
            ef, er = self.evaluate(extra)
            pop, fit, raw = self.select(np.concatenate([pop, extra], axis=1), np.concatenate([fit, ef]),
                                        np.concatenate([raw, er]), population)
        best = (float(fit[0]), float(raw[0]))
        stall = 0
        done = 0
        for _ in range(generations):
            children = self.repair(self.mutate(self.crossover(pop, fit, raw, rng), rng))
            cf, cr = self.evaluate(children)
            pop, fit, raw = self.select(np.concatenate([pop, children], axis=1), np.concatenate([fit, cf]),
                                        np.concatenate([raw, cr]), population)
            done += 1
            now = (float(fit[0]), float(raw[0]))
            if now > best:
                best, stall = now, 0
            else:
                stall += 1
            if patience is not None and stall >= patience:
                break
        return pop, fit, raw, done
