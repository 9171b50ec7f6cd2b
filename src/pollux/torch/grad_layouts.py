"""Where each parameter's gradient lies in DDP's flat gradient buckets, by optimiser parameter group.

The gradient statistics (:mod:`pollux.torch.gradstats`) are taken per parameter group from the
buckets DDP all-reduces. A bucket's layout says which runs of its flat buffer belong to which
group; it is keyed on the buffer *and* its parameters, because DDP rebuilds its buckets after the
first iteration (in gradient-ready order) and a new buffer may reuse the old one's address: a layout
keyed on the address alone would map gradients to the wrong parameters on that replica only. With
an Adam-family optimiser each layout also holds the bucket's flattened pre-conditioner (filled by
:mod:`pollux.torch.adam_preconditioner`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BucketLayout", "BucketLayouts"]


class BucketLayout:
    """Where each parameter's gradient lies in one DDP bucket, grouped in runs of one param group."""

    __slots__ = ("key", "numel", "pc2", "pc_sources", "pc_version", "prev", "prev_sid", "result",
                 "result_sid", "runs", "scratch", "send", "spans")

    def __init__(self, key: tuple[Any, ...], numel: int, spans: list[tuple[torch.Tensor, int, int, int]],
                 runs: list[tuple[int, int, int, list[torch.Tensor]]]) -> None:
        self.key = key
        self.numel = numel
        self.spans = spans          # (param, offset, numel, group)
        self.runs = runs            # (start, end, group, params) with group >= 0
        self.pc2: torch.Tensor | None = None
        self.pc_version = -1
        self.pc_sources: list[tuple[list[torch.Tensor], tuple[int, ...]] | None] = [None] * len(runs)
        self.prev: torch.Tensor | None = None
        self.prev_sid = -10
        self.result: torch.Tensor | None = None     # the reduced (averaged) bucket of step result_sid
        self.result_sid = -10
        # Reused buffers (a fresh bucket-sized allocation every step costs page faults): products
        # with the pre-conditioner, and the first bucket's copy with the packet appended.
        self.scratch: torch.Tensor | None = None
        self.send: torch.Tensor | None = None


class BucketLayouts:
    """The layout of every bucket DDP has now, by bucket index; see the module docstring."""

    def __init__(self, optimizer: torch.optim.Optimizer, with_preconditioner: bool) -> None:
        self.with_preconditioner = with_preconditioner
        self.group_of: dict[int, int] = {}
        for gi, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                self.group_of[id(p)] = gi
        self.layouts: dict[int, BucketLayout] = {}
        #: Buckets seen this step: the layouts of the others are dropped when the step ends.
        self.seen_buckets: set[int] = set()
        #: Each parameter's slice of its bucket's pre-conditioner (the micro-step hooks read it).
        self.param_pc2: dict[int, torch.Tensor] = {}

    def start_step(self) -> None:
        self.seen_buckets = set()

    def prune(self) -> None:
        """Forget the layouts of buckets DDP no longer has (after a rebuild)."""
        if self.seen_buckets:
            for idx in [i for i in self.layouts if i not in self.seen_buckets]:
                del self.layouts[idx]

    def get(self, bucket: Any) -> tuple[BucketLayout, bool]:
        """The bucket's layout, and whether it was (re)built just now."""
        buf = bucket.buffer()
        key = (buf.data_ptr(), buf.numel(), tuple(id(p) for p in bucket.parameters()))
        idx = bucket.index()
        self.seen_buckets.add(idx)
        lay = self.layouts.get(idx)
        if lay is not None and lay.key == key:
            return lay, False
        lay = self._build(bucket, buf, key)
        self.layouts[idx] = lay
        return lay, True

    def _build(self, bucket: Any, buf: torch.Tensor, key: tuple[Any, ...]) -> BucketLayout:
        base, esize, total = buf.data_ptr(), buf.element_size(), buf.numel()
        spans = []
        running = 0
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            n = g.numel()
            off = (g.data_ptr() - base) // esize if g.is_contiguous() else -1
            if not (0 <= off and off + n <= total):
                off = running
            running += n
            spans.append((p, int(off), int(n), self.group_of.get(id(p), -1)))
        spans.sort(key=lambda s: s[1])
        runs: list[tuple[int, int, int, list[torch.Tensor]]] = []
        for p, off, n, gi in spans:
            if gi < 0:
                continue
            if runs and runs[-1][2] == gi and runs[-1][1] == off:
                start, _, _, params = runs[-1]
                params.append(p)
                runs[-1] = (start, off + n, gi, params)
            else:
                runs.append((off, off + n, gi, [p]))
        lay = BucketLayout(key, total, spans, runs)
        if self.with_preconditioner:
            lay.pc2 = torch.ones(total, dtype=torch.float32, device=buf.device)
            for p, off, n, gi in spans:
                if gi >= 0:
                    self.param_pc2[id(p)] = lay.pc2[off:off + n]
        return lay
