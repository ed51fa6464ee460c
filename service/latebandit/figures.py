"""Figures for the CLI's plots (simulations, reproductions, backtests), made without pyplot's global state.

matplotlib is the ``plots`` extra: an API worker (and its image) does not need it. Without it, asking for a
plot is a clear ValueError, which the CLI prints on one line, before it runs anything (``require_plots``):
a simulation of an hour must not end in "install matplotlib".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


MISSING = "plots need matplotlib: pip install 'latebandit[plots]'"


def require_plots() -> None:
    """ValueError (MISSING) unless matplotlib can be imported."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as missing:
        raise ValueError(MISSING) from missing


def new_figure(size: tuple[float, float]) -> Figure:
    """A matplotlib figure on the Agg canvas, ``size`` in inches."""
    require_plots()
    from matplotlib.figure import Figure

    return Figure(figsize=size)
