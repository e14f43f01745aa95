"""The image encoder Matrix-Game-2.0 reads: the visual tower of Wan's open-CLIP XLM-RoBERTa
ViT-H/14 (``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``), through block 31.

Upstream: ``wan/vae/wanx_vae_src/clip.py`` of SkyworkAI/Matrix-Game's ``Matrix-Game-2`` folder
(read at hathibelagal-dev/Matrix-Game @38ee4f20): ``clip_xlm_roberta_vit_h_14`` —
224 × 224 input, patch 14 (conv without bias: ``pre_norm``), a class token, learned positions
(257), a LayerNorm before the blocks, 32 pre-norm blocks of 1280 channels (16 heads,
``to_qkv`` / ``proj``, an MLP of 5120 with exact GELU), LayerNorms in float32, ε = 1e−5.
``CLIPModel.encode_video`` resizes the [−1, 1] frame bicubically to 224 (``align_corners``
False), maps it to [0, 1] and normalises with CLIP's mean and std, and returns the tokens
after the first 31 blocks (``use_31_block``): ``[1, 257, 1280]``. Block 32, the post-norm, the
head and the text tower are not used, so not built; their keys are skipped on loading.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


class LayerNorm32(nn.LayerNorm):
    """LayerNorm computed in float32 (upstream's ``LayerNorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        q, k, v = self.to_qkv(x).view(b, s, 3, self.heads, -1).unbind(2)
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        return self.proj(out.transpose(1, 2).reshape(b, s, c))


class AttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.norm1 = LayerNorm32(dim, eps=1e-5)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = LayerNorm32(dim, eps=1e-5)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """``XLMRobertaCLIP.visual`` through ``blocks`` blocks (upstream keys, prefix ``visual.``)."""

    def __init__(
        self,
        image_size: int = 224,
        patch: int = 14,
        dim: int = 1280,
        heads: int = 16,
        blocks: int = 31,
    ) -> None:
        super().__init__()
        self.image_size = image_size
        self.patch_embedding = nn.Conv2d(3, dim, kernel_size=patch, stride=patch, bias=False)
        self.cls_embedding = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2 + 1, dim))
        self.pre_norm = LayerNorm32(dim, eps=1e-5)
        self.transformer = nn.Sequential(*(AttentionBlock(dim, heads) for _ in range(blocks)))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[1, 3, H, W]`` in [−1, 1] → tokens ``[1, 257, 1280]`` (``encode_video``)."""
        size = (self.image_size, self.image_size)
        x = F.interpolate(pixels, size=size, mode="bicubic", align_corners=False)
        mean = torch.tensor(MEAN, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        std = torch.tensor(STD, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        x = ((x * 0.5 + 0.5) - mean) / std
        x = x.to(self.patch_embedding.weight.dtype)
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pre_norm(x + self.pos_embedding)
        return self.transformer(x)


def visual_state(state: dict[str, torch.Tensor], blocks: int = 31) -> dict[str, torch.Tensor]:
    """The ``visual.*`` tensors of a CLIP checkpoint that :class:`VisionTower` reads (prefix
    dropped; blocks past ``blocks``, ``post_norm``, ``head`` and the text tower skipped)."""
    out = {}
    for key, value in state.items():
        if not key.startswith("visual."):
            continue
        name = key[len("visual.") :]
        if name.startswith(("post_norm.", "head")):
            continue
        if name.startswith("transformer.") and int(name.split(".")[1]) >= blocks:
            continue
        out[name] = value
    return out
