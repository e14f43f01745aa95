"""``jbkv llm-prefill``: the paper's LLM cross-check (§5.4, App. O) on any Hugging Face causal LM.

Teacher-forced NLL of a current chunk predicted from a cached prefix stored by each variant
(reference, INT2/INT4 by method, with and without the correction), paired within (chunk size,
length bin, example). Library: :mod:`jbkv_cli.llm`; this module parses, validates before it
creates anything, runs, writes the report and prints it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from jbkv_cli.cli.options import (
    CLI_CORRECTIONS,
    DeviceOpt,
    MethodOptionOpt,
    parse_group_sizes,
    parse_list,
    parse_method_options,
    print_gate_outcome,
    resolve_device,
)
from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.quant.registry import METHODS, method_names
from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import check_writable_dir, write_text_atomic
from jbkv_cli.utils.console import err, out, plain, warn
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.fields import MAX_SEED

EMBEDDED_DEFAULTS = {"data": "synthetic", "bins": "128-256,256-512", "chunks": "32,64,128,256"}
PAPER_DEFAULTS = {
    "data": "longbench-pro",
    "bins": "256-512,512-1024",
    "chunks": "128,512,2048,8192",
}
BACKENDS = ("fused", "flex", "reference")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name or name).strip("._") or "model"


def _specs(bits: str, quantizers: str, corrections: str, groups: str, options) -> list[KVSpec]:
    from jbkv_cli.run.experiment import build_matrix

    bit_list = parse_list(bits, (2, 3, 4, 8), "bits", int)
    names = method_names()
    quant_list = (
        list(names) if quantizers.strip() == "all" else parse_list(quantizers, names, "quantizers")
    )
    corr_list = parse_list(corrections, CLI_CORRECTIONS, "corrections")
    group_list = parse_group_sizes(groups)
    opts = parse_method_options(options, names)
    try:
        specs = build_matrix(bit_list, quant_list, corr_list, group_list, options=opts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if len(specs) == 1:
        bad = ", ".join(f"{q} ({METHODS[q].SUPPORTED_BITS})" for q in quant_list)
        raise UsageError(f"no method supports --bits {bits}: {bad}")
    return specs


def _model_inputs(root: Path, model_id: str, where: str) -> dict[str, Any]:
    """The model folder's files by content; a run at ``root`` made from other files is refused
    here, naming the file, before the model loads (:func:`jbkv_cli.run.directory.check_inputs`)."""
    from jbkv_cli.llm.models import folder_files
    from jbkv_cli.run.directory import check_inputs
    from jbkv_cli.run.fingerprints import fingerprint

    inputs = fingerprint(folder_files(where))
    check_inputs(root, model_id, inputs)
    return inputs


def _check_fit(lm, specs: list[KVSpec], bins, chunks) -> None:
    """Every method stores this model's heads; the longest job fits its positions and its
    sliding window (jbkv attention has none); its config holds finite numbers only. Checked
    before anything is created."""
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
    bad = _non_finite(lm.model.config.to_dict())
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


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first (dotted key, value) of a config's ``to_dict()`` that is a NaN or an infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if not isinstance(value, dict | list | tuple):
        return None
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def llm_prefill(
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="tiny (the embedded LM), a Hugging Face model folder or hub id."
        ),
    ] = "tiny",
    data: Annotated[
        str | None,
        typer.Option(
            help="longbench-pro (after `jbkv weights fetch longbench-pro`), synthetic (the "
            "embedded LM's language), or a .jsonl/.json/text file (default: synthetic for "
            "tiny, else longbench-pro)."
        ),
    ] = None,
    bins: Annotated[
        str | None,
        typer.Option(
            help="Cached-prefix length bins lo-hi (default: tiny 128-256,256-512; else "
            "256-512,512-1024)."
        ),
    ] = None,
    chunk_sizes: Annotated[
        str | None,
        typer.Option(
            "--chunk-sizes",
            help="Current-chunk sizes (default: tiny 32,64,128,256; else 128,512,2048,8192).",
        ),
    ] = None,
    bits: Annotated[str, typer.Option(help="Bit widths of the cached prefix.")] = "2,4",
    quantizers: Annotated[
        str, typer.Option(help=f"Methods, a comma list or all ({', '.join(method_names())}).")
    ] = "rtn,quarot",
    corrections: Annotated[
        str, typer.Option(help=f"Corrections: {','.join(CLI_CORRECTIONS)}.")
    ] = "none,taylor",
    group_sizes: Annotated[str, typer.Option("--group-sizes", help="Group sizes.")] = "32",
    method_option: MethodOptionOpt = None,
    examples: Annotated[
        int, typer.Option(min=1, max=100_000, help="Examples per (bin, chunk size).")
    ] = 16,
    seed: Annotated[
        int, typer.Option(min=0, max=MAX_SEED, help="Seed of the example order and lengths.")
    ] = 0,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Run folder (default: runs/llm-prefill/MODEL)."),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result JSON here.")
    ] = None,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Write RUN/report/nll.png.")
    ] = True,
    diagnostics: Annotated[
        bool, typer.Option("--diagnostics/--no-diagnostics", help="ΔP_S / JSD of the prefix.")
    ] = True,
    dtype: Annotated[
        str, typer.Option(help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16.")
    ] = "auto",
    device: DeviceOpt = None,
    backend: Annotated[
        str, typer.Option(help="Corrected attention: fused (default), flex or reference.")
    ] = "fused",
) -> None:
    """Teacher-forced NLL of a current chunk over a quantized cached prefix (paper §5.4): the
    reference vs each variant, paired per example, by prefix-length bin and chunk size."""
    from jbkv_cli.llm.data import data_file, open_source, parse_bins, parse_sizes, select_examples
    from jbkv_cli.llm.models import EMBEDDED, load_lm, model_files, model_path, resolve_dtype
    from jbkv_cli.run.directory import check_run_dir

    if backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {shown(backend)}")
    embedded = model == EMBEDDED
    defaults = EMBEDDED_DEFAULTS if embedded else PAPER_DEFAULTS
    # an empty value is a usage error, not "the default" (None is: the option was not given)
    bin_list = parse_bins(defaults["bins"] if bins is None else bins)
    chunk_list = parse_sizes(defaults["chunks"] if chunk_sizes is None else chunk_sizes)
    specs = _specs(bits, quantizers, corrections, group_sizes, method_option)
    if data is not None and not data.strip():
        raise UsageError("--data is empty: give longbench-pro, synthetic or a file")
    data = defaults["data"] if data is None else data
    dev = resolve_device(device)
    dtype_name = resolve_dtype(dtype, dev)
    where, _ = model_path(model)
    model_id = (
        EMBEDDED if embedded else (str(Path(where).resolve()) if Path(where).is_dir() else where)
    )
    root = out_dir or Path("runs") / "llm-prefill" / _slug(model)
    longest = max(b.hi for b in bin_list) + max(chunk_list)
    source = open_source(data, seed, longest, embedded=embedded)
    if json_path is not None:  # not over a file of a run, nor over the data or the model
        reads = [p for p in [data_file(data), *model_files(model)] if p is not None]
        check_output_file(json_path, "--json", runs=[root], inputs=reads)
    distributed.setup(dev)
    inputs = distributed.from_rank0(
        lambda: _model_inputs(root, model_id, where), "fingerprinting the model"
    )
    lm = load_lm(model, dtype_name, dev)
    _check_fit(lm, specs, bin_list, chunk_list)
    settings: dict[str, Any] = {
        "kind": "llm-prefill",
        "model_fingerprint": lm.fingerprint,
        "data": source.name,
        "data_fingerprint": source.fingerprint,
        "bins": [b.name for b in bin_list],
        "chunk_sizes": chunk_list,
        "examples": examples,
        "seed": seed,
        "dtype": dtype_name,
    }
    check_run_dir(root, model_id, settings, inputs)  # creates nothing; refuses other settings
    plan = distributed.from_rank0(
        lambda: select_examples(source, lm.tokenize, bin_list, chunk_list, examples, seed),
        "choosing the examples",
    )
    chosen, found = plan
    short = {cell: n for cell, n in found.items() if n < examples}
    if not chosen:
        raise JbkvError(
            f"no example of {source.description} is long enough for any (bin, chunk size)"
        )
    from jbkv_cli.llm.evaluate import run_jobs
    from jbkv_cli.llm.run import LlmRun
    from jbkv_cli.run.experiment import open_run

    run = LlmRun(open_run(root, model_id, settings, inputs))
    if short:
        warn(
            f"{len(short)} (chunk, bin) cell(s) have fewer than {examples} long-enough examples "
            f"(e.g. {next(iter(short))}: {next(iter(short.values()))})"
        )
    result = run_jobs(lm, run, specs, chosen, diagnostics=diagnostics, backend=backend)
    if not distributed.is_main():
        return
    shows = _write(run, plots, json_path)
    err.print(
        plain(result.scored, "bold")
        + plain(
            f" (example, variant) jobs scored, {result.skipped} already done · "
            f"{result.seconds:.1f} s · run: {run.root}"
            + (
                f" · per rank: {', '.join(map(str, result.per_rank))}"
                if len(result.per_rank) > 1
                else ""
            )
        ),
        highlight=False,
    )
    for show in shows:
        show()


def _write(run, plots: bool, json_path: Path | None) -> list:
    """Write every file first, then return the printers (a failure while printing loses
    nothing)."""
    from functools import partial

    from jbkv_cli.llm.report import build_rows, write_report

    rows = build_rows(run)
    data, made = write_report(run, rows, plots=plots)
    if json_path is not None:
        write_text_atomic(json_path, json.dumps(data, indent=2) + "\n")
        made.append(json_path)
    return [partial(_print, run, rows), partial(_print_files, made)]


def _title(run) -> str:
    s = run.settings
    return (
        f"{run.manifest['model']} · teacher-forced NLL (nats/token) · reference {s.get('dtype')} "
        f"· data {s.get('data')} · seed {s.get('seed')}"
    )


def _print(run, rows) -> None:
    from jbkv_cli.llm.report import ALL, rich_table

    out.print(rich_table(rows, _title(run)), crop=False)
    for r in rows:
        if r.bin == ALL and r.d_unc is not None:
            se = f" ± {r.d_unc.se:.4f}" if r.d_unc.se is not None else ""
            out.print(
                plain(
                    f"  {r.correction} on {r.label.rsplit(' +', 1)[0]}, chunk {r.chunk}: "
                    f"ΔNLL {r.d_unc.mean:+.4f}{se} vs uncorrected (n={r.d_unc.n})"
                ),
                highlight=False,
            )


def _print_files(made: list[Path]) -> None:
    err.print("wrote " + ", ".join(str(p) for p in made), highlight=False)


def report_llm(
    run_dir: Path,
    fmt: str,
    plots: bool,
    baseline: Path | None,
    tolerance: str | None,
    score: bool,
) -> None:
    """``jbkv report RUN`` for an llm-prefill run: the table (or md/json/csv), the gate."""
    from jbkv_cli.llm.gate import check_baseline, load_baseline, parse_tolerances, summary
    from jbkv_cli.llm.report import build_rows, plot, to_json, to_markdown
    from jbkv_cli.llm.run import LlmRun

    if fmt not in ("table", "md", "json"):
        raise UsageError(
            f"--format for an llm-prefill run must be table, md or json, got {shown(fmt)}"
        )
    if score:
        raise UsageError("--score is for video runs; llm-prefill records already hold their NLL")
    tol = parse_tolerances(tolerance)
    base = load_baseline(baseline) if baseline is not None else None
    run = LlmRun.open(run_dir)
    if plots:
        check_writable_dir(run.root / "report", "report folder")
    rows = build_rows(run)
    made = [plot(rows, run.root / "report" / "nll.png")] if plots else []
    if fmt == "table":
        _print(run, rows)
    elif fmt == "md":
        typer.echo(to_markdown(rows), nl=False)
    else:
        typer.echo(json.dumps(to_json(run, rows), indent=2))
    for p in made:
        if p is not None:
            err.print(f"wrote {p}", highlight=False)
    if base is not None:
        gate = check_baseline(to_json(run, rows), base, tol)
        print_gate_outcome([] if gate.passed else gate.problems, summary(gate), baseline)


def register(app: typer.Typer) -> None:
    app.command("llm-prefill")(llm_prefill)
