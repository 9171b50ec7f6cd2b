"""Where the ``pollux`` command meets a reader: tables, progress bars and status lines, through rich.

Whether a stream is a terminal decides how everything here looks, and only that decides it (not
``FORCE_COLOR`` or ``TTY_COMPATIBLE``), so that what a script or a test reads never depends on the
environment:

* on a terminal, tables are rich's tables (a bold header, box lines; never squeezed, so a terminal
  narrower than a table wraps its lines as it would plain text), long commands draw a progress bar
  on stderr, and ``pollux logs -f`` keeps a status line with the job's state under the logs;
* anywhere else (a pipe, a file, a test's captured stream) a table is plain aligned columns two
  spaces apart, with no colour, no box characters and no wrapping of long cells, so ``grep``,
  ``cut`` and ``awk`` keep working; progress stays the plain lines each command printed before, and
  a status line is not drawn at all.

Nothing here escapes text: callers pass what is safe to print (:mod:`pollux.cli.formatting`).
``--json`` output never passes through here.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO

from rich.console import Console, RenderableType
from rich.live import Live
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

__all__ = ["ProgressBar", "StatusLine", "is_terminal", "make_console", "render", "render_table"]

#: Width a plain console lays out to: wider than any table row, so a long cell is never wrapped.
PLAIN_WIDTH = 1_000_000
#: How often a status line's spinner turns while :meth:`StatusLine.wait` waits, in seconds.
SPIN_STEP_S = 0.125


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream counts as not one)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def make_console(stream: IO[str], terminal: bool | None = None) -> Console:
    """A rich console writing to ``stream``.

    ``terminal`` (default: whether ``stream`` is one) chooses between a terminal console, with its
    width and colours, and a plain one: no colour, no control codes, and so wide that nothing wraps.
    Either way markup, emoji codes and highlighting are off: text is printed as it is given.
    """
    if terminal is None:
        terminal = is_terminal(stream)
    if terminal:
        return Console(file=stream, force_terminal=True, markup=False, emoji=False, highlight=False)
    return Console(file=stream, force_terminal=False, force_interactive=False, color_system=None,
                   no_color=True, markup=False, emoji=False, highlight=False, width=PLAIN_WIDTH)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (),
                 terminal: bool = False, stream: IO[str] | None = None) -> str:
    """A table as text: rich's table for a terminal, plain aligned columns otherwise.

    Cells are printed as given (no markup) and never wrapped. Columns in ``right`` are right-aligned,
    their headers too. The plain form puts two spaces between columns and none at either end, and
    drops the trailing spaces of each line, as ``pollux`` always printed its tables. ``stream`` is
    the terminal the text is for (its width; default stdout's).
    """
    cells = [[str(c) for c in row] for row in rows]
    if terminal:
        grid = Table()          # rich's own look
    else:
        grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="")
    for i, name in enumerate(headers):
        grid.add_column(Text(name), justify="right" if i in right else "left", no_wrap=True)
    for row in cells:
        grid.add_row(*(Text(c) for c in row))
    return render(grid, terminal, stream)


def render(renderable: RenderableType, terminal: bool, stream: IO[str] | None = None) -> str:
    """What ``renderable`` prints as, without a final newline; plain lines lose trailing spaces.

    Nothing is squeezed to fit a terminal: one narrower than the text wraps its lines, as it would
    plain text's.
    """
    if terminal:
        console = make_console(stream if stream is not None else sys.stdout, terminal=True)
        wide = console.options.update_width(PLAIN_WIDTH)
        console.width = max(console.width, Measurement.get(console, wide, renderable).maximum)
        with console.capture() as captured:
            console.print(renderable)
        return captured.get().rstrip("\n")
    console = make_console(io.StringIO(), terminal=False)
    with console.capture() as captured:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in captured.get().rstrip("\n").split("\n"))


class ProgressBar:
    """Work done out of a known total, as a rich bar on a terminal (done / total, elapsed, ETA).

    On anything but a terminal it shows nothing: the command's plain progress lines stay as they
    were. Use it as a context manager; it draws once :meth:`start` is called (on entering, unless
    ``lazy``: a command that forks worker processes starts it after they exist, so that the bar's
    refresh thread is never copied into a child mid-write).
    """

    def __init__(self, description: str, total: int, stream: IO[str], terminal: bool | None = None,
                 lazy: bool = False) -> None:
        self.shown = is_terminal(stream) if terminal is None else terminal
        self.lazy = lazy
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.shown:
            console = make_console(stream, terminal=True)
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
                                      TimeRemainingColumn(), console=console, redirect_stdout=False,
                                      redirect_stderr=True)
            self._task = self._progress.add_task(description, total=total, start=False)

    def __enter__(self) -> ProgressBar:
        if not self.lazy:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self) -> None:
        """Draw the bar (once) and start its clock."""
        if self._progress is not None and self._task is not None and not self._progress.live.is_started:
            self._progress.start_task(self._task)
            self._progress.start()

    def advance(self, amount: float = 1) -> None:
        """``amount`` more done (the total grows if it was an underestimate)."""
        if self._progress is not None and self._task is not None:
            self.update(self._progress.tasks[self._task].completed + amount)

    def update(self, completed: float) -> None:
        """``completed`` done so far; the first call draws the bar (0: the work has started)."""
        if self._progress is not None and self._task is not None:
            self.start()
            total = self._progress.tasks[self._task].total
            self._progress.update(self._task, completed=completed,
                                  total=max(total, completed) if total is not None else None)

    def note(self, line: str) -> None:
        """A line of text above the bar on a terminal; elsewhere nothing (the caller prints its own)."""
        if self._progress is not None:
            self._progress.console.print(Text(line))


class StatusLine:
    """One line on a terminal telling what a long wait is waiting for: a spinner and a short text.

    It is redrawn only from the caller's thread (no refresh thread), so text the caller writes to
    the same screen between two draws cannot be cut by it: :meth:`cleared` takes the line away while
    that text is written, and draws it again below. On anything but a terminal nothing is drawn.
    """

    def __init__(self, stream: IO[str], terminal: bool | None = None, shares_screen: bool = True) -> None:
        self.shown = is_terminal(stream) if terminal is None else terminal
        self.shares_screen = shares_screen
        self._spinner = Spinner("dots", text="")
        self._live: Live | None = None
        if self.shown:
            self._live = Live(self._spinner, console=make_console(stream, terminal=True), auto_refresh=False,
                              transient=True, redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> StatusLine:
        if self._live is not None:
            self._live.start(refresh=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def update(self, text: str) -> None:
        """Say ``text`` (printed as given: escape what came from elsewhere first)."""
        self._spinner.update(text=Text(text))
        self._draw()

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, turning the spinner meanwhile."""
        if self._live is None:
            time.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(SPIN_STEP_S, left))
            self._draw()

    @contextlib.contextmanager
    def cleared(self) -> Iterator[None]:
        """Take the line off the screen while the caller writes to it (when it shares the screen)."""
        if self._live is None or not self.shares_screen or not self._live.is_started:
            yield
            return
        self._live.stop()
        try:
            yield
        finally:
            self._live.start(refresh=True)

    def _draw(self) -> None:
        if self._live is not None and self._live.is_started:
            self._live.refresh()
