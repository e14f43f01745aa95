"""Consoles: data on stdout, progress, warnings and errors on stderr (so JSON stays parseable)."""

import sys

from rich.console import Console

# Tables are wide: when stdout is not a terminal (pipes, CI logs), don't squeeze them into 80 cols.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def error(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
