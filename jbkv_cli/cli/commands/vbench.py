"""``jbkv vbench setup | status | run``: VBench(-Long) in its own environment."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from jbkv_cli.cli.options import choices
from jbkv_cli.metrics.vbench_env import default_root, locate_env, setup_env
from jbkv_cli.metrics.vbench_job import DEVICES, VBenchOutcome, VBenchRequest, run_vbench
from jbkv_cli.metrics.vbench_run import MODES
from jbkv_cli.metrics.vbench_scores import DIMENSIONS
from jbkv_cli.metrics.vbench_weights import EXTRA_PACKAGES, weights_status
from jbkv_cli.utils.console import err, out, plain, visible, warn
from jbkv_cli.utils.progress import Progress, counting_columns

Mode = choices("Mode", MODES)
Device = choices("Device", DEVICES)

vbench_app = typer.Typer(
    name="vbench",
    help="Score videos with VBench / VBench-Long, run in its own cached environment.",
    no_args_is_help=True,
)


def print_weights(long_mode: bool = True, detectron2: bool | None = None) -> None:
    """A table of ready / missing dimensions, then each missing file and where it comes from."""
    table = Table(title=f"VBench weights ({'long' if long_mode else 'short'} mode)")
    table.add_column("dimension")
    table.add_column("status")
    lines: list[str] = []
    for dim, missing in weights_status(DIMENSIONS, long_mode).items():
        pkgs = [p for p in EXTRA_PACKAGES.get(dim, ()) if detectron2 is False]
        if not missing and not pkgs:
            table.add_row(plain(dim), plain("ready", "green"))
            continue
        parts = [f"{len(missing)} file(s) missing"] if missing else []
        parts += [f"package {p} missing (not on PyPI)" for p in pkgs]
        table.add_row(plain(dim), plain("; ".join(parts), "red"))
        lines += [f"{dim}: {m.path}  <- {m.source}" for m in missing]
    out.print(table)
    if lines:
        out.print("Missing files (jbkv never downloads; put each file at the path shown):")
        for line in dict.fromkeys(lines):
            out.print("  " + line, soft_wrap=True, highlight=False)


@vbench_app.command("setup")
def setup_command(
    root: Annotated[
        Path | None, typer.Option("--root", help="Cache folder (default $JBKV_VBENCH_ENV).")
    ] = None,
    python: Annotated[
        str | None, typer.Option("--python", help="Interpreter for the env (default: jbkv's).")
    ] = None,
    install_torch: Annotated[
        bool, typer.Option("--install-torch", help="Install torch into the env, don't link it.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if cached.")] = False,
) -> None:
    """Build (once) the VBench environment and list which dimensions have their weights."""
    t0 = time.perf_counter()
    with err.status("setting up the VBench environment") as status:
        env, built = setup_env(
            root,
            python,
            reuse_torch=not install_torch,
            log=lambda m: status.update(plain(m[:120])),
            force=force,
        )
    seconds = time.perf_counter() - t0
    versions = env.info.get("check", {}).get("versions", {})
    what = "built" if built else "already built"
    out.print(f"VBench environment {what} in {seconds:.1f} s: {env.path}")
    out.print(", ".join(f"{k} {v}" for k, v in versions.items() if v), highlight=False)
    detectron2 = env.info.get("check", {}).get("optional", {}).get("detectron2")
    print_weights(True, detectron2)


@vbench_app.command("status")
def status_command(
    root: Annotated[Path | None, typer.Option("--root", help="Cache folder.")] = None,
) -> None:
    """Say whether the environment is built and which dimensions have their weights."""
    env = locate_env(root)
    if env is None:
        out.print(f"VBench environment: not set up in {root or default_root()}")
        detectron2 = None
    else:
        problems = env.problems()
        state = plain("ready", "green") if not problems else plain(problems[0], "red")
        out.print(plain(f"VBench environment: {env.path} ") + state)
        detectron2 = env.info.get("check", {}).get("optional", {}).get("detectron2")
    print_weights(True, detectron2)


@vbench_app.command("run")
def run_command(
    path: Annotated[Path, typer.Argument(help="Run directory (RUN/videos/<variant>/) or mp4s.")],
    dimensions: Annotated[
        list[str] | None,
        typer.Option(
            "--dimensions",
            "-d",
            help="Comma-separated; 'all' or 'custom'. Default: custom dims, or all 16 in "
            "*_vbench_standard modes.",
        ),
    ] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="VBench's mode.")] = Mode.long_custom_input,
    device: Annotated[Device, typer.Option("--device", help="Where VBench runs.")] = Device.auto,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Where metrics go (default PATH/metrics).")
    ] = None,
    skip_missing: Annotated[
        bool, typer.Option("--skip-missing", help="Leave out dimensions without weights.")
    ] = False,
    static_filter: Annotated[
        bool,
        typer.Option("--static-filter", help="Official temporal_flickering filter (RAFT, CUDA)."),
    ] = False,
    dev_flag: Annotated[
        bool,
        typer.Option("--dev-flag/--no-dev-flag", help="VBench-Long's clip-to-clip settings."),
    ] = True,
    force: Annotated[bool, typer.Option("--force", help="Recompute cached results.")] = False,
    root: Annotated[Path | None, typer.Option("--root", help="VBench env cache folder.")] = None,
) -> None:
    """Evaluate every variant's videos with VBench; write metrics/vbench.json and print a table."""
    request = VBenchRequest(
        path=path,
        dimensions=tuple(dimensions or ()),
        mode=mode.value,
        device=device.value,
        out=out_dir,
        skip_missing=skip_missing,
        static_filter=static_filter,
        dev_flag=dev_flag,
        force=force,
        root=root,
    )
    run_and_print(request)


def run_and_print(request: VBenchRequest) -> VBenchOutcome:
    """:func:`~jbkv_cli.metrics.vbench_job.run_vbench` with a progress bar per variant, then
    the table; a failed dimension is one error line (exit 1) after it. The bars start with the
    first dimension, so a refusal before it is one line on stderr and nothing else."""
    progress = Progress(*counting_columns())
    tasks: dict[str, Any] = {}

    def on_event(variant: str, kind: str, event: dict[str, Any]) -> None:
        if not tasks:
            progress.start()
        if variant not in tasks:
            tasks[variant] = progress.add_task(visible(variant), total=event["total"])
        task = tasks[variant]
        dim = event.get("dimension", "")
        if kind == "start":
            progress.update(task, description=visible(f"{variant}: {dim}"))
        elif kind in ("done", "cached"):
            progress.advance(task)
        elif kind == "error":
            progress.advance(task)
            warn(f"{variant}: {dim} failed: {event.get('message', '')}")

    try:
        outcome = run_vbench(request, on_event)
    finally:
        if tasks:
            progress.stop()
    from jbkv_cli.report.table import print_vbench_table, vbench_variants

    print_vbench_table(out, list(vbench_variants(outcome.doc).items()))
    out.print(f"wrote {outcome.summary_path}")
    outcome.check()
    return outcome


def register(app: typer.Typer) -> None:
    """Add the ``vbench`` command group to jbkv's app."""
    app.add_typer(vbench_app, name="vbench")
