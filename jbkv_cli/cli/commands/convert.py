"""``jbkv convert-checkpoint``: a torch-pickle generator checkpoint, once, to safetensors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from jbkv_cli.utils.console import err


def register(app: typer.Typer) -> None:
    """Add ``convert-checkpoint`` to ``app``."""

    @app.command("convert-checkpoint")
    def convert_checkpoint(
        src: Annotated[
            Path, typer.Argument(help="Upstream .pt checkpoint (Self-Forcing, LongLive).")
        ],
        dst: Annotated[
            Path | None,
            typer.Argument(
                help="Output .safetensors (default: SRC with .safetensors, found there)."
            ),
        ] = None,
        ema: Annotated[
            bool, typer.Option("--ema/--no-ema", help="Take generator_ema (else generator).")
        ] = True,
        lora: Annotated[
            bool, typer.Option("--lora", help="SRC is a LoRA file (LongLive's lora.pt).")
        ] = False,
        glyph: Annotated[
            bool,
            typer.Option("--glyph", help="SRC is Glyph-SDXL-v2's byt5_model.pt (HY-WorldPlay)."),
        ] = False,
    ) -> None:
        """Write a generator (or LoRA) state dict as safetensors, with upstream names.

        The .pt is read with torch.load(weights_only=True): no pickle code ever runs. jbkv prefers
        a .safetensors next to a .pt of the same name, so the default DST is picked up by
        --model self-forcing. DST is never SRC, and a DST that convert-checkpoint did not write
        is not overwritten; the file is written atomically (complete or absent).
        """
        from jbkv_cli.models.wan.self_forcing.checkpoint import convert_checkpoint as convert

        target = dst if dst is not None else src.with_suffix(".safetensors")
        if glyph:
            from jbkv_cli.models.hy_worldplay.checkpoint import convert_glyph

            count = convert_glyph(src, target)
        else:
            count = convert(src, target, ema=ema, lora=lora)
        err.print(f"{count} tensors → {target}", highlight=False)
