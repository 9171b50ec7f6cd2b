"""The live progress of ``pollux hpo run``: a rich live view on a terminal, plain lines elsewhere.

On a terminal, a status line (trials complete, pruned, failed and running of N, the best so far) and
a table of the running trials (job, its state, GPUs, restarts, the last step and value reported,
time, parameters), redrawn as the driver ticks; the driver's events (a trial started, adopted,
pruned, finished or failed) scroll above it. Anywhere else (a pipe, a file, a test) only the events,
one line each with the time since the start, so a log of the run reads in order.

The display writes what it is given; text that came from the service (job ids, failure reasons) is
escaped by the ``escape`` function the caller passes (the CLI's :func:`pollux.cli.formatting.escape`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pollux.hpo.progress import StudySnapshot
from pollux.hpo.summary import format_params

__all__ = ["StudyDisplay", "status_text"]

#: Redraws per second of the live view (the driver ticks about once a second).
REFRESH_PER_S = 4


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(max(0, int(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def status_text(snapshot: StudySnapshot) -> str:
    """One line, e.g. ``study s: 3/8 finished (2 complete, 1 pruned, 0 failed), 2 running; best 0.97
    (trial 1)``."""
    c = snapshot.counts
    finished = c.complete + c.pruned + c.failed
    line = (f"study {snapshot.study}: {finished}/{snapshot.target} finished ({c.complete} complete, "
            f"{c.pruned} pruned, {c.failed} failed), {c.running} running")
    if c.requeued:
        line += f", {c.requeued} requeued"
    if snapshot.best_number is not None:
        line += f"; best {_num(snapshot.best_value)} (trial {snapshot.best_number})"
    return line


class StudyDisplay:
    """An :class:`~pollux.hpo.progress.Observer` drawing to ``console`` (see the module docstring).

    ``terminal`` chooses the live view; ``escape`` makes service text safe to print. Use it as a
    context manager (or call :meth:`start` and :meth:`stop`): the live view must be closed so the
    terminal gets its cursor back, also after Ctrl-C.
    """

    def __init__(self, stream: IO[str], *, terminal: bool, escape: Callable[[str], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._terminal = terminal
        self._escape = escape
        self._clock = clock
        self._t0 = clock()
        if terminal:
            self._console = Console(file=stream, force_terminal=True, markup=False, emoji=False,
                                    highlight=False)
        else:
            self._console = Console(file=stream, force_terminal=False, color_system=None, no_color=True,
                                    markup=False, emoji=False, highlight=False, width=1_000_000)
        self._live: Live | None = None
        self._last: StudySnapshot | None = None

    def __enter__(self) -> StudyDisplay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._terminal and self._live is None:
            self._live = Live(Text("starting the study ..."), console=self._console,
                              refresh_per_second=REFRESH_PER_S, transient=True)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._last is not None:
            self._console.print(Text(self._escape(status_text(self._last))))

    def event(self, message: str) -> None:
        text = self._escape(message)
        if self._terminal:
            self._console.print(Text(text))
        else:
            self._console.print(Text(f"[{self._clock() - self._t0:7.1f}s] {text}"))

    def update(self, snapshot: StudySnapshot) -> None:
        self._last = snapshot
        if self._live is not None:
            self._live.update(self.renderable(snapshot))

    def renderable(self, snapshot: StudySnapshot) -> Group:
        """The live view: the status line and the table of running trials."""
        table = Table(box=None, pad_edge=False, header_style="bold")
        for header in ("TRIAL", "JOB", "STATE", "GPUS", "RESTARTS", "STEP", "VALUE", "TIME", "PARAMS"):
            table.add_column(header, justify="right" if header in ("TRIAL", "GPUS", "RESTARTS", "STEP")
                             else "left", no_wrap=header != "PARAMS")
        for view in snapshot.running:
            table.add_row(str(view.number), self._escape(view.job_id), self._escape(view.job_state),
                          str(view.gpus), str(view.restarts),
                          "-" if view.last_step is None else str(view.last_step), _num(view.last_value),
                          _clock(view.seconds), self._escape(format_params(view.params)))
        status = Text(self._escape(status_text(snapshot)), style="bold")
        return Group(status, table) if snapshot.running else Group(status)
