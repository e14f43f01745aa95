"""``jbkv calibrate``: KVQuant's calibration artifact for a model and setting
(:mod:`jbkv_cli.quant.kvquant_calibration`): the 16-bit reference generation on a few prompts
and seeds, every committed key (before RoPE where the model's caches can hold them so) and value
kept per layer, the fixed tables fitted and written as one safetensors file."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from jbkv_cli.cli.groups import Inputs, ModelFlags, check_model, load, model_paths, with_groups
from jbkv_cli.cli.options import MethodOptionOpt
from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.models.registry import DEFAULT_MODEL, MODELS
from jbkv_cli.utils.console import err
from jbkv_cli.utils.errors import UsageError

METHOD = "kvquant"
BITS = (2, 3, 4)  # jbkv_cli.quant.kvquant.KVQUANT_BITS (checked again when the method is built)


@with_groups
def calibrate(
    out_path: Annotated[
        Path, typer.Option("--out", help="The calibration file to write (.safetensors).")
    ],
    bits: Annotated[int, typer.Option("--bits", help="Code width: 2, 3 or 4.")],
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model: {', '.join(MODELS)}.")
    ] = DEFAULT_MODEL,
    method_option: MethodOptionOpt = None,
    inputs: Inputs = Inputs(),
    flags: ModelFlags = ModelFlags(),
) -> None:
    """Calibrate KVQuant (keys' per-channel thresholds, key and value codebooks per layer) on
    the 16-bit reference generation of the given prompts and seeds, written as the safetensors
    file `-M kvquant.calibration=FILE` reads (`-M kvquant.KEY=VALUE`: the method's options)."""
    if bits not in BITS:
        raise UsageError(f"--bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    if out_path.suffix != ".safetensors":
        raise UsageError(f"--out {out_path}: the calibration file must end in .safetensors")
    check_model(model)
    options = flags.options(model)
    items = inputs.items(model, options)
    reads = [*inputs.paths(model, items), *model_paths(model, options)]
    check_output_file(out_path, "--out", inputs=reads)
    from jbkv_cli.cli.options import parse_method_options
    from jbkv_cli.quant import kvquant_calibration as kc

    if out_path.exists() and not kc.written_by_calibrate(out_path):
        raise UsageError(
            f"--out {out_path} exists and was not written by jbkv calibrate; jbkv does not "
            "overwrite it: remove it or give another --out"
        )
    extra = parse_method_options(method_option, (METHOD,)).get(METHOD, {})
    if "calibration" in extra:
        raise UsageError("calibrate makes a calibration: -M kvquant.calibration does not go here")
    method, spec, layout = _setting(model, bits, extra)
    m = load(model, options)
    if layout == "pre-rope" and not m.pre_rope:
        raise UsageError(f"model {model} cannot cache keys before RoPE (layout=pre-rope)")
    if method.layout is None:
        layout = "pre-rope" if m.pre_rope else "post-rope"
    collector = kc.CommitCollector()
    run = spec(layout)
    for case, seeds in items:
        for seed in seeds:
            m.generate(case, seed, run, observer=collector)
    meta = kc.metadata(
        method,
        model,
        layout,
        [case.name for case, _ in items],
        [list(seeds) for _, seeds in items],
        m.settings,
    )
    given = [a for item in method_option or [] for a in ("-M", item)]
    argv = ["jbkv", "calibrate", "--model", model, "--bits", str(bits), *given]
    meta["command"] = shlex.join([*argv, *inputs.argv(), *flags.argv(), "--out", str(out_path)])
    cal = kc.fit_calibration(method, collector, meta)
    kc.save_calibration(cal, out_path)
    err.print(
        f"wrote {out_path}: {len(cal.layers)} layers, {sum(cal.nbytes_per_layer())} bytes of "
        "tables",
        highlight=False,
    )


def _setting(model: str, bits: int, extra: dict):
    """The KVQuant method of the options, and the reference spec to observe per key layout."""
    from jbkv_cli.kvcache.spec import FULL_PRECISION, ExactPreRope
    from jbkv_cli.quant.kvquant import KVQuant

    try:
        method = KVQuant(bits=bits, **extra)
    except ValueError as exc:
        raise UsageError(f"kvquant: {exc}") from None

    def spec(layout: str):
        return ExactPreRope() if layout == "pre-rope" else FULL_PRECISION

    return method, spec, method.layout or "pre-rope"


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


__all__ = ["calibrate", "register"]
