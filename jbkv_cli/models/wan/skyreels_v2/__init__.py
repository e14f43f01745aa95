"""SkyReels-V2 diffusion forcing (via diffusers) with jbkv's chunk KV cache."""

from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.wan.skyreels_v2.model import (
    SkyReelsV2,
    check_options,
    input_paths,
    load_model,
    plan_model,
)

ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    plan_model=plan_model,
    plan_options={"steps": 1},  # every step the same forward (docs/plan.md)
    plan_blocks=lambda model: model.components.transformer.blocks,
)

__all__ = ["ENTRY", "SkyReelsV2", "check_options", "input_paths", "load_model", "plan_model"]
