"""Tiny random stand-ins of the Wan parts — transformer, Wan VAE, UMT5 encoder and a
character-level tokenizer made in code — so whole generation paths run on a CPU in tests."""

from __future__ import annotations

import string
from typing import Any

import torch

from jbkv_cli.models.wan.weights import cast_keeping_fp32

TINY_TEXT_DIM = 32

TINY_MAX_SEQUENCE_LENGTH = 16


def tiny_tokenizer() -> Any:
    """A character-level tokenizer (pad 0, eos 1, unk 2 as in T5/UMT5), built without files."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    symbols = string.ascii_letters + string.digits + string.punctuation
    vocab = {token: i for i, token in enumerate(specials + list(symbols))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=TINY_MAX_SEQUENCE_LENGTH,
    )


# diffusers' tiny Wan test transformer, except attention_head_dim = 32 (12 upstream) so that
# the default quantization group g = 32 divides the head dim.
TINY_WAN_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,
    in_channels=16,
    out_channels=16,
    text_dim=TINY_TEXT_DIM,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)


def tiny_parts(transformer_cls: Any, seed: int, dtype: torch.dtype) -> tuple[Any, Any, Any, Any]:
    """``(transformer, vae, text_encoder, tokenizer)``: ``transformer_cls(**TINY_WAN_TRANSFORMER)``
    and the tiny VAE / UMT5 / tokenizer, random from ``seed`` (the global RNG is left untouched),
    in eval mode; transformer (keeping diffusers' fp32 modules) and text encoder in ``dtype``."""
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = transformer_cls(**TINY_WAN_TRANSFORMER)
        vae, text_encoder = tiny_vae_and_text_encoder(len(tokenizer))
    for module in (transformer, vae, text_encoder):
        module.eval().requires_grad_(False)
    if dtype != torch.float32:
        cast_keeping_fp32(transformer, dtype)
        text_encoder.to(dtype)
    return transformer, vae, text_encoder, tokenizer


def tiny_vae_and_text_encoder(vocab_size: int) -> tuple[Any, Any]:
    """diffusers' tiny Wan VAE (base_dim 3, z_dim 16, 8x spatial, 4x temporal) and a 2-layer
    UMT5 encoder of width :data:`TINY_TEXT_DIM`, randomly initialised from the global RNG."""
    import diffusers
    import transformers

    vae = diffusers.AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    text_config = transformers.UMT5Config(
        vocab_size=vocab_size,
        d_model=TINY_TEXT_DIM,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
    )
    return vae, transformers.UMT5EncoderModel(text_config)
