"""Rolling Forcing (TencentARC/RollingForcing): Wan2.1-T2V-1.3B made causal, denoised in a
rolling window of blocks at staggered noise levels, with an attention sink cached before RoPE."""

from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.wan.rolling_forcing.model import (
    RollingForcing,
    check_cases,
    check_options,
    input_paths,
    load_model,
    plan_model,
)

ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    check_cases=check_cases,
    plan_model=plan_model,
    plan_blocks=lambda model: model.components.transformer.blocks,
)

__all__ = ["ENTRY", "RollingForcing", "check_cases", "check_options", "input_paths", "load_model"]
