"""``jbkv llm-prefill``: the paper's LLM cross-check (§5.4, App. O) on any Hugging Face causal LM.

Teacher-forced NLL of a current chunk predicted from a cached prefix stored by each variant
(reference, INT2/INT4 by method, with and without the correction), paired within (chunk size,
length bin, example). This module parses the options into a
:class:`~jbkv_cli.llm.job.PrefillRequest`, makes the one call :func:`~jbkv_cli.llm.job.prefill`
(which checks everything before it creates anything, runs and writes the report) and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jbkv_cli.cli.names import LLM_BACKENDS, LLM_DTYPES, method_names
from jbkv_cli.cli.options import (
    CLI_CORRECTIONS,
    DeviceOpt,
    MethodOptionOpt,
    choices,
    parse_group_sizes,
    parse_list,
    parse_method_options,
)
from jbkv_cli.llm.defaults import EMBEDDED_DEFAULTS, MAX_EXAMPLES, PAPER_DEFAULTS
from jbkv_cli.utils.console import err, out, plain
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fields import MAX_SEED

if TYPE_CHECKING:  # torch and transformers: the job imports them once the options are checked
    from jbkv_cli.kvcache.spec import KVSpec
    from jbkv_cli.llm.job import PrefillResult

Backend = choices("Backend", LLM_BACKENDS)
Dtype = choices("Dtype", LLM_DTYPES)


def _specs(bits: str, quantizers: str, corrections: str, groups: str, options) -> list[KVSpec]:
    bit_list = parse_list(bits, (2, 3, 4, 8), "bits", int)
    names = method_names()
    quant_list = (
        list(names) if quantizers.strip() == "all" else parse_list(quantizers, names, "quantizers")
    )
    corr_list = parse_list(corrections, CLI_CORRECTIONS, "corrections")
    group_list = parse_group_sizes(groups)
    opts = parse_method_options(options, names)
    from jbkv_cli.quant.registry import METHODS
    from jbkv_cli.run.experiment import build_matrix

    try:
        specs = build_matrix(bit_list, quant_list, corr_list, group_list, options=opts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if len(specs) == 1:
        bad = ", ".join(f"{q} ({METHODS[q].SUPPORTED_BITS})" for q in quant_list)
        raise UsageError(f"no method supports --bits {bits}: {bad}")
    return specs


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
            help="Cached-prefix length bins lo-hi (default: tiny "
            f"{EMBEDDED_DEFAULTS['bins']}; else {PAPER_DEFAULTS['bins']})."
        ),
    ] = None,
    chunk_sizes: Annotated[
        str | None,
        typer.Option(
            "--chunk-sizes",
            help=f"Current-chunk sizes (default: tiny {EMBEDDED_DEFAULTS['chunks']}; else "
            f"{PAPER_DEFAULTS['chunks']}).",
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
        int, typer.Option(min=1, max=MAX_EXAMPLES, help="Examples per (bin, chunk size).")
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
        Dtype, typer.Option(help="The reference's dtype; auto: float32 on CPU, bfloat16 on CUDA.")
    ] = Dtype.auto,
    device: DeviceOpt = None,
    backend: Annotated[Backend, typer.Option(help="Corrected attention's kernel.")] = Backend.fused,
) -> None:
    """Teacher-forced NLL of a current chunk over a quantized cached prefix (paper §5.4): the
    reference vs each variant, paired per example, by prefix-length bin and chunk size."""
    from jbkv_cli.llm.data import parse_bins, parse_sizes

    # an empty value is a usage error, not the default (None: the option was not given)
    bin_list = None if bins is None else tuple(parse_bins(bins))
    chunk_list = None if chunk_sizes is None else tuple(parse_sizes(chunk_sizes))
    specs = tuple(_specs(bits, quantizers, corrections, group_sizes, method_option))
    from jbkv_cli.llm.job import PrefillRequest, prefill

    request = PrefillRequest(
        specs=specs,
        model=model,
        data=data,
        bins=bin_list,
        chunk_sizes=chunk_list,
        examples=examples,
        seed=seed,
        out=out_dir,
        json_path=json_path,
        plots=plots,
        diagnostics=diagnostics,
        dtype=dtype.value,
        device=device,
        backend=backend.value,
    )
    result = prefill(request)
    if result.rows is not None:  # rank 0 (under torchrun the others only score)
        _print_result(result)


def _print_result(result: PrefillResult) -> None:
    """The jobs' line, the table and the files written (all written before this prints)."""
    jobs = result.jobs
    per_rank = (
        f" · per rank: {', '.join(map(str, jobs.per_rank))}" if len(jobs.per_rank) > 1 else ""
    )
    err.print(
        plain(jobs.scored, "bold")
        + plain(
            f" (example, variant) jobs scored, {jobs.skipped} already done · "
            f"{jobs.seconds:.1f} s · run: {result.run.root}{per_rank}"
        ),
        highlight=False,
    )
    print_rows(result.run, result.rows)
    err.print("wrote " + ", ".join(str(p) for p in result.written), highlight=False)


def _title(run) -> str:
    s = run.settings
    return (
        f"{run.manifest['model']} · teacher-forced NLL (nats/token) · reference {s.get('dtype')} "
        f"· data {s.get('data')} · seed {s.get('seed')}"
    )


def print_rows(run, rows) -> None:
    """An llm-prefill run's table, then each correction's ΔNLL against its uncorrected variant."""
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


def register(app: typer.Typer) -> None:
    app.command("llm-prefill")(llm_prefill)
