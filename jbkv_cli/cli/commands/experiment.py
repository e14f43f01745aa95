"""``jbkv generate``, ``jbkv quantize-eval`` and ``jbkv report``: thin wrappers over the library."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from jbkv_cli.cli.groups import (
    Inputs,
    ModelFlags,
    check_load,
    check_model,
    load,
    model_paths,
    with_groups,
)
from jbkv_cli.cli.options import choices, print_gate_outcome
from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.cli.variants import CacheFlags, SweepFlags, profile_paths
from jbkv_cli.models.registry import DEFAULT_MODEL, MODELS, horizon_options
from jbkv_cli.report.job import (
    FORMATS,
    LLM,
    LLM_FORMATS,
    Report,
    ReportRequest,
    build_report,
    render,
)
from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.console import err, out, plain, warn
from jbkv_cli.utils.errors import JbkvError, UsageError

if TYPE_CHECKING:  # torch: the commands import the library once their options are checked
    from jbkv_cli.kvcache.spec import KVSpec
    from jbkv_cli.models.contract import VideoModel
    from jbkv_cli.report.results import ResultRow
    from jbkv_cli.run.directory import RunDir

HORIZON_CHUNKS = 64  # --horizon: the rollout, 8 times the embedded model's default
HORIZON_SEEDS = "0,1"  # ... and two seeds: the floor is the PSNR between them
NO_LAYOUT = "its adapter states no head_layout() (models/contract.py: PrunableModel)"
PlanOpt = Annotated[
    bool,
    typer.Option(
        "--plan",
        help="Print each variant's predicted peak GPU memory (jbkv plan) and exit: nothing is "
        "generated or written.",
    ),
]


def _check_specs(model: VideoModel, specs: list[KVSpec]) -> None:
    """Every method of ``specs`` can store this model's heads (group sizes, rotation blocks);
    every pruner can run on it (its head profile is read and checked here); every per-layer
    spec fits its attention layers."""
    _check_pruners(model, specs)
    _check_layers(model, specs)
    head_dim = model.settings.get("head_dim")
    if head_dim is None:
        return
    for spec in specs:
        for method in {spec.key, spec.value} - {None}:
            try:
                method.check(head_dim)
            except ValueError as exc:
                hint = ""
                if method.group_size == method.default_group_size():
                    hint = f" (g{method.group_size} is {method.name}'s default: give --group-size)"
                raise UsageError(f"{method.label} on {model.name}: {exc}{hint}") from None


def _check_layers(model: VideoModel, specs: list[KVSpec]) -> None:
    """Per-layer specs (``--bits K2V2@0-3+K2V1@4-``) against the model's attention layers."""
    from jbkv_cli.models.contract import check_layers

    for spec in specs:
        check_layers(model, spec)


def _warn_taylor(model: VideoModel, specs: list[KVSpec]) -> None:
    """One stderr line per variant that applies the taylor correction to 1-bit keys: outside
    the expansion's range (:mod:`jbkv_cli.run.bit_specs`), marked in its row."""
    if not distributed.is_main():
        return
    for spec in specs:
        if spec.taylor_outside:
            warn(
                f"{spec.label} on {model.name}: taylor at 1-bit keys is outside its small-step "
                "range; its row will be marked (exact and signed run as they are)"
            )


def _check_pruners(model: VideoModel, specs: list[KVSpec]) -> None:
    from jbkv_cli.models.contract import PrunableModel

    for pruner in dict.fromkeys(s.pruner for s in specs if s.pruner is not None):
        if not isinstance(model, PrunableModel):
            raise UsageError(f"{pruner.name} cannot prune model {model.name!r}: {NO_LAYOUT}")
        try:
            pruner.plans(model.name, **model.head_layout())
        except ValueError as exc:
            raise UsageError(f"{pruner.name} on {model.name}: {exc}") from None


def _prune_problem(model: VideoModel, spec: KVSpec) -> str | None:
    """Why ``spec``'s methods cannot be pruned (they must store each token on its own)."""
    from jbkv_cli.kvcache.pruned import check_prunable

    head_dim = model.settings.get("head_dim")
    if spec.pruner is None or head_dim is None:
        return None
    try:
        for method in {spec.key, spec.value} - {None}:
            check_prunable(method, head_dim, spec.pruner)
    except ValueError as exc:
        return str(exc)
    return None


def _prunable_specs(model: VideoModel, specs: list[KVSpec]) -> list[KVSpec]:
    """The variants but pruned ones whose methods cannot drop single tokens (those are named
    in a warning and left out)."""
    problems = {s: _prune_problem(model, s) for s in specs}
    dropped = [(s.variant_id, why) for s, why in problems.items() if why]
    if dropped:
        warn(
            f"{len(dropped)} pruned variant(s) are left out: pruning needs a method that stores "
            f"each token on its own (e.g. {dropped[0][0]}: {dropped[0][1]})"
        )
    return [s for s, why in problems.items() if not why]


def _fitting_specs(model: VideoModel, specs: list[KVSpec]) -> list[KVSpec]:
    """The sweep's variants this model's heads can hold; the rest are named in a warning."""
    head_dim = model.settings.get("head_dim")
    if head_dim is None:
        return specs
    kept, dropped = [], []
    for spec in specs:
        try:
            for method in {spec.key, spec.value} - {None}:
                method.check(head_dim)
            kept.append(spec)
        except ValueError:
            dropped.append(spec.variant_id)
    if dropped:
        warn(
            f"{len(dropped)} sweep variant(s) do not fit {model.name}'s head dim {head_dim} "
            f"and are left out (e.g. {dropped[0]})"
        )
    return kept


def _geometry(settings: dict[str, Any]) -> tuple[int, int | None, int | None] | None:
    """Upper bounds on a video's cache commits and held chunks, and the tokens per commit
    (None: unknown), from a model's settings: ``num_chunks`` (× ``chunk_frames /
    commit_frames`` where a model commits frame by frame), ``window``, ``tokens_per_chunk``."""
    chunks = settings.get("num_chunks")
    if type(chunks) is not int:
        return None
    frames, commit = settings.get("chunk_frames"), settings.get("commit_frames")
    if type(frames) is int and type(commit) is int and 0 < commit <= frames:
        chunks *= frames // commit
    window, tokens = settings.get("window"), settings.get("tokens_per_chunk")
    return chunks, window if type(window) is int else None, tokens if type(tokens) is int else None


def _warn_noops(model: VideoModel, specs: list[KVSpec]) -> None:
    """One stderr line per variant whose cache policy compresses nothing in this model's
    videos (:func:`~jbkv_cli.kvcache.coverage.noop_reason`), before anything is generated."""
    from jbkv_cli.kvcache.coverage import noop_reason

    geometry = _geometry(model.settings)
    if geometry is None or not distributed.is_main():
        return
    for spec in specs:
        methods = dict.fromkeys(m for m in (spec.key, spec.value) if m is not None)
        why = [noop_reason(m, *geometry, spec.sink_chunks) for m in methods if spec.quantized]
        if why and all(why):
            warn(
                f"{spec.label} on {model.name} will compress nothing: {why[0]}; its row will "
                "be marked no-op"
            )


def _print_plans(names, specs, options, work) -> None:
    """``--plan``: each model's plan of these variants (``jbkv plan``'s table), nothing run."""
    from jbkv_cli.cli.commands.plan import command_requests, run_plans, show

    show(run_plans(command_requests(names, specs, options, work, [])))


def _check_fits(names, specs, options, work) -> None:
    """On a CUDA device: plan the grid and refuse it (one line naming the variant and its
    bytes, exit 1) when a variant's predicted peak does not fit the device
    (:func:`~jbkv_cli.plan.job.refusal`); nothing off CUDA."""
    from jbkv_cli.plan.job import device_budget, refusal

    budget = device_budget(options[names[0]]["device"])
    if budget is None:
        return
    from jbkv_cli.cli.commands.plan import command_requests, run_plans

    problem = refusal(run_plans(command_requests(names, specs, options, work, [])), budget)
    if problem is not None:
        raise JbkvError(problem)


def _summary_line(summary, run: RunDir) -> None:
    rest = (
        f" videos generated, {summary.skipped} already done · "
        f"{summary.seconds:.1f} s · peak KV cache {summary.peak_kv_bytes / 2**20:.2f} MB · "
        f"run: {run.root}" + _per_rank(summary.per_rank)
    )
    err.print(plain(summary.generated, "bold") + plain(rest), highlight=False)


def _per_rank(counts: list[int]) -> str:
    """`` · per rank: 3, 3`` under torchrun (videos made by ranks 0, 1, …); one process: ``""``."""
    return f" · per rank: {', '.join(map(str, counts))}" if len(counts) > 1 else ""


@with_groups
def generate(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model: {', '.join(MODELS)}.")
    ] = DEFAULT_MODEL,
    cache: CacheFlags = CacheFlags(),
    inputs: Inputs = Inputs(),
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run directory (default runs/<model>).")
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference/--no-reference", help="Also generate the 16-bit reference (once; reused)."
        ),
    ] = True,
    diagnostics: Annotated[
        bool,
        typer.Option("--diagnostics/--no-diagnostics", help="Record ΔP_S etc. while generating."),
    ] = True,
    plan: PlanOpt = False,
    flags: ModelFlags = ModelFlags(),
) -> None:
    """Generate videos with a (quantized) KV cache into a run directory; resumable."""
    check_model(model)
    spec = cache.spec()
    opts = flags.options(model)
    items = inputs.items(model, opts)
    from jbkv_cli.kvcache.spec import FULL_PRECISION
    from jbkv_cli.models.contract import resolve_spec
    from jbkv_cli.run.experiment import fingerprint_inputs, generate_all, open_run

    if plan:  # the variants' predicted GPU memory, nothing generated (docs/plan.md)
        specs = [FULL_PRECISION, spec] if reference and spec != FULL_PRECISION else [spec]
        _print_plans([model], specs, {model: opts}, {model: items})
        return
    distributed.setup(flags.device)
    root = out_dir or Path("runs") / model
    files = fingerprint_inputs(root, model, opts, [c for c, _ in items])
    m = load(model, opts)
    spec = resolve_spec(m, spec)
    _check_specs(m, [spec])
    problem = _prune_problem(m, spec)
    if problem:
        raise UsageError(f"{spec.pruner.name} cannot prune {spec.label}: {problem}")
    _warn_noops(m, [spec])
    _warn_taylor(m, [spec])
    run = open_run(root, model, m.settings, files)
    specs = [FULL_PRECISION, spec] if reference and spec != FULL_PRECISION else [spec]
    summary = generate_all(m, run, specs, items, diagnostics=diagnostics)
    _summary_line(summary, run)


@with_groups
def quantize_eval(
    models: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Model(s) to evaluate (repeatable).")
    ] = None,
    sweep: SweepFlags = SweepFlags(),
    inputs: Inputs = Inputs(),
    out_dir: Annotated[
        Path, typer.Option("--out", help="Run directory root (one sub-directory per model).")
    ] = Path("runs/quantize-eval"),
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the machine-readable result here.")
    ] = None,
    lpips: Annotated[
        bool,
        typer.Option(
            "--lpips/--no-lpips", help="Compute LPIPS (needs the AlexNet weights offline)."
        ),
    ] = True,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Write PNG figures into RUN/report.")
    ] = True,
    vbench: Annotated[
        bool, typer.Option("--vbench", help="Also run VBench (needs `jbkv vbench setup`).")
    ] = False,
    plan: PlanOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="On CUDA: run even when the plan says a variant does not fit the GPU."
        ),
    ] = False,
    horizon: Annotated[
        bool,
        typer.Option(
            "--horizon",
            help=f"The long-horizon preset: --num-chunks {HORIZON_CHUNKS} and --seeds "
            f"{HORIZON_SEEDS} unless given (two seeds measure the floor), the tiny model's "
            "long-rollout weights unless --weights; the report's horizon section "
            "(docs/report.md).",
        ),
    ] = False,
    flags: ModelFlags = ModelFlags(),
) -> None:
    """The main job: reference + INT2/INT4 x corrections x quantizers, identical seeds, metrics,
    diagnostics, then the table. With no arguments it runs on the embedded model."""
    if horizon:
        flags, inputs = horizon_preset(flags, inputs)
    specs = sweep.specs()
    names = list(dict.fromkeys(models or [DEFAULT_MODEL]))
    for name in names:
        check_model(name)
    model_opts = {name: flags.options(name) for name in names}
    if horizon:  # a model's own long-rollout options (the tiny model's weights) unless given
        model_opts = {name: horizon_options(name, opts) for name, opts in model_opts.items()}
    work = {name: inputs.items(name, model_opts[name]) for name in names}
    if plan:  # the grid's predicted GPU memory, nothing generated (docs/plan.md)
        _print_plans(names, specs, model_opts, work)
        return
    for name in names:  # every model's options and weights, before the first one runs
        check_load(name, model_opts[name])
    if not force:  # on CUDA: a grid that cannot fit the device is refused before it starts
        _check_fits(names, specs, model_opts, work)
    if json_path is not None:  # not over a run's files, nor over anything the command reads
        reads = [
            path
            for name in names
            for path in (
                *inputs.paths(name, work[name]),
                *model_paths(name, model_opts[name]),
                *profile_paths(specs, name),
            )
        ]
        check_output_file(
            json_path, "--json", runs=[out_dir / name for name in names], inputs=reads
        )
    from jbkv_cli.models.contract import resolve_specs
    from jbkv_cli.run.experiment import Scoring, fingerprint_inputs, generate_all, open_run

    distributed.setup(flags.device)
    files = {  # and every model's files, against its run folder
        name: fingerprint_inputs(out_dir / name, name, model_opts[name], [c for c, _ in items])
        for name, items in work.items()
    }
    results, shows = [], []
    for name, items in work.items():
        m = load(name, model_opts[name])
        model_specs = resolve_specs(m, specs)
        model_specs = _fitting_specs(m, model_specs) if sweep.frontier else model_specs
        model_specs = _prunable_specs(m, model_specs)
        _check_specs(m, model_specs)
        _warn_noops(m, model_specs)
        _warn_taylor(m, model_specs)
        root = out_dir / name
        run = open_run(root, name, m.settings, files[name])
        # each video is scored as soon as it is made, and checked against its prompt (when
        # the model has a check: the long-horizon report's still-valid fraction)
        scoring = Scoring(
            run, lpips=lpips, check=m.follows_prompt, check_version=m.follows_prompt_version
        )
        summary = generate_all(m, run, model_specs, items, scoring=scoring)
        shows.append(partial(_summary_line, summary, run))
        if vbench:
            _run_vbench(run)
        if distributed.is_main():  # under torchrun rank 0 alone renders and writes the report
            data, show = _write_report(run, plots=plots, lpips_status=scoring.status)
            results.append(data)
            shows.append(show)
    if json_path is not None and distributed.is_main():
        data = results[0] if len(results) == 1 else {"runs": results}
        write_text_atomic(json_path, json.dumps(data, indent=2) + "\n")
        shows.append(partial(err.print, f"wrote {json_path}", highlight=False))
    for show in shows:  # every file is written: a failure while printing cannot lose a result
        show()


def horizon_preset(flags: ModelFlags, inputs: Inputs) -> tuple[ModelFlags, Inputs]:
    """``--horizon``: a long rollout and two seeds, each unless given. One seed given: a
    warning (the report has no floor, so no time to divergence). The models' own options
    follow (:func:`~jbkv_cli.models.registry.horizon_options`)."""
    from dataclasses import replace

    from jbkv_cli.cli.options import parse_seeds

    flags = replace(flags, num_chunks=flags.num_chunks or HORIZON_CHUNKS)
    inputs = replace(inputs, seeds=inputs.seeds or HORIZON_SEEDS)
    if len(parse_seeds(inputs.seeds) or []) < 2:
        warn(
            "--horizon with one seed: no floor (two seeds of a prompt measure it), so the "
            "report gives the still-valid fraction but no time to divergence"
        )
    return flags, inputs


def _run_vbench(run: RunDir) -> None:
    """VBench-Long on every variant of the run, dimensions whose weights are present."""
    from jbkv_cli.cli.commands.vbench import run_and_print
    from jbkv_cli.metrics.vbench_job import VBenchRequest

    run_and_print(VBenchRequest(run.root, skip_missing=True))


def _write_report(
    run: RunDir, *, plots: bool, lpips_status: str | None = None
) -> tuple[dict[str, Any], Callable[[], None]]:
    """Write RUN/report (results.json, table.md, the figures, index.html); return the report's
    data and the function that prints it (the table, the gains, the files written). Files
    first, so a failure while printing never loses what was computed."""
    from jbkv_cli.report.comparisons import comparisons_markdown
    from jbkv_cli.report.horizon import horizon_markdown
    from jbkv_cli.report.html import write_html_report
    from jbkv_cli.report.table import build_rows, to_json, to_markdown

    rows = build_rows(run)
    data = to_json(run, rows)
    report_dir = run.root / "report"
    write_text_atomic(report_dir / "results.json", json.dumps(data, indent=2) + "\n")
    md = to_markdown(rows) + comparisons_markdown(data) + horizon_markdown(data.get("horizon"))
    write_text_atomic(report_dir / "table.md", md)
    made = []
    if plots:
        from jbkv_cli.report.plots import make_plots

        made = make_plots(run, rows, report_dir)
    page = write_html_report(run, data, report_dir)
    return data, partial(_print_report, run, rows, data, made, page, lpips_status)


def _print_report(
    run: RunDir,
    rows: list[ResultRow],
    data: dict[str, Any],
    made: list[Path],
    page: Path,
    lpips_status: str | None,
) -> None:
    """What quantize-eval prints of a run's report (:func:`_write_report` wrote its files)."""
    from jbkv_cli.report.table import lpips_note, print_table

    settings = run.manifest.get("settings", {})
    shown = ", ".join(f"{k}={v}" for k, v in settings.items() if not isinstance(v, dict | list))
    print_table(out, rows, f"{run.manifest.get('model')} · {shown}")
    note = lpips_note(rows) or (
        lpips_status if lpips_status and "unavailable" in lpips_status else None
    )
    if note:
        warn(f"LPIPS n/a: {note}")
    print_comparisons(data)
    for r in rows:
        if r.kv_bytes_by_head and r.kv_cache_bytes is not None and r.kv_ratio is not None:
            split = ", ".join(f"{k} heads {v / 2**20:.3f}" for k, v in r.kv_bytes_by_head.items())
            out.print(
                f"  {r.label}: KV {r.kv_cache_bytes / 2**20:.3f} MB = {r.kv_ratio:.3f} of the "
                f"reference's ({split} MB)",
                highlight=False,
            )
    for r in rows:
        if r.kv_bytes_by_cache and r.kv_cache_bytes is not None:
            split = ", ".join(f"{k} {v / 2**20:.3f}" for k, v in r.kv_bytes_by_cache.items())
            out.print(
                f"  {r.label}: KV {r.kv_cache_bytes / 2**20:.3f} MB ({split} MB)", highlight=False
            )
    if made:
        err.print("plots: " + ", ".join(str(p) for p in made), highlight=False)
    err.print(f"page: {page}", highlight=False)


def print_comparisons(data: dict[str, Any]) -> None:
    """The paired comparisons under the table (:func:`jbkv_cli.report.comparisons.comparison_lines`),
    then the horizon section (:func:`jbkv_cli.report.horizon.horizon_lines`)."""
    from jbkv_cli.report.comparisons import comparison_lines
    from jbkv_cli.report.horizon import horizon_lines

    for line in comparison_lines(data) + horizon_lines(data.get("horizon")):
        out.print(plain(f"  {line}"), highlight=False, soft_wrap=True)


Format = choices("Format", FORMATS)


def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory made by generate/quantize-eval.")
    ],
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="html: RUN/report/index.html with its figures; md, json, csv: on stdout "
            f"(an llm-prefill run: {', '.join(LLM_FORMATS)}).",
        ),
    ] = Format.table,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Write PNG figures into RUN/report.")
    ] = False,
    baseline: Annotated[
        Path | None, typer.Option(help="A stored result (JSON) to gate against.")
    ] = None,
    tolerance: Annotated[
        str | None,
        typer.Option(help="Allowed regression, e.g. psnr=0.5,ssim=0.01,lpips=0.01,delta_ps=0.01."),
    ] = None,
    score: Annotated[
        bool,
        typer.Option(
            "--score",
            help="First score the videos not scored yet against the reference (PSNR, SSIM, "
            "LPIPS; resumable), as quantize-eval does.",
        ),
    ] = False,
    lpips: Annotated[
        bool, typer.Option("--lpips/--no-lpips", help="With --score: compute LPIPS too.")
    ] = True,
) -> None:
    """Rebuild the table (and plots) from a run directory alone; optionally gate on a baseline."""
    request = ReportRequest(
        run_dir,
        fmt=fmt.value,
        plots=plots,
        baseline=baseline,
        tolerance=tolerance,
        score=score,
        lpips=lpips,
    )
    built = build_report(request)
    if built is not None:  # None: a torchrun rank other than 0, which only scored
        _print_built(built)


def _print_built(built: Report) -> None:
    """What ``jbkv report`` prints: a warning for unscored variants, the report in its format,
    the figures written, the gate's outcome."""
    if built.unscored:
        warn(
            f"{len(built.unscored)} variant(s) not scored yet (PSNR/SSIM show —): "
            f"run `jbkv report {built.run.root} --score`"
        )
    if built.fmt != "table":
        typer.echo(render(built), nl=False)
    elif built.kind == LLM:
        from jbkv_cli.cli.commands.llm import print_rows

        print_rows(built.run, built.rows)
    else:
        from jbkv_cli.report.table import lpips_note, print_table

        print_table(out, built.rows, f"{built.run.manifest.get('model')} · {built.run.root}")
        note = lpips_note(built.rows)
        if note:
            warn(f"LPIPS n/a: {note}")
        print_comparisons(built.data)
    for p in built.figures:
        err.print(f"wrote {p}", highlight=False)
    if built.gate is not None:
        gate = built.gate
        print_gate_outcome(gate.problems, gate.summary, gate.baseline)


def register(app: typer.Typer) -> None:
    app.command()(generate)
    app.command("quantize-eval")(quantize_eval)
    app.command()(report)


__all__ = ["generate", "quantize_eval", "register", "report"]
