"""Printing rich tables so that piped output (CI logs) keeps every column.

On a terminal rich fits a table to the window. Elsewhere the console width is a guess (80 columns), and
rich would shrink the table to it, cutting headers and numbers to ``Q…``; ``print_table`` prints it at
its natural width instead.
"""

from __future__ import annotations


def print_table(console, table) -> None:
    """Print ``table`` on ``console``: fitted on a terminal, at full width when not a terminal."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    need = Measurement.get(console, console.options.update_width(10_000), table).maximum
    if need <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = need  # rich caps print(width=) at the console's width
    try:
        console.print(table)
    finally:
        console.width = width
