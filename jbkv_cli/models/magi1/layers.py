"""MAGI-1 DiT building blocks, with upstream's module and parameter names.

Precision follows upstream inference: the model runs in its compute dtype (BF16 on GPU) except
the *fp32 islands* — patch/timestep/caption embedders, final linear, rotary bands, the self-attention
q/k norms, the two post-norms and the final norm — which hold float32 parameters (see
:func:`promote_high_precision`), and the output projection, computed in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from jbkv_cli.models.magi1.config import DiTConfig


class ZeroCenteredLayerNorm(nn.Module):
    """LayerNorm whose scale is ``weight + 1`` when ``apply_layernorm_1p`` (upstream ``FusedLayerNorm``).

    ``y = (x - μ) / sqrt(σ² + ε) · (w + 1) + b``; ``w + 1`` is formed in the parameter dtype.
    """

    def __init__(self, size: int, eps: float, one_plus: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps
        self.one_plus = one_plus

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + 1 if self.one_plus else self.weight
        return F.layer_norm(x, (x.shape[-1],), w, self.bias, self.eps)


class TimestepEmbedder(nn.Module):
    """``t ↦ MLP([cos(1000 t ω_i), sin(1000 t ω_i)])``, ``ω_i = 10000^(-i/(n/2))``."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.freq_dim = cfg.frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(self.freq_dim, cfg.cond_dim), nn.SiLU(), nn.Linear(cfg.cond_dim, cfg.cond_dim)
        )

    def sinusoid(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        steps = torch.arange(half, dtype=torch.float32, device=t.device)  # made on the device
        freqs = torch.exp(-math.log(10000.0) * steps / half)
        args = t.float()[:, None] * freqs[None] * 1000.0
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if self.freq_dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: torch.Tensor, round_to: torch.dtype = torch.float32) -> torch.Tensor:
        """Embed ``t [N]``; the sinusoid is rounded to ``round_to`` first, as upstream does."""
        freq = self.sinusoid(t).to(round_to).to(self.mlp[0].weight.dtype)
        return self.mlp(freq)


class CaptionEmbedder(nn.Module):
    """T5 caption → cross-attention tokens; the adaLN path sees only a learned null token.

    At inference the adaLN input is ``null_caption_embedding[-2]`` (with text) or ``[-1]``
    (caption dropped), never the caption itself.
    """

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.y_proj_xattn = nn.Sequential(nn.Linear(cfg.caption_channels, cfg.xattn_dim), nn.SiLU())
        self.y_proj_adaln = nn.Sequential(nn.Linear(cfg.caption_channels, cfg.cond_dim))
        self.null_caption_embedding = nn.Parameter(
            torch.zeros(cfg.caption_max_length, cfg.caption_channels)
        )

    def adaln(self, dropped: bool) -> torch.Tensor:
        token = self.null_caption_embedding[-1 if dropped else -2]
        return self.y_proj_adaln(token[None])[0]


class FinalLinear(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        out = cfg.patch_size * cfg.patch_size * cfg.t_patch_size * cfg.out_channels
        self.linear = nn.Linear(cfg.hidden_size, out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class AdaModulateLayer(nn.Module):
    """``c ↦ W·SiLU(c) + b`` giving the two gates (attention, MLP)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        out = int(cfg.hidden_size * cfg.cond_gating_ratio * 2)
        self.proj = nn.Sequential(nn.Linear(cfg.cond_dim, out))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(c))


class LayerNormLinear(nn.Module):
    """Input LayerNorm plus the four projections ``q`` (self), ``qx`` (cross), ``k``, ``v``."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.layer_norm = nn.LayerNorm(h, eps=cfg.layernorm_epsilon)
        self.q = nn.Linear(h, cfg.q_size, bias=False)
        self.qx = nn.Linear(h, cfg.q_size, bias=False)
        self.k = nn.Linear(h, cfg.kv_size, bias=False)
        self.v = nn.Linear(h, cfg.kv_size, bias=False)


class MLP(nn.Module):
    """``LN → fc1 → GELU (or SwiGLU: silu(a)·b on the two halves) → fc2``."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.gated = cfg.gated_linear_unit
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        fc1_out = cfg.ffn_hidden_size * (2 if self.gated else 1)
        self.linear_fc1 = nn.Linear(cfg.hidden_size, fc1_out, bias=False)
        self.linear_fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_fc1(self.layer_norm(x))
        if self.gated:
            a, b = x.chunk(2, dim=-1)
            x = F.silu(a) * b
        else:
            x = F.gelu(x)
        return self.linear_fc2(x)


def softcap(x: torch.Tensor, cap: float = 1.0) -> torch.Tensor:
    """``cap · tanh(x / cap)`` computed in float32, returned in ``x``'s dtype."""
    return (cap * torch.tanh(x.float() / cap)).to(x.dtype)


def interleave_for_proj(core: torch.Tensor, cross: torch.Tensor, groups: int) -> torch.Tensor:
    """Upstream's TP8 layout in front of ``linear_proj``: ``(n g d) -> (g n d)`` with ``n = 2``.

    ``core``, ``cross``: ``[..., Hq·D]``; returns ``[..., 2·Hq·D]``.
    """
    x = torch.cat([core, cross], dim=-1)
    lead = x.shape[:-1]
    x = x.reshape(*lead, 2, groups, -1).transpose(-3, -2)
    return x.reshape(*lead, -1)


def high_precision_modules(model: nn.Module) -> list[nn.Module]:
    """The modules upstream keeps in float32 (``_high_precision_promoter``)."""
    mods = [model.x_embedder, model.y_embedder, model.t_embedder, model.final_linear, model.rope]
    for name, sub in model.named_modules():
        if "_xattn" in name:
            continue
        if name.endswith(
            ("q_layernorm", "k_layernorm", "self_attn_post_norm", "mlp_post_norm")
        ) or name.endswith("final_layernorm"):
            mods.append(sub)
    return mods


def promote_high_precision(model: nn.Module) -> nn.Module:
    """Cast the fp32-island modules of ``model`` to float32 in place; returns ``model``."""
    for m in high_precision_modules(model):
        m.float()
    return model
