"""Tiny random Llama / Mistral / Qwen2 causal LMs (built here, nothing downloaded)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from jbkv_cli.llm.tiny.corpus import CorpusConfig

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # q/k/v projections with biases
}
VOCAB = CorpusConfig().vocab_size  # so the embedded LM's tokenizer fits the random models


def tiny_lm(arch: str, seed: int = 0, **overrides):
    """A 2-layer model with GQA (4 query heads over 2 KV heads, head dim 32), fp32, eval."""
    config_cls, model_cls, extra = ARCHS[arch]
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = model_cls(config_cls(**(kw | extra | overrides)))
    # random init gives near-uniform attention; sharpen the scores so attention (and the
    # quantization of the keys) matters
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return model.eval().requires_grad_(False)


@pytest.fixture(params=list(ARCHS))
def arch(request) -> str:
    return request.param
