"""Which cache variants a command runs: ``generate``'s one (:class:`CacheFlags`) and
``quantize-eval``'s sweep (:class:`SweepFlags`), each an option group that validates itself.

Every check happens in :meth:`CacheFlags.spec` / :meth:`SweepFlags.specs`, before a model is
loaded or a file is created; what depends on the model (its head dim, its head layout) is
checked by the command once the model is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer

from jbkv_cli.cli.groups import OptionGroup
from jbkv_cli.cli.names import method_names, pruner_names
from jbkv_cli.cli.options import (
    CLI_CORRECTIONS,
    MethodOptionOpt,
    parse_group_sizes,
    parse_list,
    parse_method_options,
)
from jbkv_cli.run.ablations import ABLATIONS
from jbkv_cli.run.bit_specs import (
    SIDE_WIDTHS,
    BitPair,
    LayerBits,
    parse_bit_list,
    parse_bit_spec,
    side_bits,
)
from jbkv_cli.utils.errors import UsageError, shown

if TYPE_CHECKING:  # torch: the variants are built once the options are checked
    from jbkv_cli.kvcache.spec import KVSpec
    from jbkv_cli.prune.base import KVPruner

DEFAULT_GRID = {"bits": "2,4", "group_sizes": None, "quantizers": "rtn,quarot"}  # None: each
# method's own group size (KVMethod.default_group_size: 32, QVG and QuantWM 64)
FRONTIER = {"bits": "2,3,4", "group_sizes": "16,32,64,128", "quantizers": "all"}


def method_options(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``-M METHOD.KEY=VALUE`` items, scoped to a method or a pruner and parsed."""
    return parse_method_options(items, (*method_names(), *pruner_names()))


def build_spec(*args: Any, **kwargs: Any) -> KVSpec:
    """:meth:`KVSpec.build`, with a bad combination as a usage error."""
    from jbkv_cli.kvcache.spec import KVSpec

    try:
        return KVSpec.build(*args, **kwargs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def profile_paths(specs: list[KVSpec], model: str) -> list[Path]:
    """The head profiles the variants' pruners read for ``model`` (``-M NAME.profile=FILE``,
    else the one shipped for it)."""
    pruners = dict.fromkeys(s.pruner for s in specs if s.pruner is not None)
    return [p.profile_path(model) for p in pruners if hasattr(p, "profile_path")]


def pruner_from(name: str, options: dict[str, dict[str, Any]]) -> KVPruner | None:
    """The ``--pruner`` (None for ``none``), its ``-M NAME.KEY=VALUE`` options applied."""
    if name == "none":
        return None
    if name not in pruner_names():
        raise UsageError(
            f"--pruner must be none or one of {', '.join(pruner_names())}, got {shown(name)}"
        )
    from jbkv_cli.prune.registry import build_pruner

    try:
        return build_pruner(name, **options.get(name, {}))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class CacheFlags(OptionGroup):
    """``generate``'s cache: its bits (per side), method, correction, pruner or ablation."""

    panel: ClassVar[str] = "Cache"
    bits: Annotated[
        str,
        typer.Option(
            "--bits",
            "-b",
            help="Cache bits: 1, 2, 3, 4, 8 (per method), or 16; K<bits>V<bits>; per layer, "
            "e.g. K2V2@0-3+K2V1@4-; or asymkv:LK/LV (docs/corrections.md).",
        ),
    ] = "16"
    bf16: Annotated[bool, typer.Option("--bf16", help="Same as --bits 16.")] = False
    key_bits: Annotated[
        int | None,
        typer.Option("--key-bits", help="Bits of the cached keys (default --bits; 16: exact)."),
    ] = None
    value_bits: Annotated[
        int | None,
        typer.Option("--value-bits", help="Bits of the cached values (default --bits; 16: exact)."),
    ] = None
    correct: Annotated[
        bool, typer.Option("--correct/--no-correct", help="Apply the Jensen-bias correction.")
    ] = False
    correction: Annotated[
        str,
        typer.Option(
            "--correction",
            help="Correction used by --correct: "
            + ", ".join(c for c in CLI_CORRECTIONS if c != "none")
            + ".",
        ),
    ] = "taylor"
    quantizer: Annotated[
        str, typer.Option("--quantizer", "-q", help=f"Method: {', '.join(method_names())}.")
    ] = "rtn"
    group_size: Annotated[
        int | None,
        typer.Option(
            "--group-size",
            "-g",
            help="Group size of the method (channels) [default: the method's source's: 32; "
            "qvg and quantwm 64].",
        ),
    ] = None
    method_option: MethodOptionOpt = None
    pruner: Annotated[
        str,
        typer.Option("--pruner", help=f"Pruner: none or {', '.join(pruner_names())}."),
    ] = "none"
    ablation: Annotated[
        str | None, typer.Option("--ablation", help="keys-only, values-only or bias-only.")
    ] = None

    def _bits(self) -> BitPair | LayerBits:
        """``--bits`` (with ``--key-bits`` / ``--value-bits`` / ``--bf16``) as one spec (a
        Python caller may give ``bits`` as a width)."""
        text = "16" if self.bf16 else str(self.bits).strip()
        if text.isdigit() and int(text) in SIDE_WIDTHS:
            return side_bits(int(text), self.key_bits, self.value_bits)
        if text.isdigit():
            raise UsageError(f"--bits must be one of 1, 2, 3, 4, 8, 16, got {text}")
        try:
            parsed = parse_bit_spec(text)
        except ValueError as exc:
            raise UsageError(f"bad --bits: {exc}") from None
        if self.key_bits is not None or self.value_bits is not None:
            raise UsageError(
                f"--bits {text} sets keys and values already; leave out --key-bits/--value-bits"
            )
        return parsed

    def spec(self) -> KVSpec:
        """The one variant these flags name; every bad combination is a usage error."""
        bits = self._bits()
        layers = bits if isinstance(bits, LayerBits) else None
        if layers is not None:  # checked per layer below; the pair stands for its widths
            keys = [w for w in layers.widths("key") if w != 16]
            values = [w for w in layers.widths("value") if w != 16]
            pair = BitPair(keys[0] if keys else 16, values[0] if values else 16)
        else:
            pair = bits
        active = [c for c in CLI_CORRECTIONS if c != "none"]
        if self.correction not in active:
            choices = f"{', '.join(active[:-1])} or {active[-1]}"
            raise UsageError(f"--correction must be {choices}, got {shown(self.correction)}")
        if self.quantizer not in method_names():
            raise UsageError(
                f"--quantizer must be one of {', '.join(method_names())}, "
                f"got {shown(self.quantizer)}"
            )
        options = method_options(self.method_option)
        pruner = pruner_from(self.pruner, options)
        ablation, correct = self.ablation, self.correct
        if pruner is not None and ablation:
            raise UsageError("--pruner goes with full variants, not with --ablation")
        if pair.key == pair.value == 16 and (correct or ablation):
            raise UsageError("--correct and --ablation need a quantized cache (--bits 2/3/4/8)")
        if correct and pair.key == 16:
            raise UsageError("--correct needs quantized keys (--key-bits 2/3/4/8)")
        if ablation is not None and (layers is not None or not pair.uniform):
            raise UsageError(
                "--ablation goes with one --bits for keys and values, not --key-bits/"
                "--value-bits or a per-layer spec"
            )
        if ablation is not None and ablation not in ABLATIONS:
            raise UsageError(
                f"--ablation must be one of {', '.join(ABLATIONS)}, got {shown(ablation)}"
            )
        if ablation == "bias-only" and correct:
            raise UsageError("--ablation bias-only adds the bias; it cannot be --correct-ed")
        if self.group_size is not None and self.group_size < 1:
            raise UsageError(
                f"--group-size must be a positive channel count, got {self.group_size}"
            )
        from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
        from jbkv_cli.quant.registry import METHODS

        if pair.key == pair.value == 16:
            return FULL_PRECISION if pruner is None else KVSpec(pruner=pruner)
        kw = ABLATIONS.get(ablation or "", {}) | options.get(self.quantizer, {})
        group = self.group_size or METHODS[self.quantizer].default_group_size()
        return build_spec(
            self.quantizer,
            pair.key,
            group,
            self.correction if correct else "none",
            pruner=pruner,
            value_bits=pair.value,
            layers=layers,
            **kw,
        )


@dataclass(frozen=True)
class SweepFlags(OptionGroup):
    """``quantize-eval``'s grid: bits × group sizes × methods × corrections (× pruners, ablations)."""

    panel: ClassVar[str] = "Sweep"
    bits: Annotated[
        str | None,
        typer.Option(
            "--bits",
            help="Bit widths, or K<bits>V<bits> for keys and values apart (16: that side "
            "exact), per layer (K2V2@0-3+K2V1@4-) or asymkv:LK/LV, e.g. 4,K4V2,K2V16 "
            "[default: 2,4; --frontier: 2,3,4].",
        ),
    ] = None
    group_sizes: Annotated[
        str | None,
        typer.Option(
            "--group-sizes",
            help="Group sizes [default: each method's source's, 32 (qvg, quantwm: 64); "
            "--frontier: 16,32,64,128].",
        ),
    ] = None
    quantizers: Annotated[
        str | None,
        typer.Option(
            "--quantizers",
            help=f"Methods, a comma list or all ({', '.join(method_names())}) "
            "[default: rtn,quarot; --frontier: all].",
        ),
    ] = None
    method_option: MethodOptionOpt = None
    corrections: Annotated[
        str, typer.Option("--corrections", help=f"Corrections: {','.join(CLI_CORRECTIONS)}.")
    ] = "none,taylor"
    pruners: Annotated[
        str,
        typer.Option(
            "--pruners",
            help=f"Pruners: none,{','.join(pruner_names())}; each one prunes every quantized "
            "variant and adds its 16-bit pruned variant, the second reference a correction's "
            "gain on the pruned cache is scored against.",
        ),
    ] = "none"
    frontier: Annotated[
        bool,
        typer.Option(
            "--frontier",
            help="The storage–quality sweep: bits 2,3,4 × group sizes 16,32,64,128 × all "
            "methods (each where it is defined) × corrections; draws RUN/report/frontier.png.",
        ),
    ] = False
    ablations: Annotated[
        str,
        typer.Option(
            "--ablations",
            help="Also run keys-only,values-only,bias-only (comma list; '' for none).",
        ),
    ] = ""

    def specs(self) -> list[KVSpec]:
        """Every variant of the grid (the reference first); a bad list is a usage error."""
        sweep = FRONTIER if self.frontier else DEFAULT_GRID
        bit_list = parse_bit_list(self.bits or sweep["bits"])
        chosen = self.group_sizes or sweep["group_sizes"]
        groups = None if chosen is None else parse_group_sizes(chosen)
        names = method_names()
        quantizers = self.quantizers or sweep["quantizers"]
        quant_list = (
            list(names)
            if quantizers.strip() == "all"
            else parse_list(quantizers, names, "quantizers")
        )
        corr_list = parse_list(self.corrections, CLI_CORRECTIONS, "corrections")
        prune_list = parse_list(self.pruners, ("none", *pruner_names()), "pruners")
        abl_list = (
            parse_list(self.ablations, tuple(ABLATIONS), "ablations")
            if self.ablations.strip()
            else []
        )
        options = method_options(self.method_option)
        from jbkv_cli.quant.registry import METHODS
        from jbkv_cli.run.experiment import build_matrix, supports

        for bits in bit_list if self.bits else []:  # a default grid's widths: where defined
            if not any(supports(q, bits) for q in quant_list):
                have = "; ".join(
                    f"{q}: {', '.join(map(str, METHODS[q].SUPPORTED_BITS))}" for q in quant_list
                )
                raise UsageError(f"--bits {bits}: no chosen method supports its widths ({have})")
        try:
            return build_matrix(
                bit_list, quant_list, corr_list, groups, abl_list, options, prune_list
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
