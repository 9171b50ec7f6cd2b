"""The run's PS shards: the current layout, where each shard runs, and shards retired by a migration.

The parameter server's rows are spread over shard actors by a :class:`~pollux.litz.records.Layout`
(which shard owns each row; its id grows on every change). The layout changes when the job starts or
is restored from a checkpoint (all shards new), when an elastic resize migrates rows
(``pollux.litz.elastic``), and when a fault-tolerance controller replaces lost shards. A shard that a
migration retires keeps forwarding requests for rows it gave away until no batch sent under the old
layout can still be running; then it is killed. This module keeps that bookkeeping, so that the
master and the elasticity code ask for an operation (create, install, replace, retire) instead of
rebuilding layouts by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray

from pollux.litz.actors import actor_options, wait_dead
from pollux.litz.api import ShardRows
from pollux.litz.ps import PSShardActor
from pollux.litz.records import Layout, RuntimeConfig, TableMeta, shard_assignment

__all__ = ["ShardLayout"]


class ShardLayout:
    """The shards of one run; see the module docstring."""

    def __init__(self, cfg: RuntimeConfig, tables: dict[str, TableMeta], get: Callable[..., Any]) -> None:
        self.cfg = cfg
        self.tables = tables
        self.get = get
        self.layout = Layout(0, {}, [])
        #: shard actor → the Ray node it was asked to run on (None: anywhere).
        self.nodes: dict[Any, str | None] = {}
        self.pids: list[int] = []
        #: (the last batch id that may still use it, handle) of each shard a migration retired.
        self.retired: list[tuple[int, Any]] = []
        self.shard_cls = ray.remote(PSShardActor)

    def make(self, index: int, tables: ShardRows, node: str | None, commit_id: int) -> Any:
        """Create shard actor `index` holding `tables` (on Ray node `node` when given), starting at
        commit `commit_id`; with a fault-tolerance controller, with its side object."""
        opts = actor_options(self.cfg, node)
        opts.pop("resources", None)  # custom resources count workers only
        ft = self.cfg.fault_tolerance
        ext = ft.shard_extension if ft is not None else None
        handle = self.shard_cls.options(**opts).remote(index, dict(tables), commit_id, ext)
        self.nodes[handle] = node
        return handle

    def create(
        self,
        num_shards: int,
        start: Mapping[str, np.ndarray],
        default_node: Callable[[int], str | None],
        commit_id: int,
    ) -> None:
        """New shards, `num_shards` of them, holding the full tables `start`, their rows spread by
        the seeded rule (`shard_assignment`); shard k goes to ``default_node(k)``."""
        owners = {n: shard_assignment(m.shape[0], num_shards, self.cfg.seed) for n, m in self.tables.items()}
        shards: list[Any] = []
        for k in range(num_shards):
            tables = {}
            for name in self.tables:
                rows = np.flatnonzero(owners[name] == k)
                tables[name] = (rows, start[name][rows])
            shards.append(self.make(k, tables, default_node(k), commit_id))
        self.install(owners, shards)

    def install(self, owners: dict[str, np.ndarray], shards: list[Any]) -> None:
        """Make `shards`, with rows owned by `owners`, the current layout (a new layout id)."""
        self.layout = Layout(self.layout.layout_id + 1, owners, shards)
        self.pids = self.get([s.pid.remote() for s in shards])

    def replace(
        self, rows: Mapping[int, ShardRows], default_node: Callable[[int], str | None], commit_id: int
    ) -> None:
        """A new actor for each shard index in `rows`, holding those rows, in place of the old one
        (killed); the owners of the rows stay as they were."""
        shards = list(self.layout.shards)
        for k, tables in sorted(rows.items()):
            ray.kill(shards[k], no_restart=True)
            shards[k] = self.make(k, tables, default_node(k), commit_id)
        self.install(self.layout.owners, shards)

    def retire(self, shards: list[Any], last_batch: int) -> None:
        """Shards a migration left out: killed once no batch up to `last_batch` is still running."""
        self.retired += [(last_batch, h) for h in shards]

    def drop_retired(self, oldest_running_batch: int) -> None:
        """Kill the retired shards that no batch still running can use, and wait until they are gone."""
        gone = [(b, h) for b, h in self.retired if b < oldest_running_batch]
        if gone:
            self.retired = [(b, h) for b, h in self.retired if b >= oldest_running_batch]
            for _, h in gone:
                ray.kill(h, no_restart=True)
                self.nodes.pop(h, None)
            wait_dead([h for _, h in gone])

    def discard(self, shards: list[Any]) -> None:
        """Kill new shards that will not be used (a resize that was given up)."""
        for h in shards:
            ray.kill(h, no_restart=True)
            self.nodes.pop(h, None)

    def take_all(self) -> list[Any]:
        """Every shard actor, current and retired, for the run's end; the layout keeps its owners
        and no shard."""
        handles = list(self.layout.shards) + [h for _, h in self.retired]
        self.layout = Layout(self.layout.layout_id + 1, self.layout.owners, [])
        self.retired.clear()
        return handles
