"""Options shared by commands, and the parsing of prompts, seeds, lists and model options."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from jbkv_cli.cli import names
from jbkv_cli.models.cases import Case, read_case_file, resolve_input
from jbkv_cli.utils.console import err, plain
from jbkv_cli.utils.device import resolve_device
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import MAX_TEXT_BYTES, read_text
from jbkv_cli.utils.resources import PROMPTS_DIR

PromptsOpt = Annotated[
    str | None,
    typer.Option(
        "--prompts",
        help="A prompt file (one per line, # comments) or a named set in prompts/ (e.g. tiny).",
    ),
]
PromptOpt = Annotated[
    list[str] | None, typer.Option("--prompt", help="A prompt (repeatable); adds to --prompts.")
]
CasesOpt = Annotated[
    Path | None,
    typer.Option(
        "--cases",
        help="A case file (CSV: prompt or caption, and image, pose, id columns) for models that "
        "read an image or a camera trajectory; replaces --prompts/--prompt.",
    ),
]
ImageOpt = Annotated[
    Path | None,
    typer.Option(
        "--image",
        help="A conditioning image for every prompt (image-to-video, e.g. self-forcing's "
        "frame-wise Causal-Forcing configs); one image per prompt: --cases.",
    ),
]
SeedsOpt = Annotated[
    str | None,
    typer.Option("--seeds", help="Seeds: '0,1,2' or '0-3' (default 0; VBench sets: per prompt)."),
]
WeightsOpt = Annotated[
    Path | None, typer.Option("--weights", help="Model weights (file or directory).")
]
NumChunksOpt = Annotated[int | None, typer.Option("--num-chunks", min=1, help="Chunks per video.")]
StepsOpt = Annotated[int | None, typer.Option("--steps", min=1, help="Denoising steps per chunk.")]
WindowOpt = Annotated[
    int | None, typer.Option("--window", min=0, help="Cached chunks each chunk attends to.")
]
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="cpu or cuda (default: cuda when available).")
]
MethodOptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method-option",
        "-M",
        help="Method option METHOD.KEY=VALUE (repeatable), e.g. quarot.seed=1.",
    ),
]
ModelOptionOpt = Annotated[
    list[str] | None,
    typer.Option("--model-option", "-o", help="Model-specific KEY=VALUE (repeatable)."),
]


MAX_SEEDS = 10_000
CLI_CORRECTIONS = names.CORRECTIONS  # not the ablation bias-only


def parse_seeds(text: str | None) -> list[int] | None:
    """``'0,1,2'`` or ``'0-3'`` (or both, comma-separated) -> distinct seeds in order.

    At most :data:`MAX_SEEDS`: a larger request is refused before any range is expanded.
    """
    if text is None:
        return None
    ranges: list[tuple[int, int]] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            lo, sep, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
            ranges.append((int(lo), int(hi)) if sep else (int(lo), int(lo)))
    except ValueError:
        raise UsageError(f"bad --seeds {shown(text)}: use e.g. 0,1,2 or 0-3") from None
    if not ranges or any(lo < 0 or hi < lo for lo, hi in ranges):
        raise UsageError(
            f"bad --seeds {shown(text)}: give non-negative integers or ranges lo-hi with lo <= hi"
        )
    total = sum(hi - lo + 1 for lo, hi in ranges)
    if total > MAX_SEEDS:
        raise UsageError(
            f"--seeds {shown(text)} asks for {total:,} seeds; at most {MAX_SEEDS:,} per command"
        )
    return list(dict.fromkeys(s for lo, hi in ranges for s in range(lo, hi + 1)))


def parse_list(text: str, allowed: tuple, what: str, cast=str) -> list:
    """A comma list of ``allowed`` values (cast with ``cast``), duplicates dropped."""
    try:
        items = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(
            f"bad --{what} {shown(text)}: allowed {', '.join(map(str, allowed))}"
        ) from None
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UsageError(f"bad --{what} {shown(text)}: allowed {', '.join(map(str, allowed))}")
    return list(dict.fromkeys(items))


def parse_group_sizes(text: str) -> list[int]:
    """Positive integers; whether each divides a model's head dim is checked per model."""
    try:
        items = [int(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        items = []
    if not items or any(g < 1 or g > 4096 for g in items):
        raise UsageError(
            f"bad --group-sizes {shown(text)}: give channel counts that divide the head dim, "
            "e.g. 16,32,64"
        )
    return list(dict.fromkeys(items))


VBENCH_SETS = {"vbench-long-30": "vbench-long-30", "vbench-smoke": "vbench-smoke"}


def read_prompt_items(
    spec: str | None, extra: list[str] | None, model: str, seeds: list[int] | None
) -> list[tuple[str, list[int]]]:
    """(prompt, seeds) pairs. VBench sets give each prompt the number of samples VBench expects
    (seeds 0..n-1, named ``{prompt}-{index}``) unless ``--seeds`` is given."""
    if spec in VBENCH_SETS:
        from jbkv_cli.metrics.vbench_prompts import load_vbench_subset

        items = [
            (p.prompt, seeds or list(range(p.samples_per_prompt)))
            for p in load_vbench_subset(VBENCH_SETS[spec])
        ]
        items += [(p, seeds or [0]) for p in extra or [] if p.strip()]
        return items
    return [(p, seeds or [0]) for p in read_prompts(spec, extra, model)]


def read_case_items(
    path: Path, prompts: str | None, extra: list[str] | None, seeds: list[int] | None
) -> list[tuple[Case, list[int]]]:
    """(case, seeds) pairs from a case file (:func:`~jbkv_cli.models.cases.read_case_file`); every
    case gets ``seeds`` (default 0). ``--prompts``/``--prompt`` do not combine with it."""
    if prompts is not None or extra:
        raise UsageError("--cases lists the prompts; leave out --prompts and --prompt")
    return [(case, seeds or [0]) for case in read_case_file(path)]


def with_image(
    items: list[tuple[Case, list[int]]], image: Path | None, cases: Path | None
) -> list[tuple[Case, list[int]]]:
    """``items`` with ``--image`` as every case's image (checked to be a file; the model checks
    that it can read it). ``--cases`` names its images per row, so the two do not combine."""
    if image is None:
        return items
    if cases is not None:
        raise UsageError("--cases names each case's image; leave out --image")
    path = resolve_input(str(image), Path.cwd(), "image", "--image")
    return [(Case(c.prompt, path, c.trajectory, c.id), s) for c, s in items]


def prompt_file(spec: str | None, extra: list[str] | None, model: str) -> Path | None:
    """The file ``--prompts`` names: a path, else a named set in ``prompts/``; with neither
    ``--prompts`` nor ``--prompt``, the model's own set. None when only ``--prompt`` is given."""
    if spec is None and not extra:
        spec = model if (PROMPTS_DIR / f"{model}.txt").is_file() else None
        if spec is None:
            raise UsageError(
                f"give --prompts FILE, --prompt TEXT or --cases FILE for model {model!r}"
            )
    if spec is None:
        return None
    path = Path(spec)
    if not path.exists() or path.is_dir():
        named = PROMPTS_DIR / f"{spec}.txt"
        if not named.is_file():
            sets = sorted(p.stem for p in PROMPTS_DIR.glob("*.txt"))
            raise UsageError(
                f"no prompt file {shown(spec)} (named sets: {', '.join(sets) or 'none'})"
            )
        path = named
    return path


def read_prompts(spec: str | None, extra: list[str] | None, model: str) -> list[str]:
    """Prompts from a file or a named set, plus ``--prompt`` values; default: the model's set."""
    prompts: list[str] = []
    path = prompt_file(spec, extra, model)
    if path is not None:
        lines = prompt_lines(read_text(path, "prompt file", MAX_TEXT_BYTES))
        prompts += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    prompts += [p.strip() for p in extra or [] if p.strip()]
    if not prompts:
        raise UsageError(f"no prompts in {spec if spec is not None else path}")
    return list(dict.fromkeys(prompts))


def prompt_lines(text: str) -> list[str]:
    """The lines of a prompt file: split on ``\\n`` and ``\\r\\n`` only. ``str.splitlines``
    also splits on U+0085, U+000C, U+2028, U+2029 (and more), which would cut one prompt into
    several; such a character stays in its line, where :func:`~jbkv_cli.run.directory.check_prompt`
    refuses it by name."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def model_options(
    weights: Path | None,
    num_chunks: int | None,
    steps: int | None,
    window: int | None,
    device: str | None,
    extra: list[str] | None,
    model: str | None = None,
    models: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The options for ``model``: the flags, then ``-o KEY=VALUE`` (every model) and
    ``-o MODEL.KEY=VALUE`` (that model only; ``models`` are the names a scope may take).
    ``-o`` values stay strings: each model parses them by its declared option types and bounds
    (:func:`jbkv_cli.utils.fields.parse_options` in its ``check_options``)."""
    opts: dict[str, Any] = {}
    for key, value in (
        ("weights", weights),
        ("num_chunks", num_chunks),
        ("steps", steps),
        ("window", window),
    ):
        if value is not None:
            opts[key] = value
    opts["device"] = resolve_device(device)
    for item in extra or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --model-option {shown(item)}: use KEY=VALUE or MODEL.KEY=VALUE")
        scope, dot, name = key.strip().rpartition(".")
        if dot:
            if scope not in models:
                raise UsageError(
                    f"--model-option {shown(item)}: unknown model {scope!r} "
                    f"(known: {', '.join(models)})"
                )
            if scope != model:
                continue
        opts[(name if dot else key).strip().replace("-", "_")] = value.strip()
    return opts


def parse_method_options(items: list[str] | None, methods: tuple[str, ...]) -> dict[str, dict]:
    """``["quarot.seed=1", "qvg.centroids=16"]`` -> ``{"quarot": {"seed": 1}, ...}``.

    ``methods`` are the method and pruner names a scope may take. Each value is parsed by the
    option's declared type and bounds (:mod:`jbkv_cli.utils.fields`) into its canonical value, so a
    bad one is a usage error naming the option and its range before anything is built.
    """
    from jbkv_cli.utils.fields import parse_options, specs_of

    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        target, sep, value = item.partition("=")
        name, dot, key = target.strip().rpartition(".")
        if not sep or not dot or not key.strip():
            raise UsageError(f"bad --method-option {shown(item)}: use METHOD.KEY=VALUE")
        if name not in methods:
            raise UsageError(
                f"--method-option {shown(item)}: unknown method {shown(name)} "
                f"(known: {', '.join(methods)})"
            )
        key = key.strip().replace("-", "_")
        if key in getattr(_option_class(name), "UNUSED_OPTIONS", ()):
            raise UsageError(f"bad --method-option {shown(item)}: {name} does not use {key}")
        try:
            parsed = parse_options(specs_of(_option_class(name)), {key: value.strip()}, name)
        except ValueError as exc:
            raise UsageError(f"bad --method-option {shown(item)}: {exc}") from None
        out.setdefault(name, {}).pop(key, None)
        out[name].update(parsed)
    return out


def _option_class(name: str) -> type:
    """The method or pruner class registered as ``name``."""
    from jbkv_cli.prune.registry import PRUNERS
    from jbkv_cli.quant.registry import METHODS

    return METHODS.get(name) or PRUNERS[name]


def print_gate_outcome(problems: list[str], summary: str, baseline: object) -> None:
    """The regression gate's outcome on stderr: each problem as a ``gate:`` line, then a
    :class:`JbkvError` (exit 1); or one ``gate passed: SUMMARY against BASELINE`` line."""
    if problems:
        for p in problems:
            err.print(plain("gate:", "red") + plain(f" {p}"), highlight=False, soft_wrap=True)
        raise JbkvError(f"gate failed against {baseline}: {len(problems)} problem(s) above")
    err.print(
        plain("gate passed", "green") + plain(f": {summary} against {baseline}"), highlight=False
    )


def choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """An option's allowed values as the ``str`` enum Typer turns into a choice: click checks
    the value (a bad one is a usage error, exit 2, one line) and ``--help`` lists them. The
    command passes ``.value`` on."""
    return Enum(name, [(v, v) for v in values], type=str)
