"""``jbkv plan``'s job: which case each model is planned with, and every model's plan.

``generate --plan`` and ``quantize-eval --plan`` print the plan of the command's own models and
variants instead of running; on CUDA ``quantize-eval`` plans its grid before it starts and
refuses one that cannot fit the device (:func:`refusal`) unless ``--force``.

A plan generates one video per variant, of one case: the first of ``--prompt``/``--prompts``/
``--cases`` when given; else the model's own (its entry's ``sample_case``, which may write an
image or an actions file into a temporary folder), else the first prompt of its named prompt
set (``prompts/MODEL.txt``), else :data:`DEFAULT_PROMPT`. Text lengths are padded by these
models' encoders, so the prompt does not change the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.registry import entry
from jbkv_cli.plan.budget import Budget
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.jsonio import MAX_TEXT_BYTES, read_text
from jbkv_cli.utils.resources import PROMPTS_DIR

if TYPE_CHECKING:
    from jbkv_cli.plan.run import ModelPlan, Progress

DEFAULT_PROMPT = "a red fox trots through fresh snow at dawn, soft light, slow camera pan"


@dataclass(frozen=True)
class PlanRequest:
    """One model to plan: its ``options`` (``-o`` and the model flags), the ``specs``, the
    ``case`` (None: the model's default, :func:`default_case`), the ``seed`` and ``budgets``."""

    model: str
    options: dict[str, Any]
    specs: Sequence[KVSpec]
    case: Case | None = None
    seed: int = 0
    budgets: Sequence[Budget] = ()


def default_case(model: str, folder: Path, options: dict[str, Any]) -> Case:
    """The case ``model`` is planned with when none is given (module docstring); files it
    needs go into ``folder``."""
    make = entry(model).sample_case
    if make is not None:
        return make(folder, **options)
    named = PROMPTS_DIR / f"{model}.txt"
    if named.is_file():
        lines = read_text(named, "prompt file", MAX_TEXT_BYTES).splitlines()
        prompts = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if prompts:
            return Case(prompts[0])
    return Case(DEFAULT_PROMPT)


def run_plan(request: PlanRequest, folder: Path, progress: Progress | None = None) -> ModelPlan:
    """The plan of one model (:func:`~jbkv_cli.plan.run.plan_model`), with its default case
    written into ``folder`` when the request has none."""
    from jbkv_cli.plan.run import plan_model

    if entry(request.model).plan_model is None:
        raise UsageError(f"model {request.model!r} cannot be planned yet")
    case = request.case or (lambda options: default_case(request.model, folder, options))
    return plan_model(
        request.model,
        request.options,
        request.specs,
        case,
        budgets=request.budgets,
        seed=request.seed,
        progress=progress,
    )


def device_budget(device: str) -> Budget | None:
    """The memory of the CUDA ``device`` a command is about to run on, as a budget (its name
    and total bytes); None off CUDA."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.device(device))
    return Budget(props.name, int(props.total_memory))


def refusal(plans: Sequence[ModelPlan], budget: Budget) -> str | None:
    """The line that refuses a run whose plan does not fit ``budget`` (the first variant that
    does not, and its bytes), or None when every variant fits."""
    from jbkv_cli.plan.budget import GiB, fits

    for plan in plans:
        for v in plan.variants:
            if not fits(v.peak.total, budget):
                return (
                    f"{plan.model} {v.label} needs {v.peak.total / GiB:.1f} GiB at its peak "
                    f"({v.peak.total} bytes, planned; jbkv plan) but {budget.name} has "
                    f"{budget.bytes / GiB:.1f} GiB; give --force to run anyway"
                )
    return None
