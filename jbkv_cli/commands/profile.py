"""``jbkv profile-heads``: Forcing-KV's offline head profiling for a model and prompt set."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from jbkv_cli.atomic import write_text_atomic
from jbkv_cli.commands.experiment import NO_LAYOUT, _load, _model_options, _prompt_items
from jbkv_cli.commands.options import (
    DeviceOpt,
    ModelOptionOpt,
    NumChunksOpt,
    PromptOpt,
    PromptsOpt,
    SeedsOpt,
    StepsOpt,
    WeightsOpt,
    WindowOpt,
    parse_seeds,
)
from jbkv_cli.console import err, out
from jbkv_cli.errors import JbkvError, UsageError
from jbkv_cli.models.base import PrunableModel
from jbkv_cli.models.registry import DEFAULT_MODEL, MODELS
from jbkv_cli.outputs import check_output_file
from jbkv_cli.prune.profile import (
    DEFAULT_ANCHOR_FRAMES,
    DEFAULT_THRESHOLD,
    FrameMassProbe,
    profile_document,
    summarize,
)


def profile_heads(
    out_path: Annotated[Path, typer.Option("--out", help="The profile to write (JSON).")],
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model: {', '.join(MODELS)}.")
    ] = DEFAULT_MODEL,
    anchor_frames: Annotated[
        int,
        typer.Option(
            "--anchor-frames",
            min=1,
            help="Most recent cached frames counted as local (the transition anchors).",
        ),
    ] = DEFAULT_ANCHOR_FRAMES,
    threshold: Annotated[
        float,
        typer.Option(help="Static when the local attention mass is at least this (0..1)."),
    ] = DEFAULT_THRESHOLD,
    prompts: PromptsOpt = None,
    prompt: PromptOpt = None,
    seeds: SeedsOpt = None,
    weights: WeightsOpt = None,
    num_chunks: NumChunksOpt = None,
    steps: StepsOpt = None,
    window: WindowOpt = None,
    device: DeviceOpt = None,
    model_option: ModelOptionOpt = None,
) -> None:
    """Profile attention heads for Forcing-KV: frame-level attention mass with a full-precision
    cache, static/dynamic per (layer, KV head), written as the JSON `-M forcing-kv.profile=`
    reads."""
    if not math.isfinite(threshold) or not 0.0 <= threshold <= 1.0:
        raise UsageError(f"--threshold must be in [0, 1], got {threshold}")
    if model not in MODELS:
        raise UsageError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")
    check_output_file(out_path, "--out")
    items = _prompt_items(model, prompts, prompt, parse_seeds(seeds))
    flags = (weights, num_chunks, steps, window, device, model_option)
    m = _load(model, _model_options(model, *flags))
    if not isinstance(m, PrunableModel):
        raise UsageError(f"profile-heads cannot profile model {model!r}: {NO_LAYOUT}")
    layout = m.head_layout()
    probe = FrameMassProbe(layout["frame_tokens"])
    for text, seed_list in items:
        for seed in seed_list:
            m.profile_heads(text, seed, probe)
    try:
        measured = summarize(probe, layout["layers"], layout["kv_heads"], anchor_frames, threshold)
    except ValueError as exc:
        raise JbkvError(f"profile-heads on {model}: {exc}") from None
    command = _command(model, anchor_frames, threshold, prompts, prompt, seeds, flags, out_path)
    doc = profile_document(model, m.settings, probe, measured, command)
    write_text_atomic(out_path, json.dumps(doc, indent=2) + "\n")
    _print(doc)
    err.print(f"wrote {out_path}", highlight=False)


def _command(model, anchor, threshold, prompts, prompt, seeds, flags, out_path) -> str:
    """The command line that makes this profile again (options as given)."""
    args = ["jbkv", "profile-heads", "--model", model, "--anchor-frames", str(anchor)]
    args += ["--threshold", f"{threshold:g}"]
    args += ["--prompts", prompts] if prompts else []
    for p in prompt or []:
        args += ["--prompt", p]
    args += ["--seeds", seeds] if seeds else []
    names = ("--weights", "--num-chunks", "--steps", "--window", "--device")
    for name, value in zip(names, flags[:5], strict=True):
        args += [name, str(value)] if value is not None else []
    for item in flags[5] or []:
        args += ["-o", item]
    return shlex.join([*args, "--out", str(out_path)])


def _print(doc: dict) -> None:
    table = Table(
        title=f"{doc['model']} heads · local mass = current chunk + {doc['anchor_frames']} "
        f"anchor frame(s) · static when ≥ {doc['threshold']:g}",
        title_justify="left",
    )
    for col in ("layer", "KV head", "class", "local mass", "mass by recency (1st, 2nd, …)"):
        table.add_column(col, justify="left" if col in ("class",) else "right")
    for i, layer in enumerate(doc["layers"]):
        for h, kind in enumerate(layer["heads"]):
            frames = layer["frame_mass"][h] if h < len(layer["frame_mass"]) else []
            table.add_row(
                str(i),
                str(h),
                kind,
                f"{layer['local_mass'][h]:.3f}",
                " ".join(f"{x:.2f}" for x in frames),
            )
    out.print(table)
    stab = doc["stability"]
    counts = doc["counts"]
    out.print(
        f"{counts['static']} static, {counts['dynamic']} dynamic; agreement with the overall "
        f"classes: per (prompt, seed) {stab['samples']['agreement']:.3f} "
        f"(worst {stab['samples']['worst']:.3f}, {stab['samples']['groups']} samples), per "
        f"denoising step {stab['steps']['agreement']:.3f} (worst {stab['steps']['worst']:.3f}); "
        f"closest head to the threshold: {doc['min_margin']:.3f}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("profile-heads")(profile_heads)


__all__ = ["profile_heads", "register"]
