"""``jbkv attention-demo``: the Jensen bias on synthetic attention (random q/K, no video model),
every registered method at INT4/INT2 with each correction (:mod:`jbkv_cli.attention.synthetic`)."""

from __future__ import annotations

import typer
from rich.table import Table

from jbkv_cli.utils.console import out


def attention_demo(
    cached: int = typer.Option(512, min=1, help="Cached tokens."),
    current: int = typer.Option(128, min=1, help="Current-chunk tokens (queries)."),
    seed: int = typer.Option(0, help="Seed of the synthetic queries and keys."),
) -> None:
    """SYNTHETIC attention (random q/K, no video model): ΔP_S of INT2/INT4 with and without
    the correction."""
    from jbkv_cli.attention.synthetic import SyntheticConfig, synthetic_row
    from jbkv_cli.kvcache import KVSpec
    from jbkv_cli.quant.registry import METHODS

    cfg = SyntheticConfig(cached=cached, current=current, seed=seed)
    table = Table(
        title=f"Synthetic attention (random q/K; {cached} cached + {current} current "
        "tokens, 4 heads, d=64) — not a video model"
    )
    cols = ("variant", "eff. bits", "ΔP_S", "Δlog Z", "pred/Δ", "JSD", "output MSE")
    for col in (*cols, "noise var meas/pred"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for quantizer, method in METHODS.items():
        for bits in (b for b in (4, 2) if b in method.SUPPORTED_BITS):
            for correction in ("none", "taylor", "exact", "signed"):
                row = synthetic_row(KVSpec.build(quantizer, bits, correction=correction), cfg)
                # a method keeping every cached token exact (KIVI's residual) records nothing
                pred = row.get("noise_predicted_var")
                ratio = row["noise_measured_var"] / pred if pred else None
                table.add_row(
                    row["variant"],
                    f"{row['effective_bits']:.3f}",
                    *(
                        "—" if v is None else format(v, f)
                        for v, f in zip(
                            (
                                row["delta_ps"],
                                row.get("lp_shift"),
                                row.get("lp_ratio"),
                                row["jsd"],
                                row["out_mse"],
                                ratio,
                            ),
                            ("+.4f", "+.4f", "+.2f", ".2e", ".2e", ".3f"),
                            strict=True,
                        )
                    ),
                )
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("attention-demo")(attention_demo)
