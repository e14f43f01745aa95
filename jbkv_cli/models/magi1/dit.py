"""The MAGI-1 video DiT, in plain PyTorch, with upstream parameter names.

One forward sees ``n`` consecutive chunks of ``Lc`` tokens each, the first being absolute chunk
``s`` (the *slice point*). Chunk ``j`` self-attends to the last ``num_cached(j)`` chunks of the
layer's KV cache followed by in-forward chunks ``first_current(j) .. j`` (see
:class:`~jbkv_cli.models.magi1.schedule.ForwardPlan`), and cross-attends to its own caption.
With ``commit_first`` the first chunk's post-RoPE keys/values are committed to each layer's
cache after attention (the refresh pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jbkv_cli.models.magi1.config import DiTConfig
from jbkv_cli.models.magi1.layers import (
    MLP,
    AdaModulateLayer,
    CaptionEmbedder,
    FinalLinear,
    LayerNormLinear,
    TimestepEmbedder,
    ZeroCenteredLayerNorm,
    interleave_for_proj,
    softcap,
)
from jbkv_cli.models.magi1.rope import LearnableRotaryEmbedding, apply_rotary
from jbkv_cli.utils.host_reads import device_values, on_host


@dataclass(frozen=True)
class ChunkAttention:
    """Which keys forward chunk ``j`` reads: ``cached[j]`` cache chunks, then in-forward chunks
    ``first[j] .. j``."""

    cached: tuple[int, ...]
    first: tuple[int, ...]

    @classmethod
    def from_ranges(cls, slice_point: int, kv_chunks: Sequence[int]) -> ChunkAttention:
        """Block-causal ranges: chunk ``j`` reads absolute chunks ``[s+j+1-r_j, s+j+1)``."""
        cached, first = [], []
        for j, r in enumerate(kv_chunks):
            end = slice_point + j + 1
            start = max(0, end - r)
            cached.append(max(0, slice_point - start))
            first.append(max(start, slice_point) - slice_point)
        return cls(tuple(cached), tuple(first))


AttendFn = Callable[..., torch.Tensor]
"""``attend(q, k, v, *, scale, cache, n_cached) -> out``; q ``[B,Hq,Lq,D]``, k/v ``[B,Hkv,Lk,D]``."""


def plain_attend(q, k, v, *, scale, cache=None, n_cached=0):
    """Softmax attention over in-forward keys only (no cache)."""
    if n_cached:
        raise ValueError("plain_attend cannot read a cache")
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    """Self-attention (block-causal, KV cache) and caption cross-attention of one layer."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, eps, one_p = cfg.kv_channels, cfg.layernorm_epsilon, cfg.apply_layernorm_1p
        self.linear_qkv = LayerNormLinear(cfg)
        self.linear_kv_xattn = nn.Linear(cfg.xattn_dim, 2 * cfg.kv_size, bias=False)
        self.linear_proj = nn.Linear(2 * cfg.q_size, cfg.hidden_size, bias=False)
        self.q_layernorm = ZeroCenteredLayerNorm(d, eps, one_p)
        self.q_layernorm_xattn = ZeroCenteredLayerNorm(d, eps, one_p)
        self.k_layernorm = ZeroCenteredLayerNorm(d, eps, one_p)
        self.k_layernorm_xattn = ZeroCenteredLayerNorm(d, eps, one_p)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.reshape(b, s, -1, self.cfg.kv_channels)

    def _rope_proj(self, lin: nn.Linear, norm: nn.Module, x, cos, sin) -> torch.Tensor:
        """``[B,S,h] -> [B,H,S,D]``: project, per-head norm (fp32), RoPE (fp32), back to dtype."""
        y = self._heads(lin(x))
        dtype = y.dtype
        y = norm(y.float()).transpose(1, 2)
        return apply_rotary(y, cos, sin).to(dtype)

    def qkv(self, mixed: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Post-norm, post-RoPE ``q [B,Hq,S,D]``, ``k, v [B,Hkv,S,D]`` from normed hidden states."""
        lq = self.linear_qkv
        q = self._rope_proj(lq.q, self.q_layernorm, mixed, cos, sin)
        k = self._rope_proj(lq.k, self.k_layernorm, mixed, cos, sin)
        v = self._heads(lq.v(mixed)).transpose(1, 2)
        return q, k, v

    def caption_kv(self, y_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption tokens ``[Ly, xattn_dim]`` -> ``k, v [Hkv, Ly, D]`` (rows per head: ``k | v``)."""
        d = self.cfg.kv_channels
        kv = self.linear_kv_xattn(y_tokens).reshape(y_tokens.shape[0], -1, 2 * d)
        k, v = kv[..., :d], kv[..., d:]
        k = self.k_layernorm_xattn(k)
        return k.transpose(0, 1), v.transpose(0, 1)

    def forward(
        self,
        hidden: torch.Tensor,
        captions: Sequence[Sequence[torch.Tensor]],
        cos: torch.Tensor,
        sin: torch.Tensor,
        layout: ChunkAttention,
        *,
        cache=None,
        commit_first: bool = False,
        attend: AttendFn = plain_attend,
        kv_sink: list | None = None,
    ) -> torch.Tensor:
        """Returns the projected attention output ``[B, S, hidden]`` in float32."""
        cfg = self.cfg
        b, s, _ = hidden.shape
        n = len(layout.cached)
        lc = s // n
        scale = cfg.kv_channels**-0.5
        mixed = self.linear_qkv.layer_norm(hidden)
        q, k, v = self.qkv(mixed, cos, sin)
        outs = []
        for j in range(n):
            lo, hi = layout.first[j] * lc, (j + 1) * lc
            outs.append(
                attend(
                    q[:, :, j * lc : hi],
                    k[:, :, lo:hi],
                    v[:, :, lo:hi],
                    scale=scale,
                    cache=cache,
                    n_cached=layout.cached[j],
                )
            )
        core = torch.cat(outs, dim=2)
        if kv_sink is not None:
            kv_sink.append((k[:, :, :lc].detach(), v[:, :, :lc].detach()))
        if commit_first and cache is not None:
            cache.commit(k[:, :, :lc], v[:, :, :lc])

        qx = self.q_layernorm_xattn(self._heads(self.linear_qkv.qx(mixed))).transpose(1, 2)
        xouts = []
        for bi in range(b):
            row = []
            for j in range(n):
                kx, vx = self.caption_kv(captions[bi][j])
                row.append(
                    F.scaled_dot_product_attention(
                        qx[bi : bi + 1, :, j * lc : (j + 1) * lc],
                        kx[None],
                        vx[None],
                        scale=scale,
                        enable_gqa=True,
                    )
                )
            xouts.append(torch.cat(row, dim=2))
        cross = torch.cat(xouts, dim=0)

        core = core.transpose(1, 2).reshape(b, s, -1)
        cross = cross.transpose(1, 2).reshape(b, s, -1)
        x = interleave_for_proj(core, cross, cfg.proj_interleave_heads)
        return F.linear(x.float(), self.linear_proj.weight.float())


class TransformerLayer(nn.Module):
    """Attention and MLP, each: ``x ← x + PostNorm(tanh(gate) ⊙ f(x))`` (sandwich norm, softcap gate)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        eps, one_p = cfg.layernorm_epsilon, cfg.apply_layernorm_1p
        self.ada_modulate_layer = AdaModulateLayer(cfg)
        self.self_attention = Attention(cfg)
        self.self_attn_post_norm = ZeroCenteredLayerNorm(cfg.hidden_size, eps, one_p)
        self.mlp = MLP(cfg)
        self.mlp_post_norm = ZeroCenteredLayerNorm(cfg.hidden_size, eps, one_p)

    @staticmethod
    def _gate_add(x, residual, gate_tokens, norm) -> torch.Tensor:
        return norm(x.float() * gate_tokens.float()) + residual.float()

    def forward(self, hidden, condition, captions, cos, sin, layout, **attn_kwargs) -> torch.Tensor:
        dtype = hidden.dtype
        n = condition.shape[1]
        lc = hidden.shape[1] // n
        gates = softcap(self.ada_modulate_layer(condition))  # [B, n, 2h]
        gates = gates.repeat_interleave(lc, dim=1)
        gate_msa, gate_mlp = gates.chunk(2, dim=-1)
        attn = self.self_attention(hidden, captions, cos, sin, layout, **attn_kwargs)
        hidden = self._gate_add(attn, hidden, gate_msa, self.self_attn_post_norm).to(dtype)
        mlp = self.mlp(hidden)
        return self._gate_add(mlp, hidden, gate_mlp, self.mlp_post_norm).to(dtype)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layernorm = ZeroCenteredLayerNorm(
            cfg.hidden_size, cfg.layernorm_epsilon, cfg.apply_layernorm_1p
        )


class VideoDiT(nn.Module):
    """MAGI-1's ``VideoDiTModel`` (inference only). Parameter names match the official weights."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        p, pt = cfg.patch_size, cfg.t_patch_size
        self.x_embedder = nn.Conv3d(
            cfg.in_channels, cfg.hidden_size, kernel_size=(pt, p, p), stride=(pt, p, p), bias=False
        )
        self.t_embedder = TimestepEmbedder(cfg)
        self.y_embedder = CaptionEmbedder(cfg)
        self.rope = LearnableRotaryEmbedding(cfg.rope_dim)
        self.videodit_blocks = TransformerBlock(cfg)
        self.final_linear = FinalLinear(cfg)
        self.compute_dtype = torch.float32

    def embed_captions(self, y: torch.Tensor, mask: torch.Tensor) -> list[list[torch.Tensor]]:
        """Per (batch, chunk): the caption's valid tokens through ``y_proj_xattn`` (fp32), in dtype.

        ``y [B, n, L, C]``, ``mask [B, n, L]`` (1 = valid). A mask on the host is read there:
        the valid tokens are gathered by position, copied to ``y``'s device once per distinct
        mask (a boolean index on a device tensor would read its count back every forward).
        """
        proj = self.y_embedder.y_proj_xattn
        pdtype = proj[0].weight.dtype
        out = []
        for bi in range(y.shape[0]):
            row = []
            for j in range(y.shape[1]):
                if on_host(mask) and not on_host(y):
                    valid = device_values(mask[bi, j].nonzero().flatten(), y.device)
                    tokens = y[bi, j].index_select(0, valid)
                else:
                    tokens = y[bi, j][mask[bi, j].bool()]
                row.append(proj(tokens.to(pdtype)).to(self.compute_dtype))
            out.append(row)
        return out

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        y_mask: torch.Tensor,
        *,
        caption_dropped: bool,
        slice_point: int,
        kv_chunks: Sequence[int],
        caches: Sequence | None = None,
        commit_first: bool = False,
        distill_dt: float | None = None,
        attend: AttendFn = plain_attend,
        kv_sink: list | None = None,
    ) -> torch.Tensor:
        """Velocity for ``x [B, C, T, H, W]`` (``n`` chunks of equal length), float32.

        ``t [B, n]``: each chunk's time; ``y [B, n, L, C]`` / ``y_mask [B, n, L]``: each chunk's
        caption; ``caption_dropped``: adaLN null token (see :class:`CaptionEmbedder`);
        ``distill_dt``: step-size embedding of distilled models (required when ``cfg.distill``).
        ``kv_sink``: if given, receives each layer's first-chunk ``(k, v)`` (tests).
        """
        cfg = self.cfg
        dtype = self.compute_dtype
        b, _, frames = x.shape[:3]
        n = t.shape[1]
        if len(kv_chunks) != n or frames % n:
            raise ValueError(
                f"{n} chunk times/ranges for {frames} frames / {len(kv_chunks)} ranges"
            )
        if caches is not None and b != 1:
            raise ValueError("a KV cache serves batch size 1 only")
        x = x.float() * cfg.x_rescale_factor
        if cfg.half_channel_vae:
            x = torch.cat([x, x], dim=1)
        wdtype = self.x_embedder.weight.dtype
        x = self.x_embedder(x.to(wdtype)).float()
        _, _, tt, hh, ww = x.shape
        hidden = x.flatten(2).transpose(1, 2).to(dtype)  # [B, T*H*W, hidden], (t h w) order

        frames_per_chunk = tt // n
        cos, sin = self.rope(frames_per_chunk * (slice_point + n), tt, hh, ww)
        cos, sin = cos.to(x.device), sin.to(x.device)

        temb = self.t_embedder(t.reshape(-1).float(), round_to=dtype)
        if cfg.distill:
            if distill_dt is None:
                raise ValueError("a distilled MAGI-1 needs distill_dt")
            dt = torch.full_like(t.reshape(-1).float(), float(distill_dt))
            temb = temb + self.t_embedder(dt, round_to=dtype)
        condition = temb.reshape(b, n, -1) + self.y_embedder.adaln(caption_dropped).float()
        condition = condition.to(dtype)
        captions = self.embed_captions(y, y_mask)

        layout = ChunkAttention.from_ranges(slice_point, kv_chunks)
        for i, layer in enumerate(self.videodit_blocks.layers):
            hidden = layer(
                hidden,
                condition,
                captions,
                cos,
                sin,
                layout,
                cache=None if caches is None else caches[i],
                commit_first=commit_first,
                attend=attend,
                kv_sink=kv_sink,
            )
        hidden = self.videodit_blocks.final_layernorm(hidden.float())
        out = self.final_linear(hidden.to(self.final_linear.linear.weight.dtype)).float()
        out = self.unpatchify(out, tt, hh, ww)
        if cfg.half_channel_vae:
            out = out[:, : cfg.out_channels // 2]
        return out / cfg.x_rescale_factor

    def unpatchify(self, x: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        """``[B, (t h w), (pt p p C)] -> [B, C, t·pt, h·p, w·p]``."""
        cfg = self.cfg
        p, pt = cfg.patch_size, cfg.t_patch_size
        b = x.shape[0]
        x = x.reshape(b, t, h, w, pt, p, p, -1)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, -1, t * pt, h * p, w * p)
