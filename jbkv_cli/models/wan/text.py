"""The UMT5 prompt embedding both Wan reference pipelines use."""

from __future__ import annotations

import html
from typing import Any

import torch


def encode_umt5(
    tokenizer: Any, text_encoder: Any, text: str, max_length: int, device: str, dtype: torch.dtype
) -> torch.Tensor:
    """UMT5 embedding ``[1, max_length, text_dim]`` of ``text``, zero past its tokens.

    The prompt is cleaned as the Wan pipelines do (HTML entities unescaped twice, whitespace
    collapsed); the encoder runs where its parameters are, the result goes to ``device``.
    """
    text = " ".join(html.unescape(html.unescape(text)).split())
    tokens = tokenizer(
        [text],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    where = next(text_encoder.parameters()).device
    mask = tokens.attention_mask.to(where)
    hidden = text_encoder(tokens.input_ids.to(where), mask).last_hidden_state
    hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
    return hidden.to(device, dtype)
