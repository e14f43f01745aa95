"""Consoles: data on stdout, progress, warnings and errors on stderr (so JSON stays parseable)."""

from rich.console import Console

out = Console()
err = Console(stderr=True)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def error(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
