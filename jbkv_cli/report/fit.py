"""Tables that fit the terminal: the richest layout whose natural width fits, never a cut cell.

A layout is whatever a table builder takes (which columns, how compact the cells); the builders
set ``no_wrap`` on every column, so a layout either fits the console or is passed over. When none
fits, the last (most compact) is printed at its natural width and the terminal wraps the lines:
wider than the screen, but every name and number whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

Layout = TypeVar("Layout")


def natural_width(console: Console, table: Table) -> int:
    """The width ``table`` needs to show every cell on one line."""
    return Measurement.get(console, console.options.update(width=10_000), table).maximum


def fit(
    console: Console, build: Callable[[Layout], Table], layouts: Sequence[Layout]
) -> tuple[Table, int]:
    """The table of the first layout that fits ``console.width``, and the width to print it at."""
    table = build(layouts[0])
    for layout in layouts:
        table = build(layout)
        need = natural_width(console, table)
        if need <= console.width:
            return table, console.width
    return table, max(need, console.width)


def print_fitted(
    console: Console, build: Callable[[Layout], Table], layouts: Sequence[Layout]
) -> Table:
    """:func:`fit`, then print; returns the table printed."""
    table, width = fit(console, build, layouts)
    saved = console.width
    console.width = width  # wider than the screen only when nothing fits: no cell is cut
    try:
        console.print(table, crop=False)
    finally:
        console.width = saved
    return table
