"""Rolling Forcing (TencentARC/RollingForcing): Wan2.1-T2V-1.3B made causal, denoised in a
rolling window of blocks at staggered noise levels, with an attention sink cached before RoPE."""

from jbkv_cli.models.wan.rolling_forcing.model import (
    RollingForcing,
    check_cases,
    check_options,
    input_paths,
    load_model,
)

__all__ = ["RollingForcing", "check_cases", "check_options", "input_paths", "load_model"]
