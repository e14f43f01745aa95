"""``jbkv vbench run`` as one call: a request, checked whole before anything is made, then run.

:func:`prepare` resolves the dimensions (the mode's default when none are named), checks the
settings (:meth:`~jbkv_cli.metrics.vbench_run.VBenchConfig.validate`), finds the VBench
environment and the weights each dimension needs (``skip_missing`` leaves out, with a warning,
those without) and the videos; it creates nothing. :func:`run_vbench` then evaluates every
variant (:func:`~jbkv_cli.metrics.vbench_run.evaluate_path`: work folders, raw results and
``metrics/vbench.json``) and returns the summary; the command prints it and then refuses
(:meth:`VBenchOutcome.check`) when a dimension failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jbkv_cli.metrics.vbench_env import VBenchEnv, require_env
from jbkv_cli.metrics.vbench_run import (
    CUSTOM_DIMENSIONS,
    VBenchConfig,
    check_weights,
    discover_variants,
    evaluate_path,
)
from jbkv_cli.metrics.vbench_scores import DIMENSIONS
from jbkv_cli.metrics.vbench_weights import require_weights
from jbkv_cli.utils import distributed
from jbkv_cli.utils.console import warn
from jbkv_cli.utils.errors import JbkvError, UsageError, shown

DEVICES = ("auto", "cpu", "cuda")
OnEvent = Callable[[str, str, dict[str, Any]], None]  # (variant, kind, event)


@dataclass(frozen=True)
class VBenchRequest:
    """What ``jbkv vbench run`` is asked to do. ``dimensions``: names, comma lists, ``all`` or
    ``custom`` (:func:`parse_dimensions`); none: the mode's default. ``out`` None:
    ``PATH/metrics``; ``root`` None: the environment's default cache folder."""

    path: Path
    dimensions: tuple[str, ...] = ()
    mode: str = "long_custom_input"
    device: str = "auto"
    out: Path | None = None
    skip_missing: bool = False
    static_filter: bool = False
    dev_flag: bool = True
    force: bool = False
    root: Path | None = None


@dataclass(frozen=True)
class Plan:
    """A checked request: the settings, the environment, the dimensions left out."""

    request: VBenchRequest
    config: VBenchConfig
    env: VBenchEnv
    skipped: tuple[str, ...]


@dataclass(frozen=True)
class VBenchOutcome:
    """The summary written (``metrics/vbench.json``) and where."""

    doc: dict[str, Any]
    summary_path: Path

    def failures(self) -> dict[str, dict[str, str]]:
        """Variant -> {dimension: message} of every dimension VBench failed on."""
        return {n: v["errors"] for n, v in self.doc["variants"].items() if v["errors"]}

    def check(self) -> None:
        """Raise :class:`JbkvError` (exit 1) when a dimension failed; on rank 0 only, so the
        line is printed once under torchrun."""
        failed = self.failures()
        if failed and distributed.is_main():
            raise JbkvError(
                "VBench failed for "
                + "; ".join(f"{n}: {', '.join(e)}" for n, e in failed.items())
                + f" (logs under {self.summary_path.parent / 'vbench'})"
            )


def parse_dimensions(values: tuple[str, ...] | list[str] | None, mode: str) -> tuple[str, ...]:
    """``--dimensions a,b -d c``; ``all`` = the 16; ``custom`` = those valid on custom videos;
    none: all 16 in the ``*_vbench_standard`` modes, else the custom ones."""
    if not values:
        return DIMENSIONS if mode.endswith("standard") else CUSTOM_DIMENSIONS
    dims: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip().replace(" ", "_")
            group = {"all": DIMENSIONS, "custom": CUSTOM_DIMENSIONS}.get(item, (item,))
            dims.extend(d for d in group if d and d not in dims)
    return tuple(dims)


def prepare(request: VBenchRequest) -> Plan:
    """Every check of the run, in the order a user meets them; creates nothing."""
    r = request
    if r.device not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {shown(r.device)}")
    config = VBenchConfig(
        dimensions=parse_dimensions(r.dimensions, r.mode),
        mode=r.mode,
        device=r.device,
        dev_flag=r.dev_flag,
        static_filter=r.static_filter,
    )
    config.validate()
    distributed.setup(None if r.device == "auto" else r.device)  # torchrun: a share of variants
    env = require_env(r.root)
    skipped: tuple[str, ...] = ()
    if r.skip_missing:
        skipped = tuple(check_weights(config))
        if skipped:
            warn(f"skipping dimensions without weights: {', '.join(skipped)}")
            config.dimensions = tuple(d for d in config.dimensions if d not in skipped)
            if not config.dimensions:
                raise JbkvError("no selected VBench dimension has its weights")
    else:
        require_weights(
            config.dimensions, long_mode=config.long_mode, static_filter=config.static_filter
        )
    discover_variants(r.path.resolve())  # the videos are there and named as VBench needs
    return Plan(r, config, env, skipped)


def run_vbench(request: VBenchRequest, on_event: OnEvent | None = None) -> VBenchOutcome:
    """Check ``request`` (:func:`prepare`), then evaluate every variant under its path.
    ``on_event(variant, kind, event)`` follows each dimension (kind: start, done, cached,
    error); ``event`` is the runner's, plus ``total``: the dimensions each variant runs."""
    plan = prepare(request)
    r = plan.request
    total = len(plan.config.dimensions)

    def follow(variant: str, kind: str, event: dict[str, Any]) -> None:
        if on_event is not None:
            on_event(variant, kind, {**event, "total": total})

    doc, summary_path = evaluate_path(r.path, plan.env, plan.config, r.out, follow, r.force)
    return VBenchOutcome(doc, summary_path)
