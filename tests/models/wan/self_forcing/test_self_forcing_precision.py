"""Self-Forcing in bf16 (tiny random configuration, CPU): ``precision=upstream`` equals a
hand-written statement of upstream's code as it casts (guandeh17/Self-Forcing @33593df:
``wan/modules/causal_model.py`` ``CausalWanModel._forward_inference`` and its block, head,
``causal_rope_apply``; ``wan/modules/model.py`` ``WanRMSNorm``, ``WanLayerNorm``,
``sinusoidal_embedding_1d``, ``rope_params``; ``wan/modules/attention.py`` (SDPA fallback);
``pipeline/causal_inference.py``, ``utils/wan_wrapper.py`` x₀, ``utils/scheduler.py``
``add_noise``), and differs from ``precision=fp32-accum``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("diffusers")

from jbkv_cli.kvcache.spec import FULL_PRECISION
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule

BF16 = torch.bfloat16
PROMPT = "a red ball"
CHUNKS = 2


@pytest.fixture(scope="module")
def models():
    return {
        p: sf.load_model(
            config="tiny-random", device="cpu", dtype="bfloat16", precision=p, num_chunks=CHUNKS
        )
        for p in ("upstream", "fp32-accum")
    }


# --- upstream's code, as it runs in bf16, on the tiny transformer's weights ---------------------


def linear(x, layer):
    return F.linear(x, layer.weight, layer.bias)


def wan_rms_norm(x, norm):
    """``WanRMSNorm.forward``: ``self._norm(x.float()).type_as(x) * self.weight``."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + norm.eps)).type_as(x) * (
        norm.weight
    )


def wan_layer_norm(x, norm):
    """``WanLayerNorm.forward``: ``super().forward(x).type_as(x)``."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps).type_as(x)


def rope_params(max_seq_len, dim, theta=10000):
    freqs = torch.outer(
        torch.arange(max_seq_len),
        1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)),
    )
    return torch.polar(torch.ones_like(freqs), freqs)


def causal_rope_apply(x, grid, freqs, start_frame):
    """``[1, L, n, d]``: x in float64 complex times the frequencies, back to x's dtype."""
    f, h, w = grid
    n, c = x.size(2), x.size(3) // 2
    freqs = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    seq_len = f * h * w
    x_i = torch.view_as_complex(x[0, :seq_len].to(torch.float64).reshape(seq_len, n, -1, 2))
    freqs_i = torch.cat(
        [
            freqs[0][start_frame : start_frame + f].view(f, 1, 1, -1).expand(f, h, w, -1),
            freqs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
            freqs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
        ],
        dim=-1,
    ).reshape(seq_len, 1, -1)
    return torch.view_as_real(x_i * freqs_i).flatten(2)[None].type_as(x)


def sdpa(q, k, v):
    """``attention()`` without flash-attn: SDPA over ``[B, L, n, d]`` (bf16)."""
    q, k, v = (t.transpose(1, 2).to(BF16) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).contiguous()


def sinusoidal_embedding_1d(dim, position):
    half = dim // 2
    position = position.type(torch.float64)
    sinusoid = torch.outer(position, torch.pow(10000, -torch.arange(half).to(position).div(half)))
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1)


class Upstream:
    """``CausalWanModel`` in inference with a KV cache, on diffusers' tiny Wan weights (names as
    ``convert_wan_to_diffusers.py`` maps them)."""

    def __init__(self, transformer):
        self.m = transformer
        d = transformer.config.attention_head_dim
        self.heads = transformer.config.num_attention_heads
        self.freqs = torch.cat(
            [
                rope_params(1024, d - 4 * (d // 6)),
                rope_params(1024, 2 * (d // 6)),
                rope_params(1024, 2 * (d // 6)),
            ],
            dim=1,
        )
        self.cache = [None] * len(transformer.blocks)  # per block: (k, v) [1, L, n, d]

    def self_attn(self, i, attn, x, grid, start_frame, update):
        b, s, n = x.shape[0], x.shape[1], self.heads
        q = wan_rms_norm(linear(x, attn.to_q), attn.norm_q).view(b, s, n, -1)
        k = wan_rms_norm(linear(x, attn.to_k), attn.norm_k).view(b, s, n, -1)
        v = linear(x, attn.to_v).view(b, s, n, -1)
        q = causal_rope_apply(q, grid, self.freqs, start_frame).type_as(v)
        k = causal_rope_apply(k, grid, self.freqs, start_frame).type_as(v)
        held = self.cache[i]
        keys = k if held is None else torch.cat([held[0], k], dim=1)
        values = v if held is None else torch.cat([held[1], v], dim=1)
        if update:
            self.cache[i] = (keys, values)
        return linear(sdpa(q, keys, values).flatten(2), attn.to_out[0])

    def cross_attn(self, attn, x, context):
        b, n = x.shape[0], self.heads
        q = wan_rms_norm(linear(x, attn.to_q), attn.norm_q).view(b, -1, n, 32)
        k = wan_rms_norm(linear(context, attn.to_k), attn.norm_k).view(b, -1, n, 32)
        v = linear(context, attn.to_v).view(b, -1, n, 32)
        return linear(sdpa(q, k, v).flatten(2), attn.to_out[0])

    def forward(self, x, t, context, start_frame, update=False):
        """Flow ``[1, C, F, H, W]`` of bf16 latents ``x`` at timesteps ``t`` ``[1, F]``."""
        m = self.m
        emb = m.condition_embedder
        x = F.conv3d(x, m.patch_embedding.weight, m.patch_embedding.bias, stride=(1, 2, 2))
        grid = tuple(x.shape[2:])
        num_frames, frame_seqlen = grid[0], grid[1] * grid[2]
        x = x.flatten(2).transpose(1, 2)
        te = emb.time_embedder
        e = sinusoidal_embedding_1d(256, t.flatten()).type_as(x)
        e = linear(F.silu(linear(e, te.linear_1)), te.linear_2)
        e0 = linear(F.silu(e), emb.time_proj).unflatten(1, (6, -1)).unflatten(0, t.shape)
        tx = emb.text_embedder
        context = linear(F.gelu(linear(context, tx.linear_1), approximate="tanh"), tx.linear_2)
        for i, block in enumerate(m.blocks):
            eb = (block.scale_shift_table.unsqueeze(1) + e0).chunk(6, dim=2)
            h = wan_layer_norm(x, block.norm1).unflatten(1, (num_frames, frame_seqlen))
            y = self.self_attn(
                i, block.attn1, (h * (1 + eb[1]) + eb[0]).flatten(1, 2), grid, start_frame, update
            )
            x = x + (y.unflatten(1, (num_frames, frame_seqlen)) * eb[2]).flatten(1, 2)
            x = x + self.cross_attn(block.attn2, wan_layer_norm(x, block.norm2), context)
            h = wan_layer_norm(x, block.norm3).unflatten(1, (num_frames, frame_seqlen))
            ffn = block.ffn.net
            y = linear(
                F.gelu(
                    linear((h * (1 + eb[4]) + eb[3]).flatten(1, 2), ffn[0].proj), approximate="tanh"
                ),
                ffn[2],
            )
            x = x + (y.unflatten(1, (num_frames, frame_seqlen)) * eb[5]).flatten(1, 2)
        eh = (m.scale_shift_table.unsqueeze(1) + e.unflatten(0, t.shape).unsqueeze(2)).chunk(
            2, dim=2
        )
        h = wan_layer_norm(x, m.norm_out).unflatten(1, (num_frames, frame_seqlen))
        x = linear(h * (1 + eh[1]) + eh[0], m.proj_out)  # [1, F, S, 16·4]
        f, gh, gw = grid
        u = x[0].reshape(f, gh, gw, 1, 2, 2, -1)
        u = torch.einsum("fhwpqrc->cfphqwr", u)
        return u.reshape(u.shape[0], f, gh * 2, gw * 2)[None]


def upstream_sampler(model) -> torch.Tensor:
    """``CausalInferencePipeline.inference`` in bf16 with jbkv's noise draws (float32 on the CPU,
    as bf16 tensors): x₀ = x − σv in float64 cast to bf16; ``add_noise`` with σ a float32 tensor,
    ``type_as(noise)``; the clean pass at t = 0 writes the cache."""
    s = model.config
    schedule = FewStepSchedule.build(s.steps, s.shift)
    text = model.encode_prompt(PROMPT)
    generator = noise_generator(0, PROMPT)
    up = Upstream(model.components.transformer)
    k = s.chunk_frames
    out = []
    for c in range(s.num_chunks):
        x = torch.randn(1, 16, k, 4, 4, generator=generator).to(BF16)
        for i, (t, sigma) in enumerate(zip(schedule.timesteps, schedule.sigmas, strict=True)):
            flow = up.forward(x, torch.full((1, k), t), text, c * k)
            x0 = (x.double() - torch.tensor(sigma).double() * flow.double()).to(flow.dtype)
            if i + 1 < len(schedule):
                noise = torch.randn(1, 16, k, 4, 4, generator=generator).to(BF16)
                nxt = torch.tensor([schedule.sigmas[i + 1]], dtype=torch.float32).reshape(
                    -1, 1, 1, 1
                )
                x = ((1 - nxt) * x0 + nxt * noise).type_as(noise)
        out.append(x0)
        if c + 1 < s.num_chunks:
            up.forward(x0, torch.zeros(1, k), text, c * k, update=True)
    return torch.cat(out, dim=2)


# --- the tests ---------------------------------------------------------------------------------


def test_upstream_precision_is_upstreams_bf16_sampler(models):
    with torch.no_grad():
        ours, _ = models["upstream"].generate_latents(PROMPT, 0, FULL_PRECISION)
        want = upstream_sampler(models["upstream"])
        precise, _ = models["fp32-accum"].generate_latents(PROMPT, 0, FULL_PRECISION)
    assert ours.dtype == BF16 and precise.dtype == torch.float32
    gap = (ours.float() - want.float()).abs()
    print(
        f"upstream: max |jbkv − statement| = {gap.max():.2e}, equal {(gap == 0).float().mean():.4f}"
    )
    # the same ops in the same order but RoPE (complex product vs pairs, both float64): about
    # one bf16 ulp where a float64 RoPE product rounds the other way (measured: none)
    torch.testing.assert_close(ours.float(), want.float(), rtol=2**-7, atol=1e-3)
    assert (gap == 0).float().mean() > 0.99
    rel = (precise - want.float()).norm() / want.float().norm()
    print(f"fp32-accum vs upstream: rel-L2 {rel:.2e}")
    assert rel > 1e-3


def test_upstream_casts_every_parameter_and_a_float64_rope(models):
    """Upstream's ``pipeline.to(bf16)``: no float32 parameter left, RoPE tables float64;
    ``fp32-accum`` keeps diffusers' float32 modules (``tests/models/wan/test_weights.py``)."""
    up = models["upstream"].components.transformer
    assert {p.dtype for p in up.parameters()} == {BF16}
    assert up.rope.freqs_cos.dtype == torch.float64
    precise = models["fp32-accum"].components.transformer
    assert precise.blocks[0].scale_shift_table.dtype == torch.float32
    assert precise.rope.freqs_cos.dtype == torch.float32
