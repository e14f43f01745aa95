"""The jbkv command line: thin commands that parse, call the library and render."""

from __future__ import annotations

import os

import typer
from rich.table import Table
from typer.core import TyperGroup

from jbkv_cli import __version__
from jbkv_cli.console import error, out
from jbkv_cli.errors import JbkvError


class _Group(TyperGroup):
    """Maps known failures to one line on stderr and an exit code (also under CliRunner)."""

    def invoke(self, ctx):
        import click

        try:
            return super().invoke(ctx)
        except JbkvError as exc:
            error(str(exc))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            error("interrupted; finished results are kept, partial ones were discarded")
            raise typer.Exit(130) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("JBKV_DEBUG"):
                raise
            error(f"{type(exc).__name__}: {exc} (set JBKV_DEBUG=1 for the traceback)")
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Group,
    name="jbkv",
    help="KV-cache quantization and Jensen-bias correction for chunk-wise AR video diffusion.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"jbkv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """jbkv: measure what INT2/INT4 KV caches cost a video model, and what the correction wins back."""


def _register_commands() -> None:
    from jbkv_cli.commands import convert, experiment, fidelity, vbench

    experiment.register(app)
    fidelity.register(app)
    vbench.register(app)
    convert.register(app)


_register_commands()


@app.command("attention-demo")
def attention_demo(
    cached: int = typer.Option(512, min=1, help="Cached tokens."),
    current: int = typer.Option(128, min=1, help="Current-chunk tokens (queries)."),
    seed: int = typer.Option(0, help="Seed of the synthetic queries and keys."),
) -> None:
    """SYNTHETIC attention (random q/K, no video model): ΔP_S of INT2/INT4 with and without
    the correction."""
    from jbkv_cli.quant import KVSpec
    from jbkv_cli.synthetic import SyntheticConfig, synthetic_row

    cfg = SyntheticConfig(cached=cached, current=current, seed=seed)
    table = Table(
        title=f"Synthetic attention (random q/K; {cached} cached + {current} current "
        "tokens, 4 heads, d=64) — not a video model"
    )
    for col in ("variant", "eff. bits", "ΔP_S", "JSD", "output MSE", "noise var meas/pred"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for quantizer in ("rtn", "quarot"):
        for bits in (4, 2):
            for correction in ("none", "taylor", "exact"):
                row = synthetic_row(KVSpec(quantizer, bits, correction=correction), cfg)
                ratio = row["noise_measured_var"] / row["noise_predicted_var"]
                table.add_row(
                    row["variant"],
                    f"{row['effective_bits']:.3f}",
                    f"{row['delta_ps']:+.4f}",
                    f"{row['jsd']:.2e}",
                    f"{row['out_mse']:.2e}",
                    f"{ratio:.3f}",
                )
    out.print(table)


def main() -> None:
    """Entry point (console script ``jbkv`` and ``python -m jbkv_cli``)."""
    app()
