"""SkyReels-V2 diffusion forcing (via diffusers) with jbkv's chunk KV cache."""

from jbkv_cli.models.wan.skyreels_v2.model import SkyReelsV2, check_options, input_paths, load_model

__all__ = ["SkyReelsV2", "check_options", "input_paths", "load_model"]
