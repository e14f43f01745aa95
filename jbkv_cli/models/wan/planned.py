"""The Wan parts at full size on ``meta`` (no weight allocated, none read), for ``jbkv plan``:
a transformer of the given class and config, the Wan 2.1 VAE, the UMT5-XXL encoder and a
character tokenizer that pads to the same length as UMT5's."""

from __future__ import annotations

from typing import Any

import torch

from jbkv_cli.models.t5_xxl import XXL_SHAPE
from jbkv_cli.models.wan.tiny import tiny_tokenizer
from jbkv_cli.models.wan.weights import cast_keeping_fp32

# google/umt5-xxl's config.json (the text_encoder/ of the Wan2.1 and SkyReels-V2 repos)
UMT5_XXL = dict(XXL_SHAPE, vocab_size=256384, dropout_rate=0.0)


def planned_parts(
    transformer_cls: Any, config: dict[str, Any], dtype: torch.dtype, max_length: int
) -> tuple[Any, Any, Any, Any]:
    """``(transformer, vae, text_encoder, tokenizer)`` on ``meta``: ``transformer_cls(**config)``
    cast as ``from_pretrained(torch_dtype=dtype)`` casts it (diffusers' float32 modules kept),
    diffusers' default ``AutoencoderKLWan`` (= Wan 2.1's VAE) in float32, UMT5-XXL
    (:data:`UMT5_XXL`) in ``dtype``, and a character tokenizer padding to ``max_length``."""
    import diffusers
    import transformers

    with torch.device("meta"):
        transformer = transformer_cls(**config)
        vae = diffusers.AutoencoderKLWan()
        text_encoder = transformers.UMT5EncoderModel(transformers.UMT5Config(**UMT5_XXL))
    cast_keeping_fp32(transformer, dtype)
    text_encoder.to(dtype)
    for module in (transformer, vae, text_encoder):
        module.eval().requires_grad_(False)
    tokenizer = tiny_tokenizer()
    tokenizer.model_max_length = max_length
    return transformer, vae, text_encoder, tokenizer
