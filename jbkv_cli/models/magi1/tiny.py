"""A tiny, randomly initialised MAGI-1 (DiT + T5 + VAE) built in memory for CPU tests.

Same code as the real model; only the sizes differ (:data:`~jbkv_cli.models.magi1.config.TINY_DIT`,
``TINY_VAE``, a 1-layer T5 with a character-level tokenizer).
"""

from __future__ import annotations

import torch
from torch import nn

from jbkv_cli.models.magi1.config import TINY_DIT, TINY_VAE, DiTConfig, VAEConfig
from jbkv_cli.models.magi1.dit import VideoDiT
from jbkv_cli.models.magi1.text import SpecialTokens, T5TextEncoder
from jbkv_cli.models.magi1.vae import ViTVAE

_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,;:!?-'\"()"


def char_tokenizer():
    """A T5-style (``</s>``-terminated, ``<pad>`` = 0) character tokenizer, fast and offline."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for c in _CHARS:
        vocab.setdefault(c, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_t5_config(d_model: int):
    """A 1-layer T5 v1.1-style (gated-GELU, untied) encoder config of width ``d_model``."""
    from transformers import T5Config

    return T5Config(
        vocab_size=len(_CHARS) + 3,
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=1,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )


def tiny_t5(d_model: int, max_length: int, seed: int = 0) -> T5TextEncoder:
    from transformers import T5EncoderModel

    torch.manual_seed(seed)
    model = T5EncoderModel(tiny_t5_config(d_model))
    return T5TextEncoder(char_tokenizer(), model.float(), max_length)


def randomize(module: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Deterministic random values for every parameter (norm weights near their identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("bands"):
                continue
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                base = 0.0 if _one_plus_norm(module, name) else 1.0
                p.copy_(base + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            else:
                fan_in = max(1, p[0].numel())
                p.copy_(noise / fan_in**0.5 if "null_caption" not in name else noise)
    return module


def _one_plus_norm(module: nn.Module, name: str) -> bool:
    owner = module.get_submodule(name.rsplit(".", 1)[0])
    return bool(getattr(owner, "one_plus", False))


def tiny_dit(cfg: DiTConfig = TINY_DIT, seed: int = 0) -> VideoDiT:
    return randomize(VideoDiT(cfg), seed)


def tiny_vae(cfg: VAEConfig = TINY_VAE, seed: int = 0) -> ViTVAE:
    return randomize(ViTVAE(cfg), seed + 1)


def tiny_special_tokens(channels: int, seed: int = 0) -> SpecialTokens:
    return SpecialTokens.random(channels, torch.Generator().manual_seed(seed + 2))
