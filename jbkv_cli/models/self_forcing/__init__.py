"""The Self-Forcing family (Wan2.1-T2V-1.3B, causal, few-step; LongLive's sink + window) via
diffusers, with jbkv's chunk KV cache."""

from jbkv_cli.models.self_forcing.model import SelfForcing, check_options, load_model

__all__ = ["SelfForcing", "check_options", "load_model"]
