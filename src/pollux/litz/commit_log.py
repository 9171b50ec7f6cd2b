"""The master's commit log: flush keys handled but not yet applied by the shards, and the commits.

A completed batch leaves its updates at the workers (or, when small, brings them back inline) under
a *flush key*. The master handles keys in completion order and makes them visible to later tasks by
a *commit*: one message per shard listing the keys, numbered by ``commit_id``. Commits are sent
without waiting; reads and batches sent afterwards carry the commit number, and a shard holds them
until that commit is applied (§4.3 of the thesis).

The log has three stages, so a commit can carry many handled keys in one message:

* ``uncommitted``: keys handled since the mirror last advanced, with their inline updates;
* ``unsent``: keys already in the master's :class:`~pollux.litz.mirror.TableMirror`, whose commit
  to the shards is put off while every table travels with the batches (their inline updates summed
  per table in ``unsent_sum``, so one deferred commit is one update per table and shard);
* ``refs``: the commits sent and not yet known to be applied.

It sees the master only as a :class:`CommitOwner` (its layout, mirror, fault-tolerance controller
and ``get``), so this module does not import the master.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import ray

from pollux.litz.api import RunningJob
from pollux.litz.cache import UpdateLog
from pollux.litz.mirror import InlineLog, TableMirror
from pollux.litz.ps import FlushKey, StagedItem
from pollux.litz.records import Layout, RuntimeConfig, TableMeta, pack

__all__ = ["CommitLog", "CommitOwner"]


class CommitOwner(Protocol):
    """What the commit log reads from the master."""

    cfg: RuntimeConfig
    mirror: TableMirror

    @property
    def layout(self) -> Layout:
        """The current PS layout: the shards a commit goes to, and which rows each owns."""
        ...

    @property
    def view(self) -> RunningJob:
        """The job as a fault-tolerance controller sees it (handed to its ``before_commit``)."""
        ...

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """``ray.get`` with actor deaths turned into ``ActorLost``."""
        ...


class CommitLog:
    """Handled flush keys on their way to the shards, and the commits sent; see the module docstring."""

    def __init__(self, owner: CommitOwner, tables: dict[str, TableMeta]) -> None:
        self.owner = owner
        self.uncommitted: list[FlushKey] = []
        #: Updates that came back with their results (``RuntimeConfig.inline_update_bytes``), by key.
        self.uncommitted_inline: dict[FlushKey, InlineLog] = {}
        #: Handled keys already in the mirror whose commit to the shards is put off.
        self.unsent: list[FlushKey] = []
        #: Their inline updates summed per table (one update per table and shard per commit, not one
        #: per batch: a deferred commit of ~100 iterations was a 1 MiB message of 200 small logs).
        self.unsent_sum = UpdateLog(tables)
        #: The last of them: the sum travels under this key.
        self.unsent_inline_key: FlushKey | None = None
        self.unsent_bytes = 0
        #: The number of the last commit sent; reads and batches carry it.
        self.commit_id = 0
        #: The commits sent and not yet known to be applied.
        self.refs: list[Any] = []

    def handled(self, key: FlushKey, inline: InlineLog | None) -> None:
        """A batch's flush key, handled in completion order (with its updates when they came back)."""
        self.uncommitted.append(key)
        if inline is not None:
            self.uncommitted_inline[key] = inline

    def advance_mirror(self) -> None:
        """Apply the handled flush keys to the mirror and queue them for the shards (``unsent``)."""
        if self.uncommitted:
            keys, self.uncommitted = self.uncommitted, []
            inline, self.uncommitted_inline = self.uncommitted_inline, {}
            self.owner.mirror.apply(keys, inline)
            self.unsent += keys
            for key, log in inline.items():  # handled order, as `keys`
                for table, (rows, delta) in log.items():
                    self.unsent_sum.add_drained(table, rows, delta)
                    self.unsent_bytes += rows.nbytes + delta.nbytes
                self.unsent_inline_key = key

    def commit(self) -> None:
        """Send the handled flush keys to every shard as the next commit; do not wait (reads and
        batches sent from now on carry ``commit_id``, and the shards hold them until it is applied)."""
        self.advance_mirror()
        if self.unsent:
            ft = self.owner.cfg.fault_tolerance
            if ft is not None:  # e.g. SCAR: its copies of rows must be taken before they change
                ft.before_commit(self.owner.view)
            keys, self.unsent = self.unsent, []
            summed, key = self.unsent_sum.drain(), self.unsent_inline_key
            self.unsent_inline_key = None
            self.unsent_bytes = 0
            self.commit_id += 1
            parts = self._inline_parts({key: summed} if key is not None and summed else {})
            shards = self.owner.layout.shards
            self.refs += [
                s.commit.remote(keys, self.commit_id, pack(parts[k]) if parts[k] else None)
                for k, s in enumerate(shards)
            ]

    def _inline_parts(self, inline: dict[FlushKey, InlineLog]) -> list[dict[FlushKey, list[StagedItem]]]:
        """Inline updates split by owner shard under the current layout (whose shards hold their
        rows: a migration completes before the layout changes, and commits wait for it)."""
        layout = self.owner.layout
        n = len(layout.shards)
        parts: list[dict[FlushKey, list[StagedItem]]] = [{} for _ in range(n)]
        for key, drained in inline.items():
            for table, (rows, delta) in drained.items():
                if n == 1:
                    parts[0].setdefault(key, []).append((table, rows, delta))
                    continue
                owner = layout.owners[table][rows]
                for s in np.unique(owner):
                    sel = owner == s
                    parts[int(s)].setdefault(key, []).append((table, rows[sel], delta[sel]))
        return parts

    def sync(self) -> None:
        """Wait until every commit sent is applied (before a PS migration)."""
        refs, self.refs = self.refs, []
        self.owner.get(refs)

    def abandon(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for the commits sent, then forget them, applied or not (a
        recovery: some went to a shard that is lost)."""
        if self.refs:
            ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
            self.refs = []

    def check(self) -> None:
        """Raise for a commit that failed among those already applied; forget the applied ones."""
        if self.refs:
            ready, self.refs = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
            self.owner.get(ready)
