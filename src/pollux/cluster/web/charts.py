"""Charts of a job over time, drawn on the server as SVG: no script, nothing fetched, and every point
readable in the page (``<svg data-series=NAME>`` holding one ``<circle data-t=TIME data-v=VALUE>`` per
point, the values written exactly as the API writes them), so that a test can compare a chart with
the API's numbers.

:func:`line_chart` turns ``(time, value)`` pairs into a :class:`Chart`: the pixel positions of its
points, the path through them (a step path for a quantity that holds until it changes, such as GPUs)
and a few axis labels. The template only places what is here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Chart", "ChartPoint", "line_chart", "number_text"]

WIDTH = 520
HEIGHT = 170
#: Room for the axis labels: left, right, top, bottom.
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 58, 12, 12, 26


@dataclass(frozen=True)
class ChartPoint:
    """One point: its time and value as data (``t_text``/``v_text``: the shortest text that reads back
    as the same float) and its position in the drawing."""

    t_text: str
    v_text: str
    x: float
    y: float
    label: str


@dataclass(frozen=True)
class Chart:
    """A drawn series: its name (``data-series``), title, unit, points, path and axis labels."""

    series: str
    title: str
    unit: str
    points: list[ChartPoint]
    path: str
    y_labels: list[tuple[float, str]]
    x_labels: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def empty(self) -> bool:
        return not self.points


def number_text(value: float) -> str:
    """A value for people: three significant digits, thousands spelt k/M."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def line_chart(series: str, title: str, unit: str, data: Sequence[tuple[float, float | None]], *,
               step: bool = False) -> Chart:
    """The chart of ``data`` (``(time, value)``, oldest first; a None value is left out). ``step``
    draws each value held until the next (a step path) instead of straight lines between points."""
    pairs = [(float(t), float(v)) for t, v in data
             if v is not None and math.isfinite(float(v)) and math.isfinite(float(t))]
    if not pairs:
        return Chart(series, title, unit, [], "", [], [])
    t0 = min(t for t, _ in pairs)
    t1 = max(t for t, _ in pairs)
    top = max(v for _, v in pairs)
    bottom = min(0.0, min(v for _, v in pairs))
    if top <= bottom:
        top = bottom + 1.0
    top += (top - bottom) * 0.08
    inner_w = WIDTH - PAD_LEFT - PAD_RIGHT
    inner_h = HEIGHT - PAD_TOP - PAD_BOTTOM

    def x_of(t: float) -> float:
        return PAD_LEFT + (inner_w / 2 if t1 == t0 else (t - t0) / (t1 - t0) * inner_w)

    def y_of(v: float) -> float:
        return PAD_TOP + (top - v) / (top - bottom) * inner_h

    points = [ChartPoint(repr(t), repr(v), round(x_of(t), 2), round(y_of(v), 2),
                         f"{_clock(t)}: {number_text(v)}{' ' + unit if unit else ''}") for t, v in pairs]
    moves = [f"M{points[0].x},{points[0].y}"]
    for point in points[1:]:
        if step:
            moves += [f"H{point.x}", f"V{point.y}"]
        else:
            moves.append(f"L{point.x},{point.y}")
    if step:
        moves.append(f"H{PAD_LEFT + inner_w}")
    y_labels = [(round(y_of(v), 2), number_text(v)) for v in (bottom, (bottom + top) / 2, top)]
    x_labels = [(round(x_of(t0), 2), _clock(t0))]
    if t1 > t0:
        x_labels.append((round(x_of(t1), 2), _clock(t1)))
    return Chart(series, title, unit, points, " ".join(moves), y_labels, x_labels)
