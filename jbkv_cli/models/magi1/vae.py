"""MAGI-1's transformer VAE (upstream ``ViTVAE``), native, with upstream parameter names.

8× spatial / 4× temporal compression, 16 latent channels. A ViT over ``4 × 8 × 8`` patches with a
CLS token and learned positions (trilinearly resized to other token grids); with
``ln_in_attn`` each head's q, k *and* v are standardized, ``(x − μ) / (σ + 1e-5)``, and the block
has no pre-attention LayerNorm. Decoding works in overlapping tiles (upstream ``TileProcessor``:
256-pixel tiles, 25 % spatial overlap blended linearly, 12-frame tiles without overlap).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jbkv_cli.models.magi1.config import VAEConfig


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, qkv_bias: bool, ln_in_attn: bool) -> None:
        super().__init__()
        self.heads = heads
        self.ln_in_attn = ln_in_attn
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads)
        if self.ln_in_attn:
            mean = qkv.mean(dim=-1, keepdim=True)
            std = qkv.std(dim=-1, keepdim=True, unbiased=False)
            qkv = (qkv - mean) / (std + 1e-5)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x [B, H, N, D]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.norm1 = nn.Identity() if cfg.ln_in_attn else nn.LayerNorm(d)
        self.attn = _Attention(d, cfg.num_heads, cfg.qkv_bias, cfg.ln_in_attn)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = _Mlp(d, int(d * cfg.mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _PatchEmbed(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        p, pt = cfg.patch_size, cfg.patch_length
        self.proj = nn.Conv3d(
            cfg.in_chans, cfg.embed_dim, kernel_size=(pt, p, p), stride=(pt, p, p)
        )


def _positions(pos_embed: torch.Tensor, src: tuple[int, int, int], dst: tuple[int, int, int]):
    """CLS position plus the grid positions, trilinearly resized from ``src`` to ``dst``."""
    if src == dst:
        return pos_embed
    grid = pos_embed[:, 1:].reshape(1, *src, -1).permute(0, 4, 1, 2, 3)
    grid = F.interpolate(grid.float(), size=dst, mode="trilinear", align_corners=False)
    grid = grid.to(pos_embed.dtype).permute(0, 2, 3, 4, 1).reshape(1, -1, pos_embed.shape[-1])
    return torch.cat([pos_embed[:, :1], grid], dim=1)


class _ViT(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.grid = (cfg.video_length // cfg.patch_length, cfg.video_size // cfg.patch_size)
        num = self.grid[0] * self.grid[1] ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num + 1, cfg.embed_dim))
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.embed_dim)

    def transform(self, x: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
        """Tokens ``[B, N, D]`` on grid ``shape`` -> normed tokens (CLS dropped)."""
        cls = self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype)
        x = torch.cat([cls, x], dim=1)
        src = (self.grid[0], self.grid[1], self.grid[1])
        x = x + _positions(self.pos_embed, src, shape).to(x.dtype)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 1:]


class ViTEncoder(_ViT):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__(cfg)
        self.patch_embed = _PatchEmbed(cfg)
        self.out_channels = cfg.z_chans * (2 if cfg.double_z else 1)
        self.last_layer = nn.Linear(cfg.embed_dim, self.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x)  # [B, D, t, h, w]
        b, _, t, h, w = x.shape
        x = self.last_layer(self.transform(x.flatten(2).transpose(1, 2), (t, h, w)))
        return x.reshape(b, t, h, w, -1).permute(0, 4, 1, 2, 3)


class ViTDecoder(_ViT):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__(cfg)
        self.patch = (cfg.patch_length, cfg.patch_size)
        self.unpatch_channels = cfg.embed_dim // (cfg.patch_size**2 * cfg.patch_length)
        if self.unpatch_channels * cfg.patch_size**2 * cfg.patch_length != cfg.embed_dim:
            raise ValueError("VAE embed_dim must be a multiple of patch_length · patch_size²")
        self.proj_in = nn.Linear(cfg.z_chans, cfg.embed_dim)
        self.last_layer = nn.Conv3d(self.unpatch_channels, 3, kernel_size=3, stride=1, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = z.shape
        x = self.proj_in(z.permute(0, 2, 3, 4, 1).reshape(b, -1, c))
        x = self.transform(x, (t, h, w))
        pt, p = self.patch
        x = x.reshape(b, t, h, w, pt, p, p, self.unpatch_channels)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(b, -1, t * pt, h * p, w * p)
        return self.last_layer(x)


class ViTVAE(nn.Module):
    """Encoder + decoder; keys ``encoder.*`` / ``decoder.*`` as in ``diffusion_pytorch_model.safetensors``."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        unsupported = [k for k in ("norm_code", "use_rope", "use_final_proj") if getattr(cfg, k)]
        if unsupported or not cfg.with_cls_token or not cfg.conv_last_layer:
            raise ValueError(f"unsupported MAGI-1 VAE configuration: {cfg}")
        self.cfg = cfg
        self.encoder = ViTEncoder(cfg)
        self.decoder = ViTDecoder(cfg)

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Video ``[B, 3, T, H, W]`` in ``[-1, 1]`` -> latent ``[B, z, T/4, H/8, W/8]``.

        Returns the posterior mean, or a sample when a ``generator`` is given.
        """
        moments = self.encoder(x)
        if not self.cfg.double_z:
            return moments
        mean, logvar = moments.chunk(2, dim=1)
        if generator is None:
            return mean
        std = torch.exp(0.5 * logvar.clamp(-30.0, 20.0))
        noise = torch.randn(mean.shape, generator=generator).to(mean)
        return mean + std * noise

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latent ``[B, z, t, h, w]`` -> video ``[B, 3, 4t, 8h, 8w]`` (roughly ``[-1, 1]``)."""
        return self.decoder(z)


def _blend(a: torch.Tensor, b: torch.Tensor, dim: int, extent: int) -> None:
    """In place: ramp ``b``'s first ``extent`` slices along ``dim`` from ``a``'s last ones."""
    extent = min(a.shape[dim], b.shape[dim], extent)
    for i in range(extent):
        w = i / extent
        dst = b.select(dim, i)
        dst.copy_(a.select(dim, a.shape[dim] - extent + i) * (1 - w) + dst * w)


@torch.no_grad()
def tiled_decode(
    vae: ViTVAE,
    z: torch.Tensor,
    *,
    tile_px: int = 256,
    tile_frames: int = 12,
    overlap: float = 0.25,
) -> torch.Tensor:
    """Decode ``z [B, C, t, h, w]`` tile by tile and blend (upstream ``TileProcessor.tiled_decode``).

    Latent tiles are ``tile_frames/4 × tile_px/8 × tile_px/8`` with stride ``(1 − overlap)`` of
    the spatial tile and no temporal overlap; each decoded tile is ramp-blended with its upper
    and left neighbours over ``overlap · tile_px`` pixels and cropped to the stride.
    """
    sp, tp = vae.cfg.patch_size, vae.cfg.patch_length
    lt, ls = tile_frames // tp, tile_px // sp
    stride_s = int(ls * (1 - overlap))
    blend_px = int(ls * sp * overlap)
    keep_px, keep_f = ls * sp - blend_px, lt * tp
    _, _, t, h, w = z.shape
    nt, nh, nw = (-(-t // lt), -(-h // stride_s), -(-w // stride_s))
    tiles = [
        [
            [
                vae.decode(
                    z[
                        :,
                        :,
                        f * lt : f * lt + lt,
                        i * stride_s : i * stride_s + ls,
                        j * stride_s : j * stride_s + ls,
                    ]
                )
                for j in range(nw)
            ]
            for i in range(nh)
        ]
        for f in range(nt)
    ]
    frames = []
    for f in range(nt):
        rows = []
        for i in range(nh):
            row = []
            for j in range(nw):
                tile = tiles[f][i][j]
                if i > 0:
                    _blend(tiles[f][i - 1][j], tile, 3, blend_px)
                if j > 0:
                    _blend(tiles[f][i][j - 1], tile, 4, blend_px)
                row.append(tile[:, :, :keep_f, :keep_px, :keep_px])
            rows.append(torch.cat(row, dim=4))
        frames.append(torch.cat(rows, dim=3))
    return torch.cat(frames, dim=2)


def to_uint8(video: torch.Tensor) -> torch.Tensor:
    """``[B, 3, T, H, W]`` in ``[-1, 1]`` -> uint8 ``[B·T, H, W, 3]`` (truncating, as upstream)."""
    x = (video.float() * 127.5 + 127.5).clamp(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 4, 1).flatten(0, 1)
