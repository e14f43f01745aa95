"""A tiny, randomly initialised HY-WorldPlay (DiT, VAE and the three encoders) for CPU tests.

The same classes as the real model, every width small (:data:`~.config.TINY`): two
double-stream blocks of 2 heads x 32, a 4-channel VAE with 4x spatial compression, a 3-layer
Qwen2.5-VL text model with a character tokenizer that has Qwen's chat-template markers, a
1-layer ByT5 encoder (transformers' byte tokenizer) and a 1-layer SigLIP of 16 tokens. Every
DiT parameter is random and nonzero: upstream zero-initialises ``action_in``'s last layer,
each ``img_attn_prope_proj`` and the modulations, which would hide the action and camera
branches from the tests.
"""

from __future__ import annotations

import torch
from torch import nn

from jbkv_cli.models.hy_worldplay.config import TINY, DiTConfig
from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
from jbkv_cli.models.hy_worldplay.encoders import Encoders

TINY_QWEN_MAX_LENGTH = 64
TINY_VAE = {
    "latent_channels": 4,
    "block_out_channels": (8, 8, 8),
    "layers_per_block": 1,
    "spatial_compression_ratio": 4,
    "temporal_compression_ratio": 4,
}
_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def randomize(module: nn.Module, seed: int, std: float = 1.0) -> nn.Module:
    """Deterministic random values for every parameter: weights ``N(0, 1) / sqrt(fan_in)``,
    biases and norm weights ``N(0, 0.1)`` (norm weights around 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.ndim == 1:
                base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * noise)
            else:
                p.copy_(std * noise / max(1, p[0].numel()) ** 0.5)
    return module


def tiny_dit(cfg: DiTConfig = TINY, seed: int = 0) -> WorldPlayDiT:
    return randomize(WorldPlayDiT(cfg), seed).eval()


def tiny_vae(seed: int = 0):
    from jbkv_cli.models.hy_worldplay.vae import build_vae

    torch.manual_seed(seed + 1)  # diffusers initialises its own modules
    return build_vae(TINY_VAE).eval()


def char_tokenizer():
    """A character tokenizer with Qwen's ``<|im_start|>``/``<|im_end|>`` markers and a
    Qwen-style chat template (what ``apply_chat_template`` and the crop need)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(special + _CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        padding_side="right",
    )
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def tiny_encoders(cfg: DiTConfig = TINY, seed: int = 0, device: str = "cpu") -> Encoders:
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

    tok = char_tokenizer()
    torch.manual_seed(seed + 2)
    qwen = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=len(tok),
            hidden_size=cfg.text_states_dim,
            intermediate_size=2 * cfg.text_states_dim,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    )
    byt5 = T5EncoderModel(
        T5Config(
            vocab_size=384,
            d_model=cfg.byt5_dim,
            d_kv=8,
            d_ff=2 * cfg.byt5_dim,
            num_layers=1,
            num_heads=2,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
        )
    )
    siglip = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=cfg.vision_states_dim,
            intermediate_size=2 * cfg.vision_states_dim,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=4,
        )
    )
    for m in (qwen, byt5, siglip):
        m.float().eval().to(device)
    return Encoders(
        qwen=qwen,
        qwen_tokenizer=tok,
        byt5=byt5,
        byt5_tokenizer=ByT5Tokenizer(),
        siglip=siglip,
        siglip_processor=SiglipImageProcessor(size={"height": 16, "width": 16}),
        device=device,
        qwen_max_length=TINY_QWEN_MAX_LENGTH,
    )
