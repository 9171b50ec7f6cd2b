"""PNG figures of a rework sweep, like the thesis's Figs. 5.7 and 5.9 (matplotlib, imported lazily).

* ``recovery.png`` (Fig. 5.7): per model, mean rework of full and partial recovery against the
  fraction of parameters lost, with 95 % confidence intervals; the reduction is printed on each bar.
* ``strategies.png`` (Fig. 5.9): per model, mean rework after losing half the parameters against the
  checkpoint frequency 1/r (saving r of the blocks 1/r times as often) for the priority, round-robin
  and random strategies, with the traditional checkpoint + full recovery as a dashed line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

LOST_KEYS = ("1/4", "1/2", "3/4")
FRACTION_KEYS = ("1", "1/2", "1/4", "1/8")


def _grid(n: int) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    cols = 2 if n == 4 else min(n, 3)
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), dpi=110)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    return fig, axes


def recovery_figure(sweeps: Sequence[dict[str, Any]]) -> Any:
    fig, axes = _grid(len(sweeps))
    width = 0.38
    x = np.arange(len(LOST_KEYS))
    for ax, sw in zip(axes, sweeps, strict=True):
        entry = sw["layouts"][next(iter(sw["layouts"]))]
        full = entry["full"]
        part = [entry["partial"][k] for k in LOST_KEYS]
        ax.bar(x - width / 2, [full["mean"]] * len(x), width, yerr=[full["ci95"]] * len(x),
               label="full recovery", color="#b0b0b0", capsize=3)
        bars = ax.bar(x + width / 2, [p["mean"] for p in part], width, yerr=[p["ci95"] for p in part],
                      label="partial recovery", color="#3b75af", capsize=3)
        for bar, k, pt in zip(bars, LOST_KEYS, part, strict=True):
            ax.annotate(f"−{100 * entry['reduction'][k]:.0f} %",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height() + pt["ci95"]),
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(x, LOST_KEYS)
        ax.set_xlabel("fraction of parameters lost")
        ax.set_ylabel("rework (iterations)")
        ax.set_title(sw["model"])
        ax.set_ylim(0, 1.25 * (full["mean"] + full["ci95"]))
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8, ncols=2)
    fig.suptitle("Partial vs full recovery (traditional checkpoints)")
    fig.tight_layout()
    return fig


def strategies_figure(sweeps: Sequence[dict[str, Any]]) -> Any:
    fig, axes = _grid(len(sweeps))
    x = np.array([1, 2, 4, 8])
    styles = {"priority": ("#c0392b", "o"), "round": ("#2c7fb8", "s"), "random": ("#7f7f7f", "^")}
    for ax, sw in zip(axes, sweeps, strict=True):
        entry = sw["layouts"][next(iter(sw["layouts"]))]
        for name, (color, marker) in styles.items():
            pts = [entry["strategies"][name][k] for k in FRACTION_KEYS]
            ax.errorbar(x, [p["mean"] for p in pts], yerr=[p["ci95"] for p in pts], color=color,
                        marker=marker, capsize=3, label=name)
        ax.axhline(entry["full"]["mean"], color="black", linestyle="--", linewidth=1,
                   label="traditional + full recovery")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, ["1", "2", "4", "8"])
        ax.set_xlabel("checkpoint frequency 1/r (saving r each time)")
        ax.set_ylabel("rework (iterations), 1/2 lost")
        ax.set_title(sw["model"])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Partial checkpoint strategies with partial recovery")
    fig.tight_layout()
    return fig


def write_plots(sweeps: Sequence[dict[str, Any]], out_dir: Path | str) -> list[Path]:
    """Write ``recovery.png`` and ``strategies.png`` for `sweeps` into `out_dir` (created)."""
    if not sweeps:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in (("recovery.png", recovery_figure), ("strategies.png", strategies_figure)):
        path = out / name
        make(sweeps).savefig(path)
        paths.append(path)
    return paths
