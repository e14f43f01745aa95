"""``jbkv weights status`` and ``jbkv weights fetch``: the files jbkv cannot ship, on request."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from jbkv_cli.utils import distributed
from jbkv_cli.utils.console import err, error, out, plain, visible, warn
from jbkv_cli.utils.errors import JbkvError, UsageError
from jbkv_cli.utils.progress import Progress
from jbkv_cli.weights import entry_status, fetch_entry, load_manifest, select
from jbkv_cli.weights.manifest import MIRROR_ENV, WeightEntry, resolve_mirror

weights_app = typer.Typer(
    help="Fetch the weights jbkv cannot ship (LPIPS AlexNet, VBench models); verify them.",
    no_args_is_help=True,
)
_STYLE = {"present": "green", "missing": "yellow", "partial": "yellow", "corrupt": "red"}

MirrorOpt = Annotated[
    str | None,
    typer.Option(
        "--mirror",
        help=f"Read every file from MIRROR/<file name> instead (http, https or file URL; "
        f"default ${MIRROR_ENV}).",
    ),
]


@weights_app.command("status")
def status_command(
    targets: Annotated[
        list[str] | None, typer.Argument(help="lpips, vbench, all (default) or file names.")
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Hash present files (slow for GBs).")
    ] = True,
) -> None:
    """Which weights are present, missing, partial or corrupt, and where each one goes."""
    entries = _select(targets)
    table = Table(title="jbkv weights", title_justify="left")
    for column in ("name", "group", "state", "pinned", "path", "detail"):
        table.add_column(column, overflow="fold", no_wrap=column in ("name", "state"))
    for entry in entries:
        s = entry_status(entry, verify=verify)
        style = _STYLE.get(s.state, "")
        table.add_row(
            *map(plain, (entry.name, entry.group)),
            plain(s.state, style),
            *map(plain, (entry.pinned, s.path, s.detail)),
        )
    out.print(table)


@weights_app.command("fetch")
def fetch_command(
    targets: Annotated[list[str], typer.Argument(help="lpips, vbench, all, or file names.")],
    mirror: MirrorOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Download again even if present and verified.")
    ] = False,
) -> None:
    """Download to the conventional locations: resumable, SHA-256 checked, atomic."""
    _refuse_torchrun()
    entries = _select(targets)
    try:
        base = resolve_mirror(mirror)
    except ValueError as exc:
        raise UsageError(f"--mirror: {exc}") from None
    failures = 0
    for entry in entries:
        state = entry_status(entry)
        if state.state == "present" and not force:
            err.print(f"{entry.name}: present at {state.path} ({state.detail})", highlight=False)
            continue
        if state.state == "corrupt":
            warn(f"{entry.name}: {state.path} is corrupt ({state.detail}); downloading it again")
        try:
            path = _fetch_with_progress(entry, base)
        except JbkvError as exc:
            error(str(exc))
            failures += 1
            continue
        if entry.pinned == "nothing":
            warn(f"{entry.name}: not verified, nothing is pinned ({entry.hash_source})")
        checked = "unverified" if entry.pinned == "nothing" else f"{entry.pinned} checked"
        err.print(plain(entry.name, "green") + plain(f": {path} ({checked})"), highlight=False)
    if failures:
        raise typer.Exit(1)  # each failure already printed its one line


def _fetch_with_progress(entry: WeightEntry, mirror: str | None):
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    # no bar where stderr is not a terminal (logs, pipes): it would only leave blank lines
    with Progress(*columns, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(visible(entry.name), total=entry.size)

        def report(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        return fetch_entry(entry, mirror=mirror, progress=report, warn=warn)


def _refuse_torchrun() -> None:
    """Ranks of one job would stream into the same ``.part``: fetching is one process's job."""
    job = distributed.launch()  # a malformed torchrun environment is a usage error itself
    if job is not None:
        raise UsageError(
            f"weights fetch runs as one process, not under torchrun (WORLD_SIZE="
            f"{job.world_size}); run it once before the job"
        )


def _select(targets: list[str] | None) -> list[WeightEntry]:
    entries = load_manifest()
    try:
        return select(entries, targets or ["all"])
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add the ``weights`` group to ``app``."""
    app.add_typer(weights_app, name="weights")
