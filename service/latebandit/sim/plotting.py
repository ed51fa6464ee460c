"""Regret curves as a small PNG: one panel per scenario, mean over runs with a 10–90 % band across runs,
and optional reference points (e.g. a reference's numbers) as crosses in the policy's colour."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from latebandit.figures import new_figure
from latebandit.sim.runner import PolicyResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

BAND = (0.1, 0.9)
MAX_COLUMNS = 4
PANEL_INCHES = (4.2, 3.2)
DPI = 80  # small files, fit for committing


def _label(ax: Axes, name: str, ylabel: str) -> None:
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("round t", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def plot_panels(
    panels: Sequence[tuple[str, Sequence[PolicyResult]]],
    path: Path,
    title: str | None = None,
    markers: Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]] | None = None,
    ratio_to: str | None = None,
) -> None:
    """Write the figure to ``path``. ``markers[panel][label]`` = (rounds, values) drawn as crosses.
    ``ratio_to``: a second row of panels with each policy's mean regret over that policy's, as Pike-Burke
    2018 plots them."""
    columns = min(MAX_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns) * (2 if ratio_to else 1)
    heading = textwrap.wrap(title + ("   (× = reference)" if markers else ""), 50 * columns) if title else []
    figure = new_figure((PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows + 0.25 * len(heading)))
    axes = figure.subplots(rows, columns, squeeze=False)
    used = []
    for ax, (name, results) in zip(axes.flat, panels, strict=False):
        used.append(ax)
        for result in results:
            low, high = np.quantile(result.regret, BAND, axis=1)
            (line,) = ax.plot(result.rounds, result.regret.mean(axis=1), label=result.label, linewidth=1.4)
            ax.fill_between(result.rounds, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            reference = (markers or {}).get(name, {}).get(result.label)
            if reference is not None:
                ax.plot(*reference, linestyle="none", marker="x", color=line.get_color(), markersize=6)
        _label(ax, name, "pseudo-regret (mean, 10–90 % band)")
    if ratio_to:
        for ax, (name, results) in zip(list(axes.flat)[axes.size // 2 :], panels, strict=False):
            used.append(ax)
            base = next(result for result in results if result.label == ratio_to).regret.mean(axis=1)
            for result in results:
                if result.label != ratio_to:
                    ratio = result.regret.mean(axis=1) / np.where(base > 0, base, np.nan)
                    ax.plot(result.rounds, ratio, label=f"{result.label} / {ratio_to}", linewidth=1.4)
            _label(ax, name, f"mean regret / mean regret of {ratio_to}")
    for ax in axes.flat:
        ax.set_visible(any(ax is other for other in used))
    if heading:
        figure.suptitle("\n".join(heading), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
