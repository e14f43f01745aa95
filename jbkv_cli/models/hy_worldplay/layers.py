"""HY-WorldPlay's building blocks with upstream parameter names (a port, from reading).

Sources, Tencent-Hunyuan/HY-WorldPlay@da2d0c2 ``hyvideo/models/transformers/modules/``:
``embed_layers.py`` (``TimestepEmbedder``, ``TextProjection``, ``VisionProjection``),
``mlp_layers.py`` (``MLP``, ``FinalLayer``), ``modulate_layers.py`` (``ModulateDiT``,
``modulate``, ``apply_gate``), ``norm_layers.py`` (``RMSNorm``), ``token_refiner.py``
(``SingleTokenRefiner``) and ``text_encoders/byT5/__init__.py`` (``ByT5Mapper``).

Modulation here takes ``[B, C]`` (one vector per sample: the text stream) or ``[B, L, C]`` (one
per token: the vision stream, whose every token carries its latent's timestep and action);
upstream flattens the per-token case to ``[(B L), C]`` and reshapes it back, which is the same
arithmetic.

Casting: upstream's pipeline runs every transformer call under ``torch.autocast("cuda",
bfloat16)`` (``worldplay_video_pipeline.py``, ``_ar_rollout_inner``) over bf16 weights, so
``layer_norm`` runs in float32 and returns float32, the modulation after it is float32
(``modulate`` casts shift and scale to ``x``'s dtype), and every ``linear``/``conv`` casts its
input to bf16. :class:`LayerNorm` and :class:`Linear` state those two rules explicitly (every
LayerNorm and Linear here is one of them), so the same code runs upstream's casting on a CPU
or a GPU, with jbkv's cache code outside any autocast region; a float32 model is unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed in float32 and returned in float32 (CUDA autocast's rule for
    ``layer_norm``; module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps)


class Linear(nn.Linear):
    """``nn.Linear`` on its input cast to the weight's dtype (CUDA autocast's rule for
    ``linear``: a float32 norm or modulation output enters the bf16 matmul)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps)`` in float32, cast back, then ``* weight``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return out * self.weight


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """GLIDE's sinusoidal embedding ``[cos(t f) | sin(t f)]``, ``f = exp(-ln(P) i / (dim/2))``,
    computed in float32 (``embed_layers.timestep_embedding``)."""
    half = dim // 2
    steps = torch.arange(half, dtype=torch.float32, device=t.device)  # made on the device
    freqs = torch.exp(-math.log(max_period) * steps / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    """``mlp = [Linear(256, C), SiLU, Linear(C, C)]`` on the sinusoidal embedding (also the
    action embedder ``action_in``: an integer label 0..80 embedded like a timestep)."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            Linear(frequency_embedding_size, hidden_size),
            nn.SiLU(),
            Linear(hidden_size, hidden_size),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freq = timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(freq.type(self.mlp[0].weight.dtype))


class MLP(nn.Module):
    """``fc2(act(fc1(x)))``."""

    def __init__(self, dim: int, hidden: int, act: nn.Module) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.act = act
        self.fc2 = Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def gelu_tanh() -> nn.Module:
    return nn.GELU(approximate="tanh")


class ModulateDiT(nn.Module):
    """``linear(silu(vec))``: ``factor`` modulation vectors of width ``C``."""

    def __init__(self, hidden_size: int, factor: int) -> None:
        super().__init__()
        self.act = nn.SiLU()
        self.linear = Linear(hidden_size, factor * hidden_size)

    def forward(self, vec: torch.Tensor) -> torch.Tensor:
        return self.linear(self.act(vec))


def _per_token(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A modulation vector ``[B, C]`` or ``[B, L, C]`` broadcast against ``x`` ``[B, L, C]``."""
    return (m.unsqueeze(1) if m.ndim == 2 else m).type_as(x)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x (1 + scale) + shift``."""
    return x * (1 + _per_token(scale, x)) + _per_token(shift, x)


def apply_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * gate``."""
    return x * _per_token(gate, x)


class TextProjection(nn.Module):
    """``linear_2(act_1(linear_1(x)))`` (the refiner's pooled-context embedder)."""

    def __init__(self, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.linear_1 = Linear(in_channels, hidden_size)
        self.act_1 = nn.SiLU()
        self.linear_2 = Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act_1(self.linear_1(x)))


class VisionProjection(nn.Module):
    """``proj = [LayerNorm, Linear, GELU, Linear, LayerNorm]`` on SigLIP tokens."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            LayerNorm(input_dim),
            Linear(input_dim, input_dim),
            nn.GELU(),
            Linear(input_dim, output_dim),
            LayerNorm(output_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class ByT5Mapper(nn.Module):
    """``fc3(gelu(fc2(gelu(fc1(layernorm(x))))))`` (``use_residual=False``)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int, out_dim1: int) -> None:
        super().__init__()
        self.layernorm = LayerNorm(in_dim)
        self.fc1 = Linear(in_dim, hidden_dim)
        self.fc2 = Linear(hidden_dim, out_dim)
        self.fc3 = Linear(out_dim, out_dim1)
        self.act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act_fn(self.fc1(self.layernorm(x)))
        return self.fc3(self.act_fn(self.fc2(x)))


class IndividualTokenRefinerBlock(nn.Module):
    """Self-attention and an MLP over the text tokens, gated by the refiner's condition."""

    def __init__(self, hidden_size: int, heads_num: int, mlp_width_ratio: float = 4.0) -> None:
        super().__init__()
        self.heads_num = heads_num
        self.norm1 = LayerNorm(hidden_size, eps=1e-6)
        self.self_attn_qkv = Linear(hidden_size, 3 * hidden_size)
        self.self_attn_q_norm = nn.Identity()
        self.self_attn_k_norm = nn.Identity()
        self.self_attn_proj = Linear(hidden_size, hidden_size)
        self.norm2 = LayerNorm(hidden_size, eps=1e-6)
        self.mlp = MLP(hidden_size, int(hidden_size * mlp_width_ratio), nn.SiLU())
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        gate_msa, gate_mlp = self.adaLN_modulation(c).chunk(2, dim=-1)
        b, length, _ = x.shape
        qkv = self.self_attn_qkv(self.norm1(x)).view(b, length, 3, self.heads_num, -1)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, H, L, D]
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, length, -1)
        x = x + apply_gate(self.self_attn_proj(attn), gate_msa)
        return x + apply_gate(self.mlp(self.norm2(x)), gate_mlp)


class IndividualTokenRefiner(nn.Module):
    def __init__(self, hidden_size: int, heads_num: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            IndividualTokenRefinerBlock(hidden_size, heads_num) for _ in range(depth)
        )

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, c)
        return x


class SingleTokenRefiner(nn.Module):
    """``txt_in``: the Qwen hidden states refined by two blocks conditioned on the timestep and
    the mean of the valid tokens.

    Called with the valid tokens only (batch 1): upstream masks padded keys and drops padded
    rows afterwards, so the valid tokens' result is the same."""

    def __init__(
        self, in_channels: int, hidden_size: int, heads_num: int, depth: int, freq_dim: int = 256
    ) -> None:
        super().__init__()
        self.input_embedder = Linear(in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size, freq_dim)
        self.c_embedder = TextProjection(in_channels, hidden_size)
        self.individual_token_refiner = IndividualTokenRefiner(hidden_size, heads_num, depth)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        pooled = x.float().mean(dim=1)
        c = self.t_embedder(t) + self.c_embedder(pooled.to(x.dtype))
        return self.individual_token_refiner(self.input_embedder(x), c)


class FinalLayer(nn.Module):
    """``linear(modulate(norm_final(x), shift, scale))`` with per-token ``shift, scale``."""

    def __init__(self, hidden_size: int, out_size: int) -> None:
        super().__init__()
        self.norm_final = LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = Linear(hidden_size, out_size)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))
