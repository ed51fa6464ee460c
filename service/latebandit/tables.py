"""Printing the CLI's tables whole, at any terminal width and when piped.

Rich fits a table to the console (80 columns when output is piped to a file or a CI log) by squeezing its
wrappable columns, which were the name columns: ``latebandit simulate scenario.json | cat`` printed regret
rows with no policy names. A table is printed at its natural width instead (a terminal narrower than that
wraps the lines, nothing is dropped), and a name column never wraps.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def show(table: Table) -> None:
    """Print ``table`` to standard output, every column at its full width."""
    console = Console()
    natural = console.measure(table, options=console.options.update(width=10_000)).maximum
    Console(width=max(console.width, natural)).print(table)
