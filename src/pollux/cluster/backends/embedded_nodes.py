"""The embedded cluster's nodes on request: the service writes the names it wants, the Ray host obeys.

The embedded Ray cluster is owned by the Ray host process (:mod:`pollux.cluster.backends.rayhost`),
not by the service, so the service cannot call ``Cluster.add_node`` itself. Started with
``--wanted FILE``, the Ray host runs a head without GPUs and, every fraction of a second, makes its
worker nodes match the names listed in FILE: it adds each missing one as a virtual node of
``gpus_per_node`` GPU slots and removes each one no longer listed. :class:`EmbeddedNodes` is the
service's side: it names nodes ``node-<i>`` (the lowest free index, as the fixed embedded cluster
names them) and writes FILE atomically, so the Ray host never reads half a list.

The file is the whole protocol: it survives a restart of the service (the next service reads what
was wanted), and a Ray host that restarts builds the nodes it lists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pollux.cluster.backends.nodes_api import ProviderError

__all__ = ["WANTED_FILE", "EmbeddedNodes", "read_wanted"]

#: The file in the state folder that lists the worker nodes the service wants.
WANTED_FILE = "nodes-wanted.json"


def read_wanted(path: Path) -> list[str] | None:
    """The node names listed in ``path``, or None when it does not exist yet.

    Raises ValueError naming the file when it is not a JSON object with a list of names under
    ``"nodes"``: the Ray host logs that and keeps the nodes it has rather than guessing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:   # a folder, a path under a file, no permission
        raise ValueError(f"{path}: cannot read the wanted nodes ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    names = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{path}: expected {{\"nodes\": [names]}}")
    return list(names)


class EmbeddedNodes:
    """:class:`~pollux.cluster.backends.nodes_api.NodeProvider` of the embedded cluster (see above)."""

    kind = "embedded"

    def __init__(self, path: Path, gpus_per_node: int) -> None:
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {gpus_per_node}")
        self.path = Path(path)
        self.gpus_per_node = int(gpus_per_node)
        try:
            self.wanted: list[str] = read_wanted(self.path) or []
        except ValueError as exc:
            raise ProviderError(str(exc)) from None

    def hold(self, keep: Sequence[str], new: int, *, alive: Sequence[str] = ()) -> None:
        kept = set(keep)
        up = set(alive)
        # Nodes already asked for and not alive yet are the first of the ``new`` ones: asking for a
        # fresh name instead would start a second node while the first is still coming.
        coming = [n for n in self.wanted if n not in kept and n not in up]
        wanted = sorted(kept) + coming[:max(int(new), 0)]
        index = 0
        while len(wanted) < len(kept) + max(int(new), 0):
            name = f"node-{index}"
            if name not in wanted and name not in up:   # an alive node let go keeps its name until gone
                wanted.append(name)
            index += 1
        wanted = sorted(wanted, key=_node_order)
        if wanted != self.wanted or not self.path.exists():
            self._write(wanted)
        self.wanted = wanted

    def pending(self, alive: Sequence[str]) -> int:
        up = set(alive)
        return sum(1 for n in self.wanted if n not in up)

    def close(self) -> None:
        """Nothing to close: the file stays, so a restarted service keeps the same nodes."""

    def _write(self, names: list[str]) -> None:
        from pollux.cluster.backends.rayhost import write_json_atomic

        try:
            write_json_atomic(self.path, {"nodes": names, "gpus_per_node": self.gpus_per_node})
        except OSError as exc:
            why = exc.strerror or exc
            raise ProviderError(f"{self.path}: cannot write the wanted nodes ({why})") from None


def _node_order(name: str) -> tuple[int, str]:
    """``node-2`` before ``node-10``: by index where the name has one."""
    _, _, tail = name.rpartition("-")
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)
