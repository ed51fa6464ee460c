"""Figures for the CLI's plots (simulations, reproductions, backtests), made without pyplot's global state.

matplotlib is the ``plots`` extra: an API worker (and its image) does not need it. Without it, asking for a
plot is a clear ValueError, which the CLI prints on one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(size: tuple[float, float]) -> Figure:
    """A matplotlib figure on the Agg canvas, ``size`` in inches."""
    try:
        from matplotlib.figure import Figure
    except ImportError as missing:
        raise ValueError("plots need matplotlib: pip install 'latebandit[plots]'") from missing
    return Figure(figsize=size)
