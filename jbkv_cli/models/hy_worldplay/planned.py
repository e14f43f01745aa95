"""HY-WorldPlay's encoders at full size on ``meta`` (no weight read), for ``jbkv plan``:
Qwen2.5-VL-7B's text model, ByT5-small's encoder with Glyph-SDXL-v2's tokens, FLUX.1-Redux's
SigLIP-so400m, each from its public ``config.json`` numbers, with tokenizers made in code that
pad to the same lengths as upstream's."""

from __future__ import annotations

import torch

from jbkv_cli.models.hy_worldplay.encoders import Encoders

QWEN_7B_TEXT = dict(  # Qwen/Qwen2.5-VL-7B-Instruct, text_config
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=128000,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
)
BYT5_SMALL = dict(  # google/byt5-small (encoder only; Glyph-SDXL-v2 adds 1,434 tokens)
    vocab_size=384 + 1434,
    d_model=1472,
    d_ff=3584,
    d_kv=64,
    num_layers=12,
    num_heads=6,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)
SIGLIP_SO400M = dict(  # google/siglip-so400m-patch14-384 (FLUX.1-Redux-dev image_encoder)
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=27,
    num_attention_heads=16,
    image_size=384,
    patch_size=14,
)


def planned_encoders(device: str, home: str, dtype: torch.dtype) -> Encoders:
    """The three encoders of the module docstring built on ``meta`` in ``dtype`` and moved to
    ``home`` (the host when offloading: the plan's device keeps them on ``meta``), run on
    ``device``."""
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        SiglipImageProcessor,
        SiglipVisionConfig,
        SiglipVisionModel,
        T5Config,
        T5EncoderModel,
    )

    from jbkv_cli.models.hy_worldplay.tiny import char_tokenizer

    with torch.device("meta"):
        qwen = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**QWEN_7B_TEXT))
        byt5 = T5EncoderModel(T5Config(**BYT5_SMALL))
        siglip = SiglipVisionModel(SiglipVisionConfig(**SIGLIP_SO400M))
    for module in (qwen, byt5, siglip):
        module.requires_grad_(False).eval().to(dtype).to(home)
    size = SIGLIP_SO400M["image_size"]
    return Encoders(
        qwen=qwen,
        qwen_tokenizer=char_tokenizer(),
        byt5=byt5,
        byt5_tokenizer=ByT5Tokenizer(),
        siglip=siglip,
        siglip_processor=SiglipImageProcessor(size={"height": size, "width": size}),
        device=device,
    )
