"""What each page of the web view shows, as plain records built from the store: the templates only
lay them out. A job kind or a GPU type is a value in a column here, never a page of its own.

Every number is formatted here (:func:`number_text`), every string is left as it is stored: the
templates escape it (Jinja2 autoescaping), so a hostile job name is shown, never run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from pollux.cluster.backends.gputypes import job_gpu_types
from pollux.cluster.state.records import JobOutlook, JobRecord, ResizeRecord, RoundRecord
from pollux.cluster.web.charts import Chart, line_chart, number_text
from pollux.cluster.web.history import HintsPoint

__all__ = ["PAGE_SIZE", "AllocationRow", "JobRow", "JobsFilter", "NodeRow", "Pager", "RoundRow", "SlotCell",
           "age_text", "allocation_rows", "clock_text", "job_charts", "job_row", "node_rows", "round_rows"]

#: Jobs per page of the jobs table.
PAGE_SIZE = 50


def clock_text(t: float | None) -> str:
    """A time for people (local time, to the second); a dash for none."""
    if t is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def age_text(seconds: float) -> str:
    """A duration for people: seconds, minutes, hours or days, one unit and one decimal at most."""
    s = max(float(seconds), 0.0)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _maybe(value: float | None, digits: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:{digits}}" if digits else number_text(value)


def placement_text(allocation: Mapping[str, int]) -> str:
    """``node×GPUs`` per node, in node order; a dash for none."""
    return ", ".join(f"{node}×{gpus}" for node, gpus in sorted(allocation.items())) or "–"


@dataclass(frozen=True)
class JobRow:
    """One row of the jobs table, every cell as text."""

    id: str
    name: str
    state: str
    kind: str
    gpus: int
    placement: str
    gpu_types: str
    batch_size: str
    local_bsz: str
    accum_steps: str
    efficiency: str
    goodput: str
    speedup: str
    restarts: int
    failures: int
    age: str
    user: str


def job_row(job: JobRecord, outlook: JobOutlook | None, types: Mapping[str, str], now: float) -> JobRow:
    """The row of ``job``: its counts and, from the latest round's ``outlook``, the batch size (global,
    local, accumulation steps), statistical efficiency, goodput and speedup it is expected to run at."""
    o = outlook if outlook is not None and outlook.gpus > 0 else None
    end = job.end_time if job.end_time is not None else now
    return JobRow(
        id=job.id, name=job.name, state=job.state, kind=job.spec.kind,
        gpus=int(sum(job.allocation.values())), placement=placement_text(job.allocation),
        gpu_types=", ".join(job_gpu_types(job.allocation, types)) or "–",
        batch_size=_maybe(None if o is None else o.batch_size),
        local_bsz=_maybe(None if o is None else o.local_bsz),
        accum_steps="–" if o is None or o.accum_steps is None else str(o.accum_steps),
        efficiency=_maybe(None if o is None else o.efficiency, ".2f"),
        goodput=_maybe(None if o is None else o.goodput),
        speedup=_maybe(None if o is None else o.speedup, ".2f"),
        restarts=job.restarts, failures=job.failures, age=age_text(end - job.submit_time),
        user="admin" if job.owner is None else job.owner)


@dataclass(frozen=True)
class JobsFilter:
    """The jobs table's filter: the states shown (none: all) and the user (None: every user the viewer
    may see; ``admin``: the admin's own jobs)."""

    states: tuple[str, ...] = ()
    user: str | None = None

    def query(self, page: int | None = None) -> str:
        """The query string of this filter at ``page``."""
        pairs: list[tuple[str, Any]] = [("state", s) for s in self.states]
        if self.user is not None:
            pairs.append(("user", self.user))
        if page is not None and page > 1:
            pairs.append(("page", page))
        return urlencode(pairs)


@dataclass(frozen=True)
class Pager:
    """Where a page of a table stands: its number, how many there are, how many rows in all, and the
    links to the previous and next pages (None at either end)."""

    page: int
    pages: int
    total: int
    previous: str | None
    next: str | None


def pager(page: int, total: int, filters: JobsFilter) -> Pager:
    pages = max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1)
    previous = f"/?{filters.query(page - 1)}" if page > 1 else None
    following = f"/?{filters.query(page + 1)}" if page < pages else None
    return Pager(page, pages, total, previous, following)


@dataclass(frozen=True)
class AllocationRow:
    version: int
    time: str
    gpus: int
    placement: str
    applied: str


def allocation_rows(history: Sequence[ResizeRecord]) -> list[AllocationRow]:
    """A job's allocation history, newest first."""
    return [AllocationRow(r.version, clock_text(r.time), int(sum(r.allocation.values())),
                          placement_text(r.allocation), clock_text(r.applied) if r.applied else "–")
            for r in reversed(history)]


def job_charts(points: Sequence[HintsPoint], history: Sequence[ResizeRecord], now: float) -> list[Chart]:
    """A job's charts over time: its GPUs (from the allocation history, each held until the next, up
    to ``now``), and from its hints history the batch size, statistical efficiency, gradient noise
    scale, predicted step time and goodput — each measured one right after its prediction, when the
    agent reports measurements (hints version 3), so that the two are read together."""
    gpus = [(r.time, float(sum(r.allocation.values()))) for r in history]
    def series(name: str) -> list[tuple[float, float | None]]:
        return [(p.time, getattr(p, name)) for p in points]

    charts = [line_chart("gpus", "GPUs", "", gpus, step=True),
              line_chart("batch_size", "Batch size (global)", "", series("batch_size")),
              line_chart("efficiency", "Statistical efficiency", "", series("efficiency")),
              line_chart("pgns", "Gradient noise scale", "", series("pgns")),
              line_chart("step_time", "Predicted step time", "s", series("step_time"))]
    if any(p.measured_step_time is not None for p in points):
        charts.append(line_chart("measured_step_time", "Measured step time", "s",
                                 series("measured_step_time")))
    charts.append(line_chart("goodput", "Goodput", "ex/s", series("goodput")))
    if any(p.measured_goodput is not None for p in points):
        charts.append(line_chart("measured_goodput", "Measured goodput", "ex/s", series("measured_goodput")))
    return charts


@dataclass(frozen=True)
class SlotCell:
    """One GPU slot of a node in the allocation map: free, one of the viewer's jobs, or another user's
    (``job_id`` None: not named to this viewer)."""

    job_id: str | None
    taken: bool
    colour: int


@dataclass(frozen=True)
class NodeRow:
    name: str
    gpus: int
    gpu_type: str
    address: str
    used: int
    slots: list[SlotCell]


def node_rows(nodes: Sequence[Mapping[str, Any]], allocations: Mapping[str, Mapping[str, int]],
              visible: set[str] | None) -> list[NodeRow]:
    """Each node with its GPU slots, each slot free or held by a job; ``visible`` the jobs the viewer
    may see named (None: every job), the others' slots shown as taken without a name."""
    held: dict[str, list[str]] = {}
    for job_id, allocation in sorted(allocations.items()):
        for node_name, count in allocation.items():
            held.setdefault(node_name, []).extend([job_id] * int(count))
    colours = {job_id: k % 8 for k, job_id in enumerate(sorted(allocations))}
    rows = []
    names = [str(n.get("name", "")) for n in nodes]
    extra = sorted(set(held) - set(names))   # a node gone from the backend whose GPUs are still held
    listed: list[Mapping[str, Any]] = [*nodes, *({"name": n} for n in extra)]
    for node in listed:
        name = str(node.get("name", ""))
        jobs = held.get(name, [])
        total = max(int(node.get("gpus", 0) or 0), len(jobs))
        slots = [SlotCell(j if visible is None or j in visible else None, True, colours[j]) for j in jobs]
        slots += [SlotCell(None, False, 0)] * (total - len(jobs))
        rows.append(NodeRow(name, int(node.get("gpus", 0) or 0), str(node.get("gpu_type") or "–"),
                            str(node.get("address") or "–"), len(jobs), slots))
    return rows


@dataclass(frozen=True)
class RoundRow:
    number: int
    time: str
    duration: str
    policy: str
    jobs: int
    changed: int
    objective: str


def round_rows(rounds: Sequence[RoundRecord]) -> list[RoundRow]:
    """The rounds, newest first, with the policy's time in milliseconds and its objective to four
    significant digits (a dash for a policy that keeps none)."""
    return [RoundRow(r.number, clock_text(r.time), f"{r.duration_s * 1000:.1f} ms", r.policy, r.jobs,
                     r.changed, "–" if r.objective is None else f"{r.objective:.4g}")
            for r in reversed(rounds)]
