"""Matrix-Game-2.0's causal Wan DiT with its ActionModule, written from upstream's source.

Upstream: ``wan/modules/causal_model.py`` (``CausalWanModel``, ``CausalWanAttentionBlock``,
``CausalWanSelfAttention``, ``CausalHead``), ``wan/modules/model.py`` (``WanI2VCrossAttention``,
``MLPProj``, ``rope_params``, ``sinusoidal_embedding_1d``) and ``wan/modules/action_module.py``
(``ActionModule``) of SkyworkAI/Matrix-Game's ``Matrix-Game-2`` folder (see
:mod:`~jbkv_cli.models.wan.matrix_game.config`). Module and parameter names are upstream's, so a
checkpoint's keys load after :func:`~jbkv_cli.models.wan.matrix_game.checkpoint.rename_keys`.

One block, on the tokens ``x`` ``[B, F·S, C]`` of ``F`` latent frames of ``S`` tokens:

    x += self_attn(norm1(x)·(1 + e₁) + e₀)·e₂          (RoPE over (frame, h, w), local window)
    x += cross_attn(norm3(x), img_emb(CLIP tokens))    (image-only I2V cross-attention)
    x  = action_model(x, mouse, keyboard)              (blocks 0–14)
    x += ffn(norm2(x)·(1 + e₄) + e₃)·e₅

The ActionModule (upstream ``ActionModule.forward`` with ``use_rope_keyboard``):

* **mouse** — per spatial position ``s``, the frames' hidden states ``[B·S, F, C]`` are
  concatenated with the mouse window of each latent frame ``f`` (raw frames ``[4f − 12, 4f)``,
  the first frame repeated before the video: ``pad_t = 12``), through ``mouse_mlp``, ``t_qkv``
  → q, k, v of 16 heads × 64, RMS-normalised, rotated (RoPE of the frame index on the first 8
  channels, θ = 256), temporal self-attention over frames *per position*, ``proj_mouse``,
  added to ``x``. Its cache holds one key per (position, frame): ``[B·S, 16, frames, 64]``.
* **keyboard** — ``keyboard_embed`` of the padded keys, windows of 12 raw frames flattened
  (``12 · 128``), ``keyboard_attn_kv`` → k, v per latent frame (one token a frame); q =
  ``mouse_attn_q(x)``; both normalised and rotated at their frame index; cross-attention of
  every token to the keyboard tokens of the window, ``proj_keyboard``, added. Its cache holds
  ``[B, 16, frames, 64]``.

Upstream's action ``WanRMSNorm`` (in ``action_module.py``) returns ``x · rsqrt(mean(x²) + ε)``
without its ``weight``: the parameter is in the checkpoint and loaded, but not applied — kept
so here. The main blocks' ``WanRMSNorm`` (``model.py``) computes in float32 and applies it.

Attention itself is delegated to an :class:`Attention` (cached chunk loop or the masked,
cache-free oracle: :mod:`~jbkv_cli.models.wan.matrix_game.attention`); tensors reach it as
``[B, H, L, D]`` with RoPE applied.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from jbkv_cli.models.wan.matrix_game.config import ACTION_ROPE_FRAMES, ActionConfig, DiTConfig


class Attention(Protocol):
    """Where a forward's three kinds of attention are computed (all ``[B, H, L, D]``)."""

    def self_attn(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Main self-attention of block ``layer`` (tokens frame-major)."""
        ...

    def mouse(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Temporal mouse attention, batch ``B·S`` (one sequence of frames per position)."""
        ...

    def keyboard(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Keyboard cross-attention: q ``[B, H, F·S, D]`` over k, v ``[B, H, F, D]``."""
        ...


# --------------------------------------------------------------------------- small pieces


class WanRMSNorm(nn.Module):
    """Wan's RMSNorm: ``x · rsqrt(mean(x²) + ε)`` in float32, times ``weight``."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * (
            self.weight
        )


class ActionRMSNorm(nn.Module):
    """``action_module.WanRMSNorm``: normalises, never applies its ``weight`` (upstream)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class WanLayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = False) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).type_as(x)


def sinusoidal(dim: int, t: torch.Tensor) -> torch.Tensor:
    """``sinusoidal_embedding_1d``: ``[cos(t·ω), sin(t·ω)]``, ω = 10000^(−i/half), float64."""
    half = dim // 2
    t = t.double()
    steps = torch.arange(half, dtype=torch.float64, device=t.device)  # made where t is
    arg = torch.outer(t, torch.pow(10000, -steps.div(half)))
    return torch.cat([torch.cos(arg), torch.sin(arg)], dim=1)


def rope_angles(frames: int, dim: int, theta: float = 10000.0, device=None) -> torch.Tensor:
    """``rope_params``: angles ``[frames, dim/2]`` (float64) of positions 0 … frames − 1, made
    on ``device`` (every table here is: no copy from the host per forward)."""
    steps = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
    inv = 1.0 / torch.pow(theta, steps.div(dim))
    return torch.outer(torch.arange(frames, dtype=torch.float64, device=device), inv)


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs of ``x`` ``[..., L, H, D]`` by ``angles`` ``[L, D/2]``
    (complex multiply in float64, upstream's ``causal_rope_apply``)."""
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    rot = torch.polar(torch.ones_like(angles), angles)[:, None, :]
    return torch.view_as_real(xc * rot).flatten(-2).type_as(x)


def main_rope_angles(
    head_dim: int, frames: int, f0: int, h: int, w: int, device=None
) -> torch.Tensor:
    """Angles ``[frames·h·w, D/2]`` of tokens at latent frames ``f0 …`` (3-axis Wan RoPE:
    ``c − 2(c//3)`` frame pairs, ``c//3`` height, ``c//3`` width, ``c = D/2``)."""
    c = head_dim // 2
    d = head_dim
    table = torch.cat(
        [
            rope_angles(1024, d - 4 * (d // 6), device=device),
            rope_angles(1024, 2 * (d // 6), device=device),
            rope_angles(1024, 2 * (d // 6), device=device),
        ],
        dim=1,
    )
    ft, fh, fw = table.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    parts = [
        ft[f0 : f0 + frames].view(frames, 1, 1, -1).expand(frames, h, w, -1),
        fh[:h].view(1, h, 1, -1).expand(frames, h, w, -1),
        fw[:w].view(1, 1, w, -1).expand(frames, h, w, -1),
    ]
    return torch.cat(parts, dim=-1).reshape(frames * h * w, c)


def action_rope_angles(
    cfg: ActionConfig, head_dim: int, f0: int, frames: int, device=None
) -> torch.Tensor:
    """Angles ``[frames, D/2]`` of the ActionModule's RoPE at latent frames ``f0 …``: the
    ``[t, h, w]`` table of ``get_nd_rotary_pos_embed`` over a ``[7500, 1, 1]`` grid (h = w = 0,
    so only the first ``rope_dims[0]`` channels turn), θ = ``rope_theta``, float32 as upstream."""
    if sum(cfg.rope_dims) != head_dim:
        raise ValueError(f"action rope dims {cfg.rope_dims} do not sum to {head_dim}")
    t_dim = cfg.rope_dims[0]
    steps = torch.arange(0, t_dim, 2, dtype=torch.float32, device=device)[: t_dim // 2]
    inv = 1.0 / (cfg.rope_theta ** (steps / t_dim))
    pos = torch.arange(f0, f0 + frames, dtype=torch.float32, device=device)
    zeros = torch.zeros(frames, (head_dim - t_dim) // 2, dtype=torch.float32, device=device)
    return torch.cat([torch.outer(pos, inv), zeros], dim=1).double()


# --------------------------------------------------------------------------- attention layers


class CausalSelfAttention(nn.Module):
    """``CausalWanSelfAttention``: q, k, v, o with RMS-normalised q, k and 3-axis RoPE."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = WanRMSNorm(dim, eps)
        self.norm_k = WanRMSNorm(dim, eps)

    def forward(self, x, angles, attn: Attention, layer: int) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, s, self.heads, -1)
        k = self.norm_k(self.k(x)).view(b, s, self.heads, -1)
        v = self.v(x).view(b, s, self.heads, -1)
        q, k = rotate(q, angles).type_as(v), rotate(k, angles).type_as(v)
        out = attn.self_attn(layer, *(t.transpose(1, 2) for t in (q, k, v)))
        return self.o(out.transpose(1, 2).flatten(2))


class ImageCrossAttention(nn.Module):
    """Matrix-Game's ``WanI2VCrossAttention``: q from the tokens, k, v from the image context
    only (no text, no separate ``k_img``), never cached by jbkv (computed per forward)."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = WanRMSNorm(dim, eps)
        self.norm_k = WanRMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q = self.norm_q(self.q(x)).view(b, -1, self.heads, x.shape[-1] // self.heads)
        k = self.norm_k(self.k(context)).view(b, -1, self.heads, q.shape[-1])
        v = self.v(context).view(b, -1, self.heads, q.shape[-1])
        out = nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        return self.o(out.transpose(1, 2).flatten(2))


def action_windows(cond: torch.Tensor, cfg: ActionConfig, f0: int, frames: int) -> torch.Tensor:
    """The action window of latent frames ``f0 … f0 + frames − 1``: ``[B, frames, pad, C]``,
    raw frames ``[4f − pad, 4f)`` of ``cond`` ``[B, N, C]`` with frame 0 repeated before it
    (upstream pads ``pad_t`` copies of frame 0 and slices ``[4(i − windows) + pad, 4i + pad)``;
    its cached path slices the same windows out of the prefix it is handed)."""
    pad = cfg.pad
    padded = torch.cat([cond[:, :1].expand(-1, pad, -1), cond], dim=1)
    r = cfg.time_ratio
    return torch.stack([padded[:, r * f : r * f + pad] for f in range(f0, f0 + frames)], dim=1)


class ActionModule(nn.Module):
    """Upstream's ``ActionModule`` (module docstring), with its parameter names."""

    def __init__(self, cfg: ActionConfig, img_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        r, w = cfg.time_ratio, cfg.windows
        if cfg.keyboard_dim:
            h = cfg.hidden_size
            self.keyboard_embed = nn.Sequential(
                nn.Linear(cfg.keyboard_dim, h), nn.SiLU(), nn.Linear(h, h)
            )
        if cfg.mouse:
            c = cfg.mouse_hidden
            self.mouse_mlp = nn.Sequential(
                nn.Linear(cfg.mouse_dim * r * w + img_hidden, c),
                nn.GELU(approximate="tanh"),
                nn.Linear(c, c),
                nn.LayerNorm(c),
            )
            self.t_qkv = nn.Linear(c, 3 * c, bias=False)
            self.img_attn_q_norm = ActionRMSNorm(c // cfg.heads)
            self.img_attn_k_norm = ActionRMSNorm(c // cfg.heads)
            self.proj_mouse = nn.Linear(c, img_hidden, bias=False)
        if cfg.keyboard_dim:
            kd = cfg.keyboard_hidden
            self.key_attn_q_norm = ActionRMSNorm(kd // cfg.heads)
            self.key_attn_k_norm = ActionRMSNorm(kd // cfg.heads)
            self.mouse_attn_q = nn.Linear(img_hidden, kd, bias=False)
            self.keyboard_attn_kv = nn.Linear(cfg.hidden_size * w * r, 2 * kd, bias=False)
            self.proj_keyboard = nn.Linear(kd, img_hidden, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        grid: tuple[int, int, int],
        f0: int,
        mouse: torch.Tensor | None,
        keyboard: torch.Tensor,
        attn: Attention,
        layer: int,
    ) -> torch.Tensor:
        cfg = self.cfg
        t, h, w = grid
        s = h * w
        b = x.shape[0]
        heads = cfg.heads
        if cfg.mouse:
            if mouse is None:
                raise ValueError("this ActionModule needs a mouse condition")
            hidden = x.view(b, t, s, -1).transpose(1, 2).reshape(b * s, t, -1)
            win = action_windows(mouse, cfg, f0, t).flatten(2)  # [B, T, pad·C]
            win = win[:, None].expand(b, s, t, win.shape[-1]).reshape(b * s, t, -1)
            feats = self.mouse_mlp(torch.cat([hidden, win.to(hidden)], dim=-1))
            q, k, v = self.t_qkv(feats).view(b * s, t, 3, heads, -1).unbind(2)
            q = self.img_attn_q_norm(q).to(v)
            k = self.img_attn_k_norm(k).to(v)
            angles = action_rope_angles(cfg, q.shape[-1], f0, t, q.device)
            q, k = rotate(q, angles).type_as(v), rotate(k, angles).type_as(v)
            out = attn.mouse(layer, *(z.transpose(1, 2) for z in (q, k, v)))  # [BS, H, T, D]
            out = out.transpose(1, 2).reshape(b, s, t, -1).transpose(1, 2).reshape(b, t * s, -1)
            x = x + self.proj_mouse(out)
        win = self.keyboard_embed(action_windows(keyboard, cfg, f0, t).to(x))  # [B, T, pad, h]
        kv = self.keyboard_attn_kv(win.flatten(2))  # [B, T, 2·kd]
        q = self.mouse_attn_q(x).view(b, t * s, heads, -1)
        k, v = kv.view(b, t, 2, heads, -1).unbind(2)
        q = self.key_attn_q_norm(q).to(v)
        k = self.key_attn_k_norm(k).to(v)
        angles = action_rope_angles(cfg, q.shape[-1], f0, t, q.device)
        q = rotate(q, angles.repeat_interleave(s, dim=0)).type_as(v)
        k = rotate(k, angles).type_as(v)
        out = attn.keyboard(layer, *(z.transpose(1, 2) for z in (q, k, v)))  # [B, H, T·S, D]
        return x + self.proj_keyboard(out.transpose(1, 2).flatten(2))


# --------------------------------------------------------------------------- blocks, model


class CausalBlock(nn.Module):
    """``CausalWanAttentionBlock`` (module docstring)."""

    def __init__(self, cfg: DiTConfig, index: int) -> None:
        super().__init__()
        dim = cfg.dim
        self.index = index
        self.norm1 = WanLayerNorm(dim, cfg.eps)
        self.self_attn = CausalSelfAttention(dim, cfg.heads, cfg.eps)
        self.norm3 = WanLayerNorm(dim, cfg.eps, affine=True)
        self.cross_attn = ImageCrossAttention(dim, cfg.heads, cfg.eps)
        self.norm2 = WanLayerNorm(dim, cfg.eps)
        self.ffn = nn.Sequential(
            nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        self.action_model = ActionModule(cfg.action, dim) if index in cfg.action.blocks else None

    def forward(self, x, e, grid, f0, angles, context, mouse, keyboard, attn) -> torch.Tensor:
        t = grid[0]
        e = (self.modulation.unsqueeze(1) + e).chunk(6, dim=2)  # each [B, T, 1, C]

        def frames(z: torch.Tensor) -> torch.Tensor:
            return z.unflatten(1, (t, -1))

        y = self.self_attn(
            (frames(self.norm1(x)) * (1 + e[1]) + e[0]).flatten(1, 2), angles, attn, self.index
        )
        x = x + (frames(y) * e[2]).flatten(1, 2)
        x = x + self.cross_attn(self.norm3(x), context)
        if self.action_model is not None:
            x = self.action_model(x, grid, f0, mouse, keyboard, attn, self.index)
        y = self.ffn((frames(self.norm2(x)) * (1 + e[4]) + e[3]).flatten(1, 2))
        return x + (frames(y) * e[5]).flatten(1, 2)


class MLPProj(nn.Module):
    """``img_emb``: LayerNorm, Linear, GELU, Linear, LayerNorm over CLIP tokens."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            nn.LayerNorm(in_dim),
            nn.Linear(in_dim, in_dim),
            nn.GELU(),
            nn.Linear(in_dim, out_dim),
            nn.LayerNorm(out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class CausalHead(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.norm = WanLayerNorm(cfg.dim, cfg.eps)
        self.head = nn.Linear(cfg.dim, math.prod(cfg.patch) * cfg.out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        t = e.shape[1]
        e = (self.modulation.unsqueeze(1) + e).chunk(2, dim=2)
        return self.head(self.norm(x).unflatten(1, (t, -1)) * (1 + e[1]) + e[0])


class MatrixGameDiT(nn.Module):
    """``CausalWanModel`` of Matrix-Game-2.0 (module docstring)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch, stride=cfg.patch)
        self.time_embedding = nn.Sequential(
            nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim)
        )
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(CausalBlock(cfg, i) for i in range(cfg.layers))
        self.head = CausalHead(cfg)
        self.img_emb = MLPProj(cfg.clip_dim, dim)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        f0: int,
        cond: torch.Tensor,
        clip: torch.Tensor,
        mouse: torch.Tensor | None,
        keyboard: torch.Tensor,
        attn: Attention,
    ) -> torch.Tensor:
        """The flow prediction for latents ``x`` ``[B, 16, T, h, w]`` at latent frames
        ``f0 … f0 + T − 1`` with per-frame timesteps ``t`` ``[B, T]``; ``cond`` ``[B, 20, T, h,
        w]`` (mask + image latent of those frames), ``clip`` ``[B, 257, 1280]``, actions
        ``[B, frames, C]`` per raw video frame (only frames before ``4(f0 + T)`` are read)."""
        cfg = self.cfg
        if f0 + x.shape[2] > cfg.rope_frames:
            raise ValueError(f"latent frame {f0 + x.shape[2] - 1} is past the rotary table")
        if f0 + x.shape[2] > ACTION_ROPE_FRAMES:
            raise ValueError("past the ActionModule's rotary table")
        h = self.patch_embedding(torch.cat([x, cond], dim=1).to(self.patch_embedding.weight))
        grid = tuple(h.shape[2:])
        h = h.flatten(2).transpose(1, 2)
        e = self.time_embedding(sinusoidal(cfg.freq_dim, t.flatten()).to(h))
        e0 = self.time_projection(e).unflatten(1, (6, cfg.dim)).unflatten(0, t.shape)
        context = self.img_emb(clip.to(h))
        angles = main_rope_angles(cfg.head_dim, grid[0], f0, grid[1], grid[2], h.device)
        for block in self.blocks:
            h = block(h, e0, grid, f0, angles, context, mouse, keyboard, attn)
        out = self.head(h, e.unflatten(0, t.shape).unsqueeze(2))
        return self.unpatchify(out, grid)

    def unpatchify(self, x: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """``[B, T, S, p·c]`` → ``[B, c, T·p_t, h·p_h, w·p_w]`` (Wan's ``unpatchify``)."""
        f, hh, ww = grid
        pt, ph, pw = self.cfg.patch
        c = self.cfg.out_dim
        x = x.reshape(x.shape[0], f, hh, ww, pt, ph, pw, c)
        x = torch.einsum("bfhwpqrc->bcfphqwr", x)
        return x.reshape(x.shape[0], c, f * pt, hh * ph, ww * pw)
