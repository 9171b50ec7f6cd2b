"""The resizes under way in a running Litz job: one record per worker or shard resize not yet done.

A resize starts in :mod:`pollux.litz.elastic`, waits for its new actors to start, moves executors
or rows, and ends once nothing it moved is still on its way. The runtime asks whether any is under
way (a later resize waits its turn; the run ends only when none is), the master drops the new
shard actors of unfinished shard resizes when it stops, and a restored cut forgets the worker
resizes it interrupted. Each of those is a method here, so that no one edits the lists directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ResizesUnderWay", "ShardResize", "WorkerResize"]


@dataclass
class WorkerResize:
    """Workers joining and leaving: the summary's `record` (updated as the resize goes), the
    workers that stay, leave and were created, the new workers' start answers (`starting`, empty
    once they run) and the executor moves not yet arrived (`moves`)."""

    record: dict[str, Any]
    staying: list[int]
    leaving: list[int]
    new: list[int]
    starting: list[Any] = field(default_factory=list)
    moves: list[Any] = field(default_factory=list)


@dataclass
class ShardResize:
    """PS rows re-spread over new shards: the summary's `record`, the shard handles of the new
    layout (`handles`), the shard actors created for it (`new`) and their start answers."""

    record: dict[str, Any]
    handles: list[Any]
    new: list[Any]
    starting: list[Any] = field(default_factory=list)


class ResizesUnderWay:
    """The worker and shard resizes begun and not yet finished or cancelled, in start order."""

    def __init__(self) -> None:
        self.workers: list[WorkerResize] = []
        self.shards: list[ShardResize] = []

    def any(self) -> bool:
        """True while a worker or a shard resize is under way."""
        return bool(self.workers or self.shards)

    def begin_workers(self, resize: WorkerResize) -> None:
        self.workers.append(resize)

    def end_workers(self, resize: WorkerResize) -> None:
        """The worker resize finished or was cancelled."""
        self.workers.remove(resize)

    def begin_shards(self, resize: ShardResize) -> None:
        self.shards.append(resize)

    def end_shards(self, resize: ShardResize) -> None:
        """The shard resize finished or was cancelled (a no-op if it was never begun)."""
        if resize in self.shards:
            self.shards.remove(resize)

    def leaving_workers(self) -> set[int]:
        """Workers that an unfinished resize is taking away."""
        return {w for resize in self.workers for w in resize.leaving}

    def forget_workers(self) -> None:
        """Drop the worker resizes (a restored cut re-creates the workers they were moving)."""
        self.workers.clear()

    def take_new_shards(self) -> list[Any]:
        """The shard actors created for unfinished shard resizes, which are dropped (the master is
        stopping its actors)."""
        handles = [h for resize in self.shards for h in resize.new]
        self.shards.clear()
        return handles
