"""``jbkv plan``: a generation's peak GPU memory per variant, predicted on this machine (the
job: :mod:`jbkv_cli.plan`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from jbkv_cli.cli.groups import Inputs, ModelFlags, check_model, model_errors, with_groups
from jbkv_cli.cli.options import parse_seeds
from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.cli.variants import SweepFlags, profile_paths
from jbkv_cli.models.registry import DEFAULT_MODEL, MODELS
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.console import err, out, plain
from jbkv_cli.utils.errors import UsageError

if TYPE_CHECKING:  # torch: the command imports the library once its options are checked
    from jbkv_cli.kvcache.spec import KVSpec
    from jbkv_cli.models.cases import Case
    from jbkv_cli.plan.budget import Budget
    from jbkv_cli.plan.job import PlanRequest
    from jbkv_cli.plan.run import ModelPlan


def _requests(
    names: list[str], sweep: SweepFlags, inputs: Inputs, flags: ModelFlags, budgets
) -> tuple[list[PlanRequest], list[Path]]:
    """Every model's request, each checked before anything runs, and the files they read."""
    from jbkv_cli.plan.job import PlanRequest

    if flags.device is not None:
        raise UsageError("jbkv plan plans a CUDA device; leave out --device")
    keys = {o.partition("=")[0].strip().rpartition(".")[2] for o in flags.model_option or []}
    if "device" in keys:
        raise UsageError("jbkv plan plans a CUDA device; leave out -o device")
    specs = sweep.specs()
    given = inputs.cases is not None or inputs.prompts is not None or bool(inputs.prompt)
    seeds = parse_seeds(inputs.seeds) or [0]
    requests, reads = [], []
    for name in names:
        check_model(name)
        options = flags.options(name)
        options.pop("device")  # the plan's device is CUDA's (the entry's plan_model)
        case = None
        if given:
            with model_errors(name):
                items = inputs.items(name, options)
            case, seeds = items[0][0], items[0][1]
            reads += inputs.paths(name, items)
        elif inputs.image is not None:
            raise UsageError("--image goes with --prompt, --prompts or --cases")
        reads += profile_paths(list(specs), name)
        requests.append(PlanRequest(name, options, specs, case, seeds[0], budgets))
    return requests, reads


@with_groups
def plan(
    models: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model(s) to plan (repeatable; 'all': every one)."),
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory",
            help="Budget(s): a size (80GiB, 24GB) or a GPU (H100, A100-40GB, 4090), comma "
            "list: whether each variant fits and the longest video that does.",
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the plans here (JSON, bytes).")
    ] = None,
    sweep: SweepFlags = SweepFlags(),
    inputs: Inputs = Inputs(),
    flags: ModelFlags = ModelFlags(),
) -> None:
    """Predict each variant's peak GPU memory (weights per component, stored cache, attention,
    other activations) by running the model's real code at full size on a fake CUDA device in
    its GPU dtype: nothing is allocated, no weight file is needed (docs/plan.md)."""
    chosen = list(dict.fromkeys(models or [DEFAULT_MODEL]))
    names = list(MODELS) if "all" in chosen else chosen
    from jbkv_cli.plan.budget import parse_budgets

    budgets = parse_budgets(gpu_memory) if gpu_memory is not None else []
    requests, reads = _requests(names, sweep, inputs, flags, budgets)
    if json_path is not None:
        check_output_file(json_path, "--json", inputs=reads)
    plans = run_plans(requests)
    if json_path is not None:
        from jbkv_cli.plan.table import plan_document

        write_text_atomic(json_path, json.dumps(plan_document(plans), indent=2) + "\n")
    show(plans)
    if json_path is not None:
        err.print(f"wrote {json_path}", highlight=False)


def run_plans(requests: list[PlanRequest]) -> list[ModelPlan]:
    """Every request's plan (progress on stderr), default cases made in a temporary folder."""
    from jbkv_cli.plan.job import run_plan

    plans = []
    with tempfile.TemporaryDirectory(prefix="jbkv-plan-") as folder:
        for request in requests:
            with model_errors(request.model):
                plans.append(run_plan(request, Path(folder), progress=_progress))
    return plans


def command_requests(
    names: list[str],
    specs: list[KVSpec],
    options: dict[str, dict[str, Any]],
    work: dict[str, list[tuple[Case, list[int]]]],
    budgets: list[Budget],
) -> list[PlanRequest]:
    """The requests of ``generate``/``quantize-eval``'s own models, variants and first case."""
    from jbkv_cli.plan.job import PlanRequest

    requests = []
    for name in names:
        opts = {k: v for k, v in options[name].items() if k != "device"}
        case, seeds = work[name][0]
        requests.append(PlanRequest(name, opts, specs, case, seeds[0], budgets))
    return requests


def show(plans: list[ModelPlan]) -> None:
    """Each plan's table and notes on stdout."""
    from jbkv_cli.plan.table import notes, plan_table

    for made in plans:
        out.print(plan_table(made))
        for line in notes(made):
            out.print(plain(line), highlight=False)


def _progress(line: str) -> None:
    err.print(plain(f"planning {line}"), highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(plan)


__all__ = ["plan", "register"]
