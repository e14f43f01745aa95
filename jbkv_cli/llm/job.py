"""The llm-prefill job as one call: a request, checked whole before anything is made, then run.

:func:`prepare` resolves the model's defaults (:mod:`jbkv_cli.llm.defaults`: the embedded LM's
or the paper's), checks every input (backend, data, device, dtype, the ``--json`` path, the
model's files against the run folder, that each method stores the model's heads and the longest
job fits its positions, the run folder's settings) and chooses the examples; it creates nothing
(neither the run folder nor ``--json``). :func:`run` opens the run, scores what is missing
(:func:`~jbkv_cli.llm.evaluate.run_jobs`) and writes the report.
:func:`prefill` is the two in a row; ``jbkv llm-prefill`` parses its options into a
:class:`PrefillRequest`, calls it and prints the :class:`PrefillResult`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jbkv_cli.attention.attend import BACKENDS as ATTENTION_BACKENDS
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.llm.data import Bin, Example, Source, parse_bins, parse_sizes
from jbkv_cli.llm.defaults import EMBEDDED_DEFAULTS, MAX_EXAMPLES, PAPER_DEFAULTS
from jbkv_cli.llm.models import DTYPES as TORCH_DTYPES
from jbkv_cli.llm.models import EMBEDDED, LoadedLM
from jbkv_cli.llm.run import LlmRun
from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.console import warn
from jbkv_cli.utils.device import resolve_device
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.fields import MAX_SEED

if TYPE_CHECKING:  # the job's modules load transformers: imported where the job runs
    from jbkv_cli.llm.evaluate import Summary
    from jbkv_cli.llm.report import Row

BACKENDS = tuple(ATTENTION_BACKENDS)  # the corrected attention's kernels
DTYPES = ("auto", *TORCH_DTYPES)  # auto: jbkv_cli.llm.models.resolve_dtype


@dataclass(frozen=True)
class PrefillRequest:
    """What ``jbkv llm-prefill`` is asked to do. ``specs``: the variants (the reference first,
    :func:`~jbkv_cli.run.experiment.build_matrix`); ``data``, ``bins``, ``chunk_sizes`` None:
    the model's defaults; ``out`` None: ``runs/llm-prefill/MODEL``."""

    specs: tuple[KVSpec, ...]
    model: str = EMBEDDED
    data: str | None = None
    bins: tuple[Bin, ...] | None = None
    chunk_sizes: tuple[int, ...] | None = None
    examples: int = 16
    seed: int = 0
    out: Path | None = None
    json_path: Path | None = None
    plots: bool = True
    diagnostics: bool = True
    dtype: str = "auto"
    device: str | None = None
    backend: str = "fused"


@dataclass(frozen=True)
class Plan:
    """A checked request: everything :func:`run` needs, and nothing made yet."""

    request: PrefillRequest
    lm: LoadedLM
    source: Source
    root: Path
    model_id: str
    settings: dict[str, Any]
    inputs: dict[str, Any]
    examples: list[Example]
    short: dict[str, int]  # (chunk, bin) cells with fewer long-enough examples than asked


@dataclass(frozen=True)
class PrefillResult:
    """The run and its jobs; the report's ``rows`` and the files ``written`` on rank 0 (under
    torchrun the other ranks only score: None and [])."""

    run: LlmRun
    jobs: Summary
    rows: list[Row] | None = None
    written: list[Path] = field(default_factory=list)


def slug(name: str) -> str:
    """A model name as a folder name (``runs/llm-prefill/<slug>``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name or name).strip("._") or "model"


def prefill(request: PrefillRequest) -> PrefillResult:
    """Check ``request`` whole (:func:`prepare`), then run it (:func:`run`)."""
    return run(prepare(request))


def prepare(request: PrefillRequest) -> Plan:
    """Every check of the job, in the order a user meets them; creates nothing."""
    from jbkv_cli.cli.outputs import check_output_file
    from jbkv_cli.llm.data import data_file, open_source, select_examples
    from jbkv_cli.llm.models import load_lm, model_files, model_path, resolve_dtype
    from jbkv_cli.run.directory import check_run_dir

    r = request
    _check_plain(r)
    embedded = r.model == EMBEDDED
    defaults = EMBEDDED_DEFAULTS if embedded else PAPER_DEFAULTS
    bins = list(r.bins) if r.bins is not None else parse_bins(defaults["bins"])
    chunks = list(r.chunk_sizes) if r.chunk_sizes is not None else parse_sizes(defaults["chunks"])
    data = defaults["data"] if r.data is None else r.data
    dev = resolve_device(r.device)
    dtype = resolve_dtype(r.dtype, dev)
    where, _ = model_path(r.model)
    model_id = (
        EMBEDDED if embedded else (str(Path(where).resolve()) if Path(where).is_dir() else where)
    )
    root = r.out or Path("runs") / "llm-prefill" / slug(r.model)
    source = open_source(data, r.seed, max(b.hi for b in bins) + max(chunks), embedded=embedded)
    if r.json_path is not None:  # not over a file of a run, nor over the data or the model
        reads = [p for p in [data_file(data), *model_files(r.model)] if p is not None]
        check_output_file(r.json_path, "--json", runs=[root], inputs=reads)
    distributed.setup(dev)
    inputs = distributed.from_rank0(
        lambda: _model_inputs(root, model_id, where), "fingerprinting the model"
    )
    lm = load_lm(r.model, dtype, dev)
    check_fit(lm, list(r.specs), bins, chunks)
    settings: dict[str, Any] = {
        "kind": "llm-prefill",
        "model_fingerprint": lm.fingerprint,
        "data": source.name,
        "data_fingerprint": source.fingerprint,
        "bins": [b.name for b in bins],
        "chunk_sizes": chunks,
        "examples": r.examples,
        "seed": r.seed,
        "dtype": dtype,
    }
    check_run_dir(root, model_id, settings, inputs)  # creates nothing; refuses other settings
    chosen, found = distributed.from_rank0(
        lambda: select_examples(source, lm.tokenize, bins, chunks, r.examples, r.seed),
        "choosing the examples",
    )
    if not chosen:
        raise JbkvError(
            f"no example of {source.description} is long enough for any (bin, chunk size)"
        )
    short = {cell: n for cell, n in found.items() if n < r.examples}
    return Plan(r, lm, source, root, model_id, settings, inputs, chosen, short)


def run(plan: Plan) -> PrefillResult:
    """Open (or resume) the run folder, score every missing (example, variant) and, on rank 0,
    write RUN/report (and ``--json``); the files are all written when this returns."""
    from jbkv_cli.llm.evaluate import run_jobs
    from jbkv_cli.llm.report import build_rows, write_report
    from jbkv_cli.run.experiment import open_run

    r = plan.request
    llm_run = LlmRun(open_run(plan.root, plan.model_id, plan.settings, plan.inputs))
    if plan.short:
        cell, n = next(iter(plan.short.items()))
        warn(
            f"{len(plan.short)} (chunk, bin) cell(s) have fewer than {r.examples} long-enough "
            f"examples (e.g. {cell}: {n})"
        )
    jobs = run_jobs(
        plan.lm,
        llm_run,
        list(r.specs),
        plan.examples,
        diagnostics=r.diagnostics,
        backend=r.backend,
    )
    if not distributed.is_main():
        return PrefillResult(llm_run, jobs)
    rows = build_rows(llm_run)
    data, written = write_report(llm_run, rows, plots=r.plots)
    if r.json_path is not None:
        write_text_atomic(r.json_path, json.dumps(data, indent=2) + "\n")
        written.append(r.json_path)
    return PrefillResult(llm_run, jobs, rows, written)


def _check_plain(r: PrefillRequest) -> None:
    """The request's own values (the CLI's parser checks most of them; a library caller may
    not). The dtype is checked where it is resolved (after the device)."""
    if r.backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {shown(r.backend)}")
    if not 1 <= r.examples <= MAX_EXAMPLES:
        raise UsageError(f"--examples must be in 1..{MAX_EXAMPLES}, got {r.examples}")
    if not 0 <= r.seed <= MAX_SEED:
        raise UsageError(f"--seed must be in 0..{MAX_SEED}, got {r.seed}")
    if not r.specs:
        raise UsageError("no KV-cache variant to score")
    if r.bins is not None and not r.bins:
        raise UsageError("no --bins given")
    if r.chunk_sizes is not None and not r.chunk_sizes:
        raise UsageError("no --chunk-sizes given")
    if r.data is not None and not r.data.strip():
        raise UsageError("--data is empty: give longbench-pro, synthetic or a file")


def _model_inputs(root: Path, model_id: str, where: str) -> dict[str, Any]:
    """The model folder's files by content; a run at ``root`` made from other files is refused
    here, naming the file, before the model loads (:func:`jbkv_cli.run.directory.check_inputs`)."""
    from jbkv_cli.llm.models import folder_files
    from jbkv_cli.run.directory import check_inputs
    from jbkv_cli.run.fingerprints import fingerprint

    inputs = fingerprint(folder_files(where))
    check_inputs(root, model_id, inputs)
    return inputs


def check_fit(lm: LoadedLM, specs: list[KVSpec], bins: list[Bin], chunks: list[int]) -> None:
    """Every method stores this model's heads; the longest job fits its positions and its
    sliding window (jbkv attention has none); its config holds finite numbers only."""
    from jbkv_cli.llm.hosting import sliding_windows

    for spec in specs:
        for method in {spec.key, spec.value} - {None}:
            try:
                method.check(lm.head_dim)
            except ValueError as exc:
                raise UsageError(f"{method.label} on {lm.name}: {exc}") from None
    widest = max(bins, key=lambda b: b.hi)
    keys = widest.hi - 1 + max(chunks)  # the longest prefix and its chunk, read at once
    if lm.max_positions is not None and keys + 1 > lm.max_positions:
        raise UsageError(
            f"the longest job needs {keys + 1} positions (bin {widest.name} + chunk "
            f"{max(chunks)} + 1) but {lm.name} has {lm.max_positions}; use smaller --bins or "
            "--chunk-sizes"
        )
    bad = non_finite(lm.model.config.to_dict())
    if bad is not None:
        raise JbkvError(
            f"--model {shown(lm.name)}: its config sets {bad[0]} to {bad[1]}, not a finite number"
        )
    windows = sliding_windows(lm.model)
    if windows and keys > min(windows):
        raise UsageError(
            f"{lm.name} attends within a sliding window of {min(windows)} tokens but the "
            f"longest job reads {keys} keys (bin {widest.name} + chunk {max(chunks)}), and jbkv "
            "attention has no sliding window; use smaller --bins or --chunk-sizes"
        )


def non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first (dotted key, value) of a config's ``to_dict()`` that is a NaN or an infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if not isinstance(value, dict | list | tuple):
        return None
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        found = non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None
