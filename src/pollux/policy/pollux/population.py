"""The population layout of the Pollux search, and the id-keyed form a population is carried in.

A population is a float32 ``(jobs, individuals, nodes)`` array of whole numbers, the layout of
:mod:`pollux.policy.genetic`; one individual is an int64 ``(jobs, nodes)`` matrix in the problem's job
order and the cluster's node order. Between rounds the final population travels in the policy state,
sparse and keyed by job and node ids rather than positions, because the next round may have other jobs,
in another priority order, on other nodes: :meth:`PopulationCodec.remap` keeps what still applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pollux.policy import genetic
from pollux.policy.base import Cluster, PolicyState, decode_state
from pollux.policy.genetic import row_sums

#: Version tag of the state this policy carries between rounds.
STATE_VERSION = 1


def row_counts(mask: np.ndarray) -> np.ndarray:
    """Per (job, individual), how many nodes are set in a boolean ``(jobs, individuals, nodes)`` mask."""
    return row_sums(mask.astype(np.float32))


class PopulationCodec:
    """Converts between one round's matrices, populations, their keys and the carried state.

    ``job_ids`` are the round's jobs in the problem's (priority) order; the cluster gives the node ids
    and order; ``gpus_per_node`` (the largest node) sizes the duplicate-detection keys.
    """

    def __init__(self, job_ids: list[str], cluster: Cluster, gpus_per_node: int) -> None:
        self.job_ids = job_ids
        self.cluster = cluster
        self.num_jobs = len(job_ids)
        self.num_nodes = cluster.num_nodes
        self.gpus_per_node = gpus_per_node

    def stack(self, matrices: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        """Population ``(jobs, len, nodes)`` float32 of ``(jobs, nodes)`` matrices."""
        arr = np.asarray(matrices, dtype=np.float32).reshape(-1, self.num_jobs, self.num_nodes)
        return np.ascontiguousarray(arr.transpose(1, 0, 2))

    def unstack(self, pop: np.ndarray, i: int) -> np.ndarray:
        """Individual ``i`` of a population as an int64 ``(jobs, nodes)`` matrix."""
        return np.rint(pop[:, i, :]).astype(np.int64)

    def keys(self, pop: np.ndarray) -> np.ndarray:
        """One bytes key per individual, for exact duplicate detection."""
        return genetic.keys(pop, np.uint8 if self.gpus_per_node <= 255 else np.uint16)

    def remap(self, state: PolicyState | None, limit: int) -> np.ndarray:
        """Up to ``limit`` individuals ``(jobs, k, nodes)`` of a carried population, on this round's
        jobs and nodes (rows of departed jobs and columns of departed nodes dropped; new jobs get 0)."""
        empty = np.zeros((self.num_jobs, 0, self.num_nodes), dtype=np.float32)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or limit <= 0:
            return empty
        try:
            state = decode_state(state)          # as stored (JSON, arrays encoded) or already decoded
            size = int(state["size"])
            old_jobs = [str(x) for x in state["job_ids"]]
            old_nodes = [str(x) for x in state["node_ids"]]
            pi = np.asarray(state["pop_index"], dtype=np.int64).ravel()
            ji = np.asarray(state["job_index"], dtype=np.int64).ravel()
            ni = np.asarray(state["node_index"], dtype=np.int64).ravel()
            g = np.asarray(state["gpus"], dtype=np.int64).ravel()
        except (KeyError, TypeError, ValueError):
            return empty
        size = min(size, limit)
        if size <= 0 or not (pi.size == ji.size == ni.size == g.size):
            return empty
        jpos = {jid: i for i, jid in enumerate(self.job_ids)}
        npos = self.cluster.index()
        jmap = np.array([jpos.get(x, -1) for x in old_jobs], dtype=np.int64)
        nmap = np.array([npos.get(x, -1) for x in old_nodes], dtype=np.int64)
        ok = (pi >= 0) & (pi < size) & (ji >= 0) & (ji < jmap.size) & (ni >= 0) & (ni < nmap.size)
        pi, ji, ni, g = pi[ok], ji[ok], ni[ok], g[ok]
        nj, nn = jmap[ji], nmap[ni]
        ok = (nj >= 0) & (nn >= 0) & (g > 0)
        out = np.zeros((self.num_jobs, size, self.num_nodes), dtype=np.float32)
        np.add.at(out, (nj[ok], pi[ok], nn[ok]), g[ok].astype(np.float32))
        return out

    def encode(self, pop: np.ndarray) -> dict[str, Any]:
        """Sparse, id-keyed form of a population ``(jobs, k, nodes)`` for the policy state."""
        ji, pi, ni = np.nonzero(pop)
        order = np.lexsort((ni, ji, pi))
        ji, pi, ni = ji[order], pi[order], ni[order]
        return {
            "version": STATE_VERSION,
            "job_ids": list(self.job_ids),
            "node_ids": list(self.cluster.nodes),
            "size": int(pop.shape[1]),
            "pop_index": pi.astype(np.int32),
            "job_index": ji.astype(np.int32),
            "node_index": ni.astype(np.int32),
            "gpus": np.rint(pop[ji, pi, ni]).astype(np.int32),
        }
