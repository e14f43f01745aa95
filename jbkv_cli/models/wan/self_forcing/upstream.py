"""diffusers' Wan transformer run with the casting of Self-Forcing's ``CausalWanModel``.

Self-Forcing (guandeh17/Self-Forcing @33593df ``wan/modules/causal_model.py``, ``model.py``;
its descendants keep the file: Causal-Forcing's is the same, CausVid @ca21150 and Rolling
Forcing @a1477d09 differ only in cache handling) casts the whole pipeline to bf16
(``inference.py``: ``pipeline.to(dtype=torch.bfloat16)``; the ``amp.autocast(float32)``
blocks of Wan's original code are commented out), so in bf16:

* every parameter is bf16, modulation tables included; the RoPE table is float64 (a plain
  attribute, not a buffer, so ``.to()`` leaves it);
* time: ``sinusoidal_embedding_1d`` in float64, cast to bf16, then ``time_embedding`` and
  ``time_projection`` in bf16, per latent frame (``t`` is ``[B, F]``);
* a block: ``e = modulation + e₀`` (bf16); ``y = self_attn(norm1(x)·(1 + e₁) + e₀)``,
  ``x = x + y·e₂``; ``x = x + cross_attn(norm3(x), context)``;
  ``x = x + ffn(norm2(x)·(1 + e₄) + e₃)·e₅`` — each product and sum a bf16 op; the
  LayerNorms are ``nn.LayerNorm`` on bf16 (``WanLayerNorm``); q/k ``WanRMSNorm``: normalised
  in float32, cast to bf16, then times the bf16 weight; RoPE in float64 (complex), cast back;
* the head: ``head(norm(x)·(1 + e₁) + e₀)`` with ``e = head.modulation + e`` (bf16).

diffusers' ``WanTransformer3DModel`` (what jbkv loads) keeps ``_keep_in_fp32_modules`` (time
embedder, ``scale_shift_table``, norms) in float32, modulates and adds residuals in float32,
fuses the RMSNorm weight into one float32 op and builds a float32 RoPE table.
:func:`upstream_forward` runs diffusers' modules in upstream's order instead; the names map as
diffusers' ``convert_wan_to_diffusers.py`` renames them (``norm2`` ↔ upstream ``norm3``,
``norm3`` ↔ ``norm2``, ``scale_shift_table`` ↔ ``modulation``). Self-attention goes through the
block's ``attn1`` (jbkv's cached processor, which applies :func:`wan_rms_norm` when its
:class:`~jbkv_cli.models.wan.attention.ChunkContext` says so); cross-attention is written out
here with :func:`wan_rms_norm`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from jbkv_cli.models.wan.matrix_game.dit import rope_angles, sinusoidal
from jbkv_cli.utils.host_reads import device_values

ROPE_THETA = 10000.0  # rope_params' theta (diffusers' WanRotaryPosEmbed default)


def cast_all(transformer: Any, dtype: torch.dtype) -> None:
    """Every parameter in ``dtype`` (upstream's ``pipeline.to(dtype)``); buffers untouched."""
    for param in transformer.parameters():
        param.data = param.data.to(dtype)


def float64_rope(rope: Any) -> None:
    """Replace the float32 tables of diffusers' ``WanRotaryPosEmbed`` with upstream's float64
    ones (``rope_params``: angles ``p / θ^(2i/d)`` per axis; each repeated for its pair)."""
    angles = torch.cat(
        [
            rope_angles(rope.max_seq_len, d, ROPE_THETA)
            for d in (rope.t_dim, rope.h_dim, rope.w_dim)
        ],
        dim=1,
    ).to(rope.freqs_cos.device)
    rope.freqs_cos = angles.cos().repeat_interleave(2, dim=1)
    rope.freqs_sin = angles.sin().repeat_interleave(2, dim=1)


def wan_rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``WanRMSNorm``: ``x · rsqrt(mean(x²) + ε)`` in float32, cast to ``x``'s dtype, then
    times the weight (a second rounding in 16 bits)."""
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + norm.eps)).type_as(x)
    return out * norm.weight


def layer_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``WanLayerNorm``: ``nn.LayerNorm`` on ``x`` as it is (bf16 in, bf16 out)."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps).type_as(x)


def cross_attention(attn: Any, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """``WanT2VCrossAttention``: q of ``x``, k and v of ``context``, RMS-normed, one softmax."""
    q = wan_rms_norm(attn.norm_q, attn.to_q(x))
    k = wan_rms_norm(attn.norm_k, attn.to_k(context))
    v = attn.to_v(context)
    q, k, v = (t.unflatten(2, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
    return attn.to_out[0](out)


def _modulated(x: torch.Tensor, shift, scale, frames: int) -> torch.Tensor:
    """``x·(1 + scale) + shift`` per latent frame (``shift``, ``scale`` ``[B, F, 1, C]``)."""
    return (x.unflatten(1, (frames, -1)) * (1 + scale) + shift).flatten(1, 2)


def _gated(y: torch.Tensor, gate, frames: int) -> torch.Tensor:
    return (y.unflatten(1, (frames, -1)) * gate).flatten(1, 2)


def block_forward(block: Any, x, e0, context, rotary, frames: int) -> torch.Tensor:
    """``CausalWanAttentionBlock.forward`` on diffusers' ``WanTransformerBlock`` ``block``:
    tokens ``x`` ``[B, L, C]``, time projection ``e0`` ``[B, F, 6, C]``."""
    e = (block.scale_shift_table.unsqueeze(1) + e0).chunk(6, dim=2)
    y = block.attn1(_modulated(layer_norm(block.norm1, x), e[0], e[1], frames), None, None, rotary)
    x = x + _gated(y, e[2], frames)
    x = x + cross_attention(block.attn2, layer_norm(block.norm2, x), context)
    y = block.ffn(_modulated(layer_norm(block.norm3, x), e[3], e[4], frames))
    return x + _gated(y, e[5], frames)


def time_sinusoid(transformer: Any, timesteps: torch.Tensor) -> torch.Tensor:
    """The sinusoidal embedding of ``timesteps`` ``[B, F]`` as :func:`upstream_forward` makes
    it: on the host, in float64, cast to the tokens' dtype (the patch embedding's)."""
    dtype = transformer.patch_embedding.weight.dtype
    return sinusoidal(transformer.config.freq_dim, timesteps.flatten().cpu()).to(dtype)


def upstream_forward(
    transformer: Any, x: torch.Tensor, timesteps: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    """The flow of latents ``x`` ``[B, C, F, H, W]`` (the model dtype) at per-frame timesteps
    ``timesteps`` ``[B, F]`` given the text embedding ``text`` ``[B, L, D]``, in the model
    dtype, computed as ``CausalWanModel._forward_inference`` (module docstring)."""
    cfg = transformer.config
    p_t, p_h, p_w = cfg.patch_size
    b, _, f, h, w = x.shape
    frames, gh, gw = f // p_t, h // p_h, w // p_w
    rotary = transformer.rope(x)  # the frame offset comes from the cached-attention hook
    tokens = transformer.patch_embedding(x).flatten(2).transpose(1, 2)
    embed = transformer.condition_embedder
    # on the host, as upstream computes it; the same timesteps give the same embedding, copied
    # to the device once (host_reads.device_values)
    sin = device_values(time_sinusoid(transformer, timesteps), x.device)
    e = embed.time_embedder(sin)  # [B·F, C]
    e0 = embed.time_proj(embed.act_fn(e)).unflatten(1, (6, -1)).unflatten(0, (b, frames))
    context = embed.text_embedder(text)
    for block in transformer.blocks:
        tokens = block_forward(block, tokens, e0, context, rotary, frames)
    head = transformer.scale_shift_table.unsqueeze(1) + e.unflatten(0, (b, frames))[:, :, None]
    shift, scale = head.chunk(2, dim=2)
    normed = layer_norm(transformer.norm_out, tokens).unflatten(1, (frames, -1))
    out = transformer.proj_out(normed * (1 + scale) + shift)  # per frame, as CausalHead
    out = out.reshape(b, frames, gh, gw, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return out.flatten(6, 7).flatten(4, 5).flatten(2, 3)
