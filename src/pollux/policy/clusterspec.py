"""Cluster descriptions: ``"aws:6x4,rtx:3x8,dgx-ext:2x8"`` — GPU type, nodes × GPUs per node.

The one parser of cluster strings, used by ``pollux simulate --cluster``, the benchmarks and the
live service's ``--local-nodes``. Node ids are ``<type>-<i>``, numbered from 0 within each type
(zero-padded to the type's width), in the order the string lists them. A file holds the same
entries, one per line or comma-separated (``#`` starts a comment).

Errors are ``ValueError``s naming the entry (and the file and line for a file) and what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pollux.policy.base import Cluster

__all__ = ["NodeGroup", "format_cluster", "load_cluster", "parse_cluster"]

_ENTRY = re.compile(r"^(?P<type>[A-Za-z0-9][A-Za-z0-9_.-]*):(?P<nodes>\d+)[xX](?P<gpus>\d+)$")


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``nodes`` nodes of ``gpus`` GPUs of type ``gpu_type``."""

    gpu_type: str
    nodes: int
    gpus: int


def _groups(text: str, where: str) -> list[NodeGroup]:
    out: list[NodeGroup] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if m is None:
            raise ValueError(f"{where}: cluster entry {entry!r}: expected TYPE:NODESxGPUS, e.g. aws:6x4")
        nodes, gpus = int(m["nodes"]), int(m["gpus"])
        if nodes < 1 or gpus < 1:
            raise ValueError(f"{where}: cluster entry {entry!r}: nodes and GPUs per node must be >= 1")
        out.append(NodeGroup(m["type"], nodes, gpus))
    return out


def _build(groups: list[NodeGroup], where: str) -> Cluster:
    if not groups:
        raise ValueError(f"{where}: empty cluster description (expected e.g. aws:6x4,rtx:3x8)")
    seen: set[str] = set()
    nodes: list[str] = []
    gpus: list[int] = []
    types: list[str] = []
    for g in groups:
        if g.gpu_type in seen:
            raise ValueError(f"{where}: GPU type {g.gpu_type!r} is listed twice")
        seen.add(g.gpu_type)
        width = len(str(g.nodes - 1))
        for i in range(g.nodes):
            nodes.append(f"{g.gpu_type}-{i:0{width}d}")
            gpus.append(g.gpus)
            types.append(g.gpu_type)
    return Cluster(tuple(nodes), tuple(gpus), tuple(types))


def parse_cluster(text: str, *, where: str = "cluster") -> Cluster:
    """The cluster a string like ``"aws:6x4,rtx:3x8"`` describes (errors name ``where``)."""
    return _build(_groups(text, where), where)


def load_cluster(path: str | Path) -> Cluster:
    """The cluster a file describes (entries separated by commas or lines; ``#`` comments)."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{p}: cannot read the cluster file: {exc.strerror or exc}") from None
    groups: list[NodeGroup] = []
    for n, line in enumerate(lines, start=1):
        groups += _groups(line.split("#", 1)[0], f"{p}, line {n}")
    return _build(groups, str(p))


def format_cluster(cluster: Cluster) -> str:
    """The string of a cluster whose nodes of each type have equal GPU counts (else per node)."""
    parts: list[str] = []
    for t in cluster.type_names:
        idx = cluster.nodes_of_type(t)
        counts = {cluster.gpus[i] for i in idx}
        if len(counts) == 1:
            parts.append(f"{t}:{idx.size}x{counts.pop()}")
        else:
            parts += [f"{t}:1x{cluster.gpus[i]}" for i in idx]
    return ",".join(parts)
