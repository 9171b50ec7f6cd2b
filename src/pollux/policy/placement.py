"""Where a job's GPUs go on the nodes: the one placement module of the baselines and the simulator.

A placement turns "this job gets r GPUs" into GPUs per node, given the free GPUs per node. Two rules
exist, both deterministic (ties go to the lowest node index) and both pure (``free`` is never modified):

* **packed** (:func:`place_packed`, the default of every baseline): the node with the most free GPUs
  gives all it can, repeatedly — the fewest nodes possible. The Pollux paper's "as few different nodes
  as possible"; it reproduces the published comparison.
* **spread** (:func:`place_spread`): one GPU at a time from the node with the most free GPUs.

:func:`packed_shape` is the packed placement on an empty cluster of equal nodes (``[4, 4, …, rest]``),
which is what the simulator's oracle step times and isolated JCTs assume.
"""

from __future__ import annotations

import numpy as np

#: Names of the placements :func:`place` knows.
PLACEMENTS = ("packed", "spread")


def place_packed(replicas: int, free: np.ndarray) -> np.ndarray | None:
    """Place ``replicas`` GPUs on as few nodes as possible.

    Repeatedly take every GPU still needed from the node with the most free GPUs (ties: lowest
    index) — largest-first, so the number of nodes used is minimal. Returns the per-node counts, or
    None if fewer than ``replicas`` GPUs are free.
    """
    free = np.asarray(free, dtype=np.int64)
    row = np.zeros_like(free)
    if replicas <= 0:
        return row
    if int(free.sum()) < replicas:
        return None
    left = free.copy()
    need = int(replicas)
    while need > 0:
        n = int(np.argmax(left))
        take = min(need, int(left[n]))
        row[n] += take
        left[n] -= take
        need -= take
    return row


def place_spread(replicas: int, free: np.ndarray) -> np.ndarray | None:
    """Take ``replicas`` GPUs one at a time from the node with the most free GPUs (ties: lowest index).

    Returns the per-node GPU counts, or None if not enough GPUs are free. This spreads a job over many
    nodes; kept as an option in case the reference behaviour is this reading of the spec.
    """
    free = np.asarray(free, dtype=np.int64)
    if replicas <= 0:
        return np.zeros_like(free)
    if int(free.sum()) < replicas:
        return None
    left = free.copy()
    row = np.zeros_like(left)
    for _ in range(int(replicas)):
        n = int(np.argmax(left))
        row[n] += 1
        left[n] -= 1
    return row


def check_placement(placement: str) -> str:
    """``placement`` if it names a known placement, else ``ValueError`` naming the field."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: expected one of {PLACEMENTS}, got {placement!r}")
    return placement


def place(replicas: int, free: np.ndarray, placement: str) -> np.ndarray | None:
    """Placement of a newly (re)started job by name: ``packed`` or ``spread``."""
    if check_placement(placement) == "packed":
        return place_packed(replicas, free)
    return place_spread(replicas, free)


def packed_shape(gpus: int, gpus_per_node: int = 4) -> list[int]:
    """GPUs per node of ``gpus`` GPUs packed on an empty cluster of ``gpus_per_node``-GPU nodes:
    ``[4, 4, ..., rest]`` (the simulator's oracle and isolated-JCT placements)."""
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node: must be >= 1, got {gpus_per_node}")
    nodes = -(-int(gpus) // int(gpus_per_node))
    row = place_packed(int(gpus), np.full(nodes, int(gpus_per_node), dtype=np.int64))
    assert row is not None  # nodes × gpus_per_node >= gpus by construction
    return [int(g) for g in row if g > 0]
