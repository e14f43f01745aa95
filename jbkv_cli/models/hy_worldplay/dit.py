"""``WorldPlayDiT``: HY-WorldPlay's transformer (HunyuanVideo-1.5 + WorldPlay's action and
camera branches), natively, with upstream parameter names for a strict load.

Port, from reading, of Tencent-Hunyuan/HY-WorldPlay@da2d0c2
``hyvideo/models/transformers/worldplay_1_5_transformer.py`` (``MMDoubleStreamBlock``,
``HunyuanVideo_1_5_DiffusionTransformer`` with ``add_action_parameters``), its AR paths only:

- :meth:`WorldPlayDiT.embed_text` + :meth:`WorldPlayDiT.text_pass` = ``forward_txt``: the text
  tokens (SigLIP, ByT5, Qwen, valid tokens only, in that order) through the text stream of
  every block, timestep 0; each block hands its text keys/values (no RoPE) to ``store``.
- :meth:`WorldPlayDiT.vision_pass` = ``forward_vision``: latents through the vision stream of
  every block with per-token modulation ``time_in(t) + action_in(action)`` of each token's
  latent; attention through an ``attend(block, branch, q, k, v)`` callback, once for the RoPE
  branch and once for the PRoPE branch (upstream stacks the two on the batch axis of one SDPA
  call: two separate softmaxes over the same key positions). What the callback reads besides
  ``k, v`` (text, memory) is the caller's: :mod:`jbkv_cli.models.hy_worldplay.memory`.
- :meth:`WorldPlayDiT.full_forward`: the same blocks over ``[text | memory | current]`` in one
  pass under the block mask (text -> text; memory -> text + memory; current -> all). It is
  never used to generate; the tests hold the cached loop equal to it.

Single-stream blocks (none in WorldPlay-8B), the bidirectional path, sequence parallelism,
SageAttention and STA are not ported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jbkv_cli.models.hy_worldplay.config import DiTConfig
from jbkv_cli.models.hy_worldplay.layers import (
    MLP,
    ByT5Mapper,
    FinalLayer,
    LayerNorm,
    Linear,
    ModulateDiT,
    RMSNorm,
    SingleTokenRefiner,
    TimestepEmbedder,
    VisionProjection,
    apply_gate,
    gelu_tanh,
    modulate,
)
from jbkv_cli.models.hy_worldplay.rope import apply_rope, apply_tiles, prope_matrices, rope_table

BRANCHES = ("rope", "prope")
Attend = Callable[[int, str, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(block, branch, q, k, v) -> out``: ``[B, H, L, D]`` in and out."""


@dataclass
class Latents:
    """Vision tokens of one forward: ``x`` ``[1, 2C+1, T, h, w]`` (latent, condition, mask)
    and per latent frame its timestep ``t`` ``[T]``, action label ``action`` ``[T]``, camera
    ``w2c`` ``[T, 4, 4]`` and normalized intrinsics ``ks`` ``[T, 3, 3]``."""

    x: torch.Tensor
    t: torch.Tensor
    action: torch.Tensor
    w2c: torch.Tensor
    ks: torch.Tensor

    @property
    def frames(self) -> int:
        return self.x.shape[2]

    @staticmethod
    def cat(parts: list[Latents]) -> Latents:
        return Latents(
            torch.cat([p.x for p in parts], dim=2),
            torch.cat([p.t for p in parts]),
            torch.cat([p.action for p in parts]),
            torch.cat([p.w2c for p in parts]),
            torch.cat([p.ks for p in parts]),
        )


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1))  # [B, L, H, D]


class MMDoubleStreamBlock(nn.Module):
    """One double-stream block: a vision stream (``img_*``) and a text stream (``txt_*``)."""

    def __init__(self, hidden_size: int, heads_num: int, mlp_width_ratio: float) -> None:
        super().__init__()
        self.heads_num = heads_num
        head_dim = hidden_size // heads_num
        mlp_hidden = int(hidden_size * mlp_width_ratio)
        for side in ("img", "txt"):
            setattr(self, f"{side}_mod", ModulateDiT(hidden_size, 6))
            setattr(
                self, f"{side}_norm1", LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
            )
            for name in ("q", "k", "v"):
                setattr(self, f"{side}_attn_{name}", Linear(hidden_size, hidden_size))
            setattr(self, f"{side}_attn_q_norm", RMSNorm(head_dim))
            setattr(self, f"{side}_attn_k_norm", RMSNorm(head_dim))
            setattr(self, f"{side}_attn_proj", Linear(hidden_size, hidden_size))
            setattr(
                self, f"{side}_norm2", LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
            )
            setattr(self, f"{side}_mlp", MLP(hidden_size, mlp_hidden, gelu_tanh()))
        self.img_attn_prope_proj = Linear(hidden_size, hidden_size)

    def qkv(self, side: str, x: torch.Tensor, vec: torch.Tensor):
        """``(q, k, v [B, L, H, D], (gate1, shift2, scale2, gate2))`` of one stream; q and k
        RMS-normed (``modulate_img`` / ``modulate_txt``)."""
        mods = getattr(self, f"{side}_mod")(vec).chunk(6, dim=-1)
        h = modulate(getattr(self, f"{side}_norm1")(x), mods[0], mods[1])
        q, k, v = (
            _heads(getattr(self, f"{side}_attn_{n}")(h), self.heads_num) for n in ("q", "k", "v")
        )
        q = getattr(self, f"{side}_attn_q_norm")(q).to(v)
        k = getattr(self, f"{side}_attn_k_norm")(k).to(v)
        return q, k, v, mods[2:]

    def post(self, side: str, x: torch.Tensor, attn: torch.Tensor, mods) -> torch.Tensor:
        """Residual attention output (already projected) and MLP of one stream."""
        gate1, shift2, scale2, gate2 = mods
        x = x + apply_gate(attn, gate1)
        mlp = getattr(self, f"{side}_mlp")(
            modulate(getattr(self, f"{side}_norm2")(x), shift2, scale2)
        )
        return x + apply_gate(mlp, gate2)

    def text(self, txt, vec_txt, store: Callable[[torch.Tensor, torch.Tensor], None] | None):
        """``forward_txt``: text self-attention (no positions); ``store(k, v)`` ``[B, H, L, D]``."""
        q, k, v, mods = self.qkv("txt", txt, vec_txt)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if store is not None:
            store(k, v)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return self.post("txt", txt, self.txt_attn_proj(attn), mods)

    def vision_qkv(self, img, vec, rope, cams):
        """The two branches' ``q, k, v`` ``[B, H, L, D]``: RoPE (rotated q, k) and PRoPE
        (``P^T q``, ``P^-1 k``, ``P^-1 v`` of the pre-RoPE q, k)."""
        q, k, v, mods = self.qkv("img", img, vec)
        p_t, p_inv, _ = cams
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        prope = (apply_tiles(qh, p_t), apply_tiles(kh, p_inv), apply_tiles(vh, p_inv))
        q_r = apply_rope(q, *rope).transpose(1, 2)
        k_r = apply_rope(k, *rope).transpose(1, 2)
        return {"rope": (q_r, k_r, vh), "prope": prope}, mods

    def vision_post(self, img, outs: dict[str, torch.Tensor], cams, mods) -> torch.Tensor:
        """Both branches' outputs ``[B, H, L, D]`` projected (PRoPE's mapped back by ``P``),
        summed, gated; then the MLP."""
        o_p = apply_tiles(outs["prope"], cams[2])
        attn = self.img_attn_proj(outs["rope"].transpose(1, 2).flatten(2))
        attn = attn + self.img_attn_prope_proj(o_p.transpose(1, 2).flatten(2))
        return self.post("img", img, attn, mods)

    def vision(self, index: int, img, vec, rope, cams, attend: Attend) -> torch.Tensor:
        """``forward_vision``: the vision stream, attention by ``attend``."""
        branches, mods = self.vision_qkv(img, vec, rope, cams)
        outs = {name: attend(index, name, *branches[name]) for name in BRANCHES}
        return self.vision_post(img, outs, cams, mods)


class WorldPlayDiT(nn.Module):
    """HY-WorldPlay's transformer; ``state_dict`` keys are upstream's."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        c, heads = cfg.hidden_size, cfg.heads_num
        self.byt5_in = ByT5Mapper(cfg.byt5_dim, cfg.byt5_hidden, cfg.byt5_hidden, c)
        self.img_in = nn.Module()
        self.img_in.proj = nn.Conv3d(cfg.patch_in_channels, c, kernel_size=1)
        self.vision_in = VisionProjection(cfg.vision_states_dim, c)
        self.txt_in = SingleTokenRefiner(
            cfg.text_states_dim, c, heads, cfg.refiner_depth, cfg.frequency_embedding_size
        )
        self.time_in = TimestepEmbedder(c, cfg.frequency_embedding_size)
        self.double_blocks = nn.ModuleList(
            MMDoubleStreamBlock(c, heads, cfg.mlp_width_ratio)
            for _ in range(cfg.mm_double_blocks_depth)
        )
        self.single_blocks = nn.ModuleList()
        self.final_layer = FinalLayer(c, cfg.out_channels)
        self.cond_type_embedding = nn.Embedding(3, c)
        self.action_in = TimestepEmbedder(c, cfg.frequency_embedding_size)

    @property
    def dtype(self) -> torch.dtype:
        return self.img_in.proj.weight.dtype

    # ------------------------------------------------------------------ text

    def embed_text(
        self, text: torch.Tensor, byt5: torch.Tensor | None, vision: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(txt [1, L, C], vec_txt [1, C])`` from the *valid* tokens of the Qwen hidden states
        ``text`` ``[1, Lq, 3584]``, the ByT5 states ``byt5`` ``[1, Lb, 1472]`` (None or
        ``Lb = 0``: no quoted text) and SigLIP's ``vision`` ``[1, 729, 1152]``, in upstream's
        order ``[SigLIP | ByT5 | Qwen]`` (``get_text_and_mask`` + ``reorder_txt_token``), each
        plus its ``cond_type_embedding`` (2, 1, 0). Timestep 0."""
        t0 = torch.zeros(1, device=text.device)
        vec_txt = self.time_in(t0)
        parts = [self.txt_in(text.to(self.dtype), t0) + self.cond_type_embedding.weight[0]]
        if byt5 is not None and byt5.shape[1]:
            parts.insert(0, self.byt5_in(byt5.to(self.dtype)) + self.cond_type_embedding.weight[1])
        if vision is not None:
            parts.insert(
                0, self.vision_in(vision.to(self.dtype)) + self.cond_type_embedding.weight[2]
            )
        return torch.cat(parts, dim=1), vec_txt

    def text_pass(
        self,
        txt: torch.Tensor,
        vec_txt: torch.Tensor,
        store: Callable[[int, torch.Tensor, torch.Tensor], None],
    ) -> None:
        """Every block's text stream; ``store(block, k, v)`` keeps each block's text K/V."""
        for i, block in enumerate(self.double_blocks):
            txt = block.text(txt, vec_txt, lambda k, v, i=i: store(i, k, v))

    # ------------------------------------------------------------------ vision

    def _vision_inputs(self, lat: Latents, rope_start: int):
        """Embedded tokens, per-token modulation, RoPE table and per-token cameras."""
        cfg = self.cfg
        _, _, frames, h, w = lat.x.shape
        img = self.img_in.proj(lat.x.to(self.dtype)).flatten(2).transpose(1, 2)
        vec = self.time_in(lat.t) + self.action_in(lat.action.to(self.dtype))
        per_latent = h * w
        vec = vec.repeat_interleave(per_latent, dim=0)[None]  # [1, T h w, C]
        rope = rope_table(
            cfg.rope_dim_list, frames, h, w, cfg.rope_theta, start=rope_start, device=img.device
        )
        w2c = lat.w2c.to(self.dtype).repeat_interleave(per_latent, dim=0)[None]
        ks = lat.ks.to(self.dtype).repeat_interleave(per_latent, dim=0)[None]
        return img, vec, rope, prope_matrices(w2c, ks)

    def vision_pass(
        self, lat: Latents, rope_start: int, attend: Attend, final: bool = True
    ) -> torch.Tensor | None:
        """Every block's vision stream over ``lat`` at time positions ``rope_start ..``; the
        velocity ``[1, C_out, T, h, w]`` (float32), or None without ``final`` (the memory
        pass, which only fills the caches)."""
        img, vec, rope, cams = self._vision_inputs(lat, rope_start)
        for i, block in enumerate(self.double_blocks):
            img = block.vision(i, img, vec, rope, cams, attend)
        if not final:
            return None
        return self.unpatchify(self.final_layer(img, vec), lat.x.shape)

    def unpatchify(self, x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """Tokens ``[1, T h w, C_out]`` -> ``[1, C_out, T, h, w]`` (patch 1x1x1), float32."""
        _, _, frames, h, w = shape
        return x.float().transpose(1, 2).reshape(1, -1, frames, h, w)

    # ------------------------------------------------------------------ the oracle

    def full_forward(
        self, txt: torch.Tensor, vec_txt: torch.Tensor, memory: Latents | None, current: Latents
    ) -> torch.Tensor:
        """The current latents' velocity from one pass over ``[text | memory | current]``
        under the block mask (text -> text, memory -> text + memory, current -> all), with
        one RoPE table for the memory and current latents as one clip (positions 0..M+3)."""
        lat = current if memory is None else Latents.cat([memory, current])
        img, vec, rope, cams = self._vision_inputs(lat, 0)
        lt, li = txt.shape[1], img.shape[1]
        lm = 0 if memory is None else memory.frames * lat.x.shape[3] * lat.x.shape[4]
        allowed = torch.zeros(lt + li, lt + li, dtype=torch.bool, device=img.device)
        allowed[:, :lt] = True  # everyone reads the text
        allowed[lt : lt + lm, lt : lt + lm] = True  # memory reads memory
        allowed[lt + lm :, lt:] = True  # current reads memory and current
        allowed[:lt, lt:] = False  # text reads only text
        img_mask = allowed[lt:]
        for block in self.double_blocks:
            tq, tk, tv, tmods = block.qkv("txt", txt, vec_txt)
            tq, tk, tv = (t.transpose(1, 2) for t in (tq, tk, tv))
            branches, imods = block.vision_qkv(img, vec, rope, cams)
            q_r, k_r, v_r = branches["rope"]
            q_all = torch.cat([tq, q_r], dim=2)
            k_all = torch.cat([tk, k_r], dim=2)
            v_all = torch.cat([tv, v_r], dim=2)
            out = F.scaled_dot_product_attention(q_all, k_all, v_all, attn_mask=allowed)
            t_attn, o_r = out[:, :, :lt], out[:, :, lt:]
            q_p, k_p, v_p = branches["prope"]
            o_p = F.scaled_dot_product_attention(
                q_p,
                torch.cat([tk, k_p], dim=2),
                torch.cat([tv, v_p], dim=2),
                attn_mask=img_mask,
            )
            new_img = block.vision_post(img, {"rope": o_r, "prope": o_p}, cams, imods)
            t_attn = block.txt_attn_proj(t_attn.transpose(1, 2).flatten(2))
            txt = block.post("txt", txt, t_attn, tmods)
            img = new_img
        out = self.final_layer(img[:, lm:], vec[:, lm:])
        return self.unpatchify(out, current.x.shape)
