"""Consoles: data on stdout, progress, warnings and errors on stderr (so JSON stays parseable)."""

import os
import sys

from rich.console import Console

from jbkv_cli.distributed import rank_tag

# Tables are wide: when stdout is not a terminal (pipes, CI logs), don't squeeze them into 80 cols.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
# Errors have their own console: muting a rank's output (below) must never hide its error.
_errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def error(message: str) -> None:
    """One line on stderr; inside a torchrun job it names the rank (``rank 1/4: …``)."""
    _errors.print(
        f"[bold red]error:[/bold red] {rank_tag()}{message}", highlight=False, soft_wrap=True
    )


def mute() -> None:
    """Send ``out`` and ``err`` to /dev/null: under torchrun only rank 0 prints tables,
    summaries, warnings and progress; every rank still prints its own one-line error."""
    sink = open(os.devnull, "w")  # noqa: SIM115 (open for the life of the process)
    out.file = sink
    err.file = sink
