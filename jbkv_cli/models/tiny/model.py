"""The tiny chunk-wise autoregressive video diffusion transformer (one file, nanoGPT style).

A video of ``T`` frames ``[T, 3, H, W]`` is cut into chunks of ``F`` frames; each frame into
``p x p`` patches, so a chunk is ``L_c = F (H/p)(W/p)`` tokens (defaults: 4 * 8 * 8 = 256).
A DiT block is adaLN-modulated self-attention + MLP; the conditioning of a chunk is

    c = MLP(sinusoid(1000 t)) + mean_w E[w]          (t: the chunk's noise level, w: prompt words)

Patch embeddings get a fixed 2D sin-cos embedding of their (row, column) position.
Attention is block-causal over chunks with a sliding window of ``W`` previous chunks: the tokens
of chunk ``i`` attend to the (clean) chunks ``i-W .. i-1`` and to themselves. Queries and keys
are RMS-normalised, then rotated by a 3D RoPE over (frame, row, column), so that scores depend
on time only through frame *differences*; the keys are cached after RoPE, or before it
(``pre_rope``: rotated on read by the cache, :func:`key_rope`).

Diffusion is flow matching with the x0 parametrisation: ``x_t = (1 - t) x_0 + t eps`` and the
network predicts ``x_0``. A sampler step from ``t`` to ``t' < t`` is the deterministic Euler step
of the flow, ``x_t' = x0_hat + (t'/t) (x_t - x0_hat)``.

Two paths share the weights:
- :meth:`TinyDiT.forward_train` runs a clean copy and a noisy copy of a whole clip in one
  block-causal forward: noisy chunk ``i`` attends to clean chunks ``i-W .. i-1`` and to itself,
  clean chunk ``i`` to clean chunks ``i-W .. i`` (as its own refresh pass would).
- :meth:`TinyDiT.forward_chunk` runs one chunk against per-layer KV caches
  (:class:`jbkv_cli.kvcache.ChunkKVCache`): this is generation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jbkv_cli.kvcache.layers import HeadLayout
from jbkv_cli.kvcache.rope import KeyRope

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(layer, q, k, v, k_pre) -> out``, all ``[B, H, L, D]``; q and k post-RoPE, ``k_pre``
the keys before RoPE."""


@dataclass
class TinyConfig:
    """Architecture of the tiny model (stored with the weights)."""

    image_size: int = 32
    patch_size: int = 4
    channels: int = 3
    frames_per_chunk: int = 4
    width: int = 128
    depth: int = 4
    head_dim: int = 64
    mlp_ratio: float = 4.0
    vocab_size: int = 14
    prompt_words: int = 4
    rope_dims: tuple[int, int, int] = (16, 24, 24)  # channels of head_dim rotated by (t, h, w)
    rope_theta: float = 100.0
    window: int = 2  # previous chunks each chunk attends to (training and default generation)

    def __post_init__(self) -> None:
        self.rope_dims = tuple(self.rope_dims)
        if self.width % self.head_dim:
            raise ValueError("width must be a multiple of head_dim")
        if sum(self.rope_dims) != self.head_dim or any(d % 2 for d in self.rope_dims):
            raise ValueError("rope_dims must be even and sum to head_dim")

    @property
    def heads(self) -> int:
        return self.width // self.head_dim

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_frame(self) -> int:
        return self.grid**2

    @property
    def head_layout(self) -> HeadLayout:
        """What a pruner needs: layers, KV heads (every head) and tokens per frame."""
        return HeadLayout(
            layers=self.depth, kv_heads=self.heads, frame_tokens=self.tokens_per_frame
        )

    @property
    def chunk_len(self) -> int:
        return self.frames_per_chunk * self.tokens_per_frame

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch_size**2

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope_dims"] = list(self.rope_dims)
        return d


# ----------------------------------------------------------------------------------------------
# patches and positions


def patchify(video: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, T, C, H, W] -> [B, T (H/p) (W/p), C p p]`` (token order: frame, row, column)."""
    b, t, c, h, w = video.shape
    x = video.reshape(b, t, c, h // p, p, w // p, p)
    return x.permute(0, 1, 3, 5, 2, 4, 6).reshape(b, t * (h // p) * (w // p), c * p * p)


def unpatchify(tokens: torch.Tensor, p: int, c: int, size: int) -> torch.Tensor:
    """Inverse of :func:`patchify`."""
    b, n, _ = tokens.shape
    g = size // p
    t = n // (g * g)
    x = tokens.reshape(b, t, g, g, c, p, p).permute(0, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, t, c, size, size)


def rope_angles(
    cfg: TinyConfig, first_frame: int, num_frames: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Rotation angles ``[L, head_dim / 2]`` for frames ``first_frame ..`` (order t, h, w),
    computed on ``device`` (no copy from the host per call).

    Axis ``a`` with ``d_a`` channels rotates pair ``j`` by ``pos_a * theta^(-2j / d_a)``.
    """
    g = cfg.grid
    t = torch.arange(first_frame, first_frame + num_frames, dtype=torch.float64, device=device)
    s = torch.arange(g, dtype=torch.float64, device=device)
    pos = torch.stack(torch.meshgrid(t, s, s, indexing="ij"), -1).reshape(-1, 3)
    parts = []
    for axis, dim in enumerate(cfg.rope_dims):
        steps = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
        freqs = cfg.rope_theta ** (-steps / dim)
        parts.append(pos[:, axis : axis + 1] * freqs)
    return torch.cat(parts, -1).float()


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate channel pairs ``(x_j, x_j+D/2)`` of ``x [B, H, L, D]`` by angles ``[L, D/2]``.

    ``rope = (cos, sin)`` of the angles; ``x' = x * cos + rotate_half(x) * sin``.
    """
    cos, sin = rope
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def rope_tables(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[L, D]``, for :func:`apply_rope`."""
    a = torch.cat((angles, angles), -1)
    return a.cos(), a.sin()


def key_rope(cfg: TinyConfig, device: str | torch.device = "cpu") -> KeyRope:
    """The model's key rotation for a pre-RoPE cache: "rotate half" pairs ``(j, j + D/2)``,
    the table of a chunk at position ``p`` (its first frame) that of frames ``p .. p + F − 1``."""

    def table(position: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rope_angles(cfg, position, cfg.frames_per_chunk, device)
        return rope_tables(angles)

    return KeyRope("half", table)


# ----------------------------------------------------------------------------------------------
# blocks


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of ``1000 t``: ``[..., dim]``."""
    half = dim // 2
    steps = torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(-math.log(10000.0) * steps / half)
    args = 1000.0 * t[..., None].float() * freqs
    return torch.cat((args.cos(), args.sin()), -1)


def spatial_embedding(grid: int, dim: int) -> torch.Tensor:
    """Fixed 2D sin-cos embedding of the patch position (row, column): ``[grid * grid, dim]``.

    RoPE alone is relative, so without this the network could not tell where the frame's walls
    are (it would be translation-equivariant over the token grid).
    """
    quarter = dim // 4
    freqs = 100.0 ** (-torch.arange(quarter, dtype=torch.float64) / quarter)
    s = torch.arange(grid, dtype=torch.float64)
    rows, cols = torch.meshgrid(s, s, indexing="ij")
    parts = []
    for pos in (rows.reshape(-1, 1), cols.reshape(-1, 1)):
        parts += [(pos * freqs).sin(), (pos * freqs).cos()]
    return torch.cat(parts, -1).float()


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class Block(nn.Module):
    """adaLN-Zero DiT block: ``x += g1 * Attn(mod(LN x))``; ``x += g2 * MLP(mod(LN x))``."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        w = cfg.width
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(w, 3 * w)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=1e-6)
        self.proj = nn.Linear(w, w)
        hidden = int(cfg.mlp_ratio * w)
        self.mlp = nn.Sequential(
            nn.Linear(w, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, w)
        )
        self.ada = nn.Linear(w, 6 * w)

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attend: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """``x [B, n, L_c, width]`` (n chunks), ``c [B, n, 1, width]``, ``rope`` from
        :func:`rope_tables` for the ``n L_c`` tokens; ``attend(q, k, v, k_pre)``."""
        b, n, lc, w = x.shape
        h, d = self.cfg.heads, self.cfg.head_dim
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(F.silu(c)).chunk(6, -1)
        qkv = self.qkv(modulate(self.norm1(x), sh1, sc1)).reshape(b, n * lc, 3, h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, L, D]
        q = apply_rope(self.q_norm(q), rope)
        k_pre = self.k_norm(k)
        k = apply_rope(k_pre, rope)
        o = attend(q, k, v, k_pre).transpose(1, 2).reshape(b, n, lc, w)
        x = x + g1 * self.proj(o)
        return x + g2 * self.mlp(modulate(self.norm2(x), sh2, sc2))


def block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    n_clean: int,
    n_noisy: int,
    lc: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Attention over a clip laid out as ``[clean_0 .. clean_{m-1}, noisy_0 .. noisy_{n-1}]``.

    Clean chunk ``i`` reads clean chunks ``max(0, i-W) .. i``; noisy chunk ``i`` reads clean
    chunks ``max(0, i-W) .. i-1`` and itself (so ``m >= n - 1``). Tensors are ``[B, H, L, D]``.
    """
    qs, ks, vs = (x.split(lc, dim=2) for x in (q, k, v))
    out = []
    for i in range(n_clean + n_noisy):
        j = i - n_clean if i >= n_clean else i  # chunk index in time
        ctx = list(range(max(0, j - window), j))
        keys = [*ctx, i]
        out.append(
            F.scaled_dot_product_attention(
                qs[i],
                torch.cat([ks[c] for c in keys], 2),
                torch.cat([vs[c] for c in keys], 2),
                scale=scale,
            )
        )
    return torch.cat(out, 2)


class TinyDiT(nn.Module):
    """Text-conditioned chunk-wise AR video DiT predicting clean patches ``x_0``."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.patch_in = nn.Linear(cfg.patch_dim, w)
        self.register_buffer("pos", spatial_embedding(cfg.grid, w), persistent=False)
        self.words = nn.Embedding(cfg.vocab_size, w)
        self.t_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(w, 2 * w)
        self.patch_out = nn.Linear(w, cfg.patch_dim)
        self.scale = cfg.head_dim**-0.5
        self._init_weights()

    @property
    def head_layout(self) -> HeadLayout:
        """The config's layout, one layer per block held (``jbkv plan`` may hold fewer)."""
        return {**self.cfg.head_layout, "layers": len(self.blocks)}

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.words.weight, std=0.5)
        for blk in self.blocks:
            nn.init.zeros_(blk.ada.weight)
            nn.init.zeros_(blk.ada.bias)
        for m in (self.ada_out, self.patch_out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def condition(self, t: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """``t [B, n]`` noise levels, ``words [B, prompt_words]`` ids -> ``c [B, n, 1, width]``."""
        c = self.t_mlp(timestep_embedding(t, self.cfg.width)) + self.words(words).mean(1)[:, None]
        return c[:, :, None]

    def _run(
        self,
        tokens: torch.Tensor,
        t: torch.Tensor,
        words: torch.Tensor,
        angles: torch.Tensor,
        attend: AttendFn,
    ) -> torch.Tensor:
        """``tokens [B, n, L_c, patch_dim]``, ``t [B, n]`` -> predicted x0 tokens, same shape."""
        cfg = self.cfg
        x = self.patch_in(tokens) + self.pos.repeat(cfg.frames_per_chunk, 1)
        c = self.condition(t, words)
        rope = rope_tables(angles)
        for i, blk in enumerate(self.blocks):
            x = blk(x, c, rope, lambda q, k, v, k_pre, i=i: attend(i, q, k, v, k_pre))
        sh, sc = self.ada_out(F.silu(c)).chunk(2, -1)
        return self.patch_out(modulate(self.norm_out(x), sh, sc))

    def forward_train(
        self,
        clean: torch.Tensor,
        noisy: torch.Tensor | None,
        t_clean: torch.Tensor,
        t_noisy: torch.Tensor | None,
        words: torch.Tensor,
    ) -> torch.Tensor:
        """One block-causal forward over a clip (see :func:`block_causal_attention`).

        ``clean [B, m, L_c, patch_dim]`` (context-noised chunks at levels ``t_clean [B, m]``),
        ``noisy [B, n, L_c, patch_dim]`` at ``t_noisy [B, n]``, with ``m >= n - 1``. Returns
        the x0 predictions for the noisy chunks, or for the clean ones when ``noisy`` is None.
        """
        cfg = self.cfg
        m = clean.shape[1]
        n = 0 if noisy is None else noisy.shape[1]
        f = cfg.frames_per_chunk
        angles = rope_angles(cfg, 0, max(m, n) * f, clean.device)
        angles = torch.cat((angles[: m * cfg.chunk_len], angles[: n * cfg.chunk_len]), 0)
        if noisy is not None:
            tokens, t = torch.cat((clean, noisy), 1), torch.cat((t_clean, t_noisy), 1)
        else:
            tokens, t = clean, t_clean

        def attend(_layer: int, q, k, v, _k_pre) -> torch.Tensor:
            return block_causal_attention(q, k, v, m, n, cfg.chunk_len, cfg.window, self.scale)

        out = self._run(tokens, t, words, angles, attend)
        return out[:, m:] if noisy is not None else out

    def forward_chunk(
        self,
        tokens: torch.Tensor,
        t: torch.Tensor,
        words: torch.Tensor,
        chunk_index: int,
        caches: Sequence,
        commit: bool = False,
        pre_rope: bool = False,
    ) -> torch.Tensor:
        """One chunk ``[B, L_c, patch_dim]`` at noise level ``t [B]`` against per-layer caches.

        Each layer attends through ``caches[layer].attend`` to [cached chunks | this chunk]
        (this chunk in full precision). With ``commit``, this chunk's keys and values of every
        layer are committed to the caches after the pass (the refresh pass): post-RoPE, or with
        ``pre_rope`` before RoPE at position ``chunk_index · F`` (caches built with
        :func:`key_rope`).
        """
        cfg = self.cfg
        first = chunk_index * cfg.frames_per_chunk
        angles = rope_angles(cfg, first, cfg.frames_per_chunk, tokens.device)
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []

        def attend(layer: int, q, k, v, k_pre) -> torch.Tensor:
            if commit:
                pending.append((k_pre if pre_rope else k, v))
            return caches[layer].attend(q, k, v, scale=self.scale)

        out = self._run(tokens[:, None], t[:, None], words, angles, attend)[:, 0]
        if commit:
            where = {"position": first} if pre_rope else {}
            for cache, (k, v) in zip(caches, pending, strict=True):
                cache.commit(k, v, **where)
        return out
