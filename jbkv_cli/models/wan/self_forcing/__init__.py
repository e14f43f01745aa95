"""The Self-Forcing family (Wan2.1-T2V-1.3B, causal, few-step; LongLive's sink + window;
Causal-Forcing / Causal-Forcing++ chunk- and frame-wise, image-to-video) via diffusers, with
jbkv's chunk KV cache."""

from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.wan.self_forcing.model import (
    SelfForcing,
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
    plan_options={"steps": 1},  # every step the same forward (docs/plan.md)
    plan_blocks=lambda model: model.components.transformer.blocks,
)

__all__ = ["ENTRY", "SelfForcing", "check_cases", "check_options", "input_paths", "load_model"]
