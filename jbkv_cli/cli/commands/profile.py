"""``jbkv profile-heads``: Forcing-KV's offline head profiling for a model and prompt set.

By default upstream's rule (``configs_head/head_profile.py``: static iff the mass on the last 4
key frames over the mass after the sink frame is ≥ 0.8), the profile ``forcing-kv`` reads;
``--rule local-mass`` is jbkv's earlier rule, the one ``forcing-kv-history``'s shipped profile
was made with (:mod:`jbkv_cli.prune.profile`)."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from jbkv_cli.cli import names
from jbkv_cli.cli.commands.experiment import NO_LAYOUT
from jbkv_cli.cli.groups import Inputs, ModelFlags, check_model, load, model_paths, with_groups
from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.models.registry import DEFAULT_MODEL, MODELS
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.console import err, out
from jbkv_cli.utils.errors import JbkvError, UsageError, shown

if TYPE_CHECKING:  # torch: imported once the options are checked
    from jbkv_cli.prune.profile import Rule


@with_groups
def profile_heads(
    out_path: Annotated[Path, typer.Option("--out", help="The profile to write (JSON).")],
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model: {', '.join(MODELS)}.")
    ] = DEFAULT_MODEL,
    rule: Annotated[
        str,
        typer.Option(
            help=f"Classification: {' or '.join(names.PROFILE_RULES)} (upstream's "
            "head_profile.py; jbkv's earlier rule, for forcing-kv-history)."
        ),
    ] = names.PROFILE_DEFAULT_RULE,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Static when the score is at least this (0..1; default: "
            + ", ".join(f"{k} {v:g}" for k, v in names.PROFILE_THRESHOLDS.items())
            + ")."
        ),
    ] = None,
    last_frames: Annotated[
        int | None,
        typer.Option(
            "--last-frames",
            min=1,
            help="forcing-kv rule: key frames counted as local, the newest "
            f"({names.PROFILE_LAST_FRAMES}).",
        ),
    ] = None,
    skip_frames: Annotated[
        int | None,
        typer.Option(
            "--skip-frames",
            min=0,
            help="forcing-kv rule: first key frames left out of the denominator "
            f"({names.PROFILE_SKIP_FRAMES}).",
        ),
    ] = None,
    anchor_frames: Annotated[
        int | None,
        typer.Option(
            "--anchor-frames",
            min=1,
            help="local-mass rule: most recent cached frames counted as local "
            f"({names.PROFILE_ANCHOR_FRAMES}).",
        ),
    ] = None,
    inputs: Inputs = Inputs(),
    flags: ModelFlags = ModelFlags(),
) -> None:
    """Profile attention heads for Forcing-KV: frame-level attention mass with a full-precision
    cache, static/dynamic per (layer, KV head), written as the JSON `-M forcing-kv.profile=`
    reads (`--rule local-mass`: what `-M forcing-kv-history.profile=` was made for)."""
    chosen = _rule(rule, threshold, last_frames, skip_frames, anchor_frames)
    check_model(model)
    options = flags.options(model)
    items = inputs.items(model, options)  # --cases: image + actions models (matrix-game-2)
    reads = [*inputs.paths(model, items), *model_paths(model, options)]
    check_output_file(out_path, "--out", inputs=reads)  # not over a run, nor over an input
    from jbkv_cli.models.contract import PrunableModel
    from jbkv_cli.prune.profile import FrameMassProbe, profile_document, summarize

    m = load(model, options)
    if not isinstance(m, PrunableModel):
        raise UsageError(f"profile-heads cannot profile model {model!r}: {NO_LAYOUT}")
    takes_cases = m.profiles_cases
    for case, _ in items:
        if not case.prompt_only and not takes_cases:
            raise UsageError(f"profile-heads profiles {model} on prompts only, not on {case.name}")
    layout = m.head_layout()
    probe = FrameMassProbe(layout["frame_tokens"])
    for case, seed_list in items:
        for seed in seed_list:
            m.profile_heads(case if takes_cases else case.prompt, seed, probe)
    try:
        measured = summarize(probe, layout["layers"], layout["kv_heads"], chosen)
    except ValueError as exc:
        raise JbkvError(f"profile-heads on {model}: {exc}") from None
    command = _command(model, chosen, inputs, flags, out_path)
    doc = profile_document(model, m.settings, probe, measured, command)
    write_text_atomic(out_path, json.dumps(doc, indent=2) + "\n")
    _print(doc)
    err.print(f"wrote {out_path}", highlight=False)


def _rule(
    name: str,
    threshold: float | None,
    last: int | None,
    skip: int | None,
    anchor: int | None,
) -> Rule:
    """The :class:`Rule` the options ask for; a usage error for an option of the other rule."""
    if name not in names.PROFILE_RULES:
        raise UsageError(
            f"--rule must be one of {', '.join(names.PROFILE_RULES)}, got {shown(name)}"
        )
    if threshold is not None and (not math.isfinite(threshold) or not 0.0 <= threshold <= 1.0):
        raise UsageError(f"--threshold must be in [0, 1], got {threshold}")
    other = {"--last-frames": last, "--skip-frames": skip}
    if name == "forcing-kv":
        other = {"--anchor-frames": anchor}
    for flag, value in other.items():
        if value is not None:
            raise UsageError(f"{flag} does not go with --rule {name}")
    from jbkv_cli.prune.profile import DEFAULT_ANCHOR_FRAMES, LAST_FRAMES, SKIP_FRAMES, Rule

    return Rule(
        name,
        threshold,
        LAST_FRAMES if last is None else last,
        SKIP_FRAMES if skip is None else skip,
        DEFAULT_ANCHOR_FRAMES if anchor is None else anchor,
    )


def _command(model: str, rule: Rule, inputs: Inputs, flags: ModelFlags, out_path: Path) -> str:
    """The command line that makes this profile again (options resolved)."""
    args = ["jbkv", "profile-heads", "--model", model, "--rule", rule.name]
    if rule.name == "local-mass":
        args += ["--anchor-frames", str(rule.anchor_frames)]
    else:
        args += ["--last-frames", str(rule.last_frames), "--skip-frames", str(rule.skip_frames)]
    args += ["--threshold", f"{rule.threshold:g}", *inputs.argv(), *flags.argv()]
    return shlex.join([*args, "--out", str(out_path)])


def _print(doc: dict) -> None:
    if doc["rule"] == "local-mass":
        what = f"local mass = current chunk + {doc['anchor_frames']} anchor frame(s)"
    else:
        what = (
            f"score = mass on the last {doc['last_frames']} key frames / mass after the first "
            f"{doc['skip_frames']}"
        )
    table = Table(
        title=f"{doc['model']} heads · {what} · static when ≥ {doc['threshold']:g}",
        title_justify="left",
    )
    for col in ("layer", "KV head", "class", "score", "mass by recency (1st, 2nd, …)"):
        table.add_column(col, justify="left" if col in ("class",) else "right")
    for i, layer in enumerate(doc["layers"]):
        for h, kind in enumerate(layer["heads"]):
            frames = layer["frame_mass"][h] if h < len(layer["frame_mass"]) else []
            table.add_row(
                str(i),
                str(h),
                kind,
                f"{layer['score'][h]:.3f}",
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
