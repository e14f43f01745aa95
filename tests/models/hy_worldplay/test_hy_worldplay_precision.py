"""HY-WorldPlay in bf16 casts as upstream runs it: every transformer call under
``torch.autocast("cuda", bfloat16)`` over bf16 weights (Tencent-Hunyuan/HY-WorldPlay@da2d0c2
``hyvideo/pipelines/worldplay_video_pipeline.py`` ``_ar_rollout_inner``), so ``layer_norm`` is
float32, the modulation after it float32 (``modulate``/``apply_gate`` cast to ``x``'s dtype) and
every ``linear`` takes its input in bf16. A hand-written statement of one double-stream block's
text stream (``forward_txt`` / ``modulate_txt``) and of ``FinalLayer`` under those rules, on the
tiny random DiT in bf16 (CPU); the sampler keeps the latents in bf16 (``upstream``) or float32
(``fp32-accum``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from jbkv_cli.kvcache import FULL_PRECISION

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def dit():
    from jbkv_cli.models.hy_worldplay.config import TINY
    from jbkv_cli.models.hy_worldplay.tiny import tiny_dit

    return tiny_dit(TINY, seed=0).to(BF16)


def linear(x, layer):
    """autocast ``linear``: the input cast to bf16."""
    return F.linear(x.to(BF16), layer.weight, layer.bias)


def layer_norm(x):
    """autocast ``layer_norm``: float32 in, float32 out (no affine in these blocks)."""
    return F.layer_norm(x.float(), x.shape[-1:], None, None, 1e-6)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1).type_as(x)) + shift.unsqueeze(1).type_as(x)


def apply_gate(x, gate):
    return x * gate.unsqueeze(1).type_as(x)


def rms_norm(x, norm):
    """``RMSNorm.forward``: ``self._norm(x.float()).type_as(x) * self.weight``."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)).type_as(x) * norm.weight


def text_block(block, txt, vec_txt):
    """``forward_txt`` of one ``MMDoubleStreamBlock`` under CUDA autocast's rules."""
    shift1, scale1, gate1, shift2, scale2, gate2 = linear(
        F.silu(vec_txt), block.txt_mod.linear
    ).chunk(6, dim=-1)
    h = modulate(layer_norm(txt), shift1, scale1)
    heads = block.heads_num
    q, k, v = (linear(h, getattr(block, f"txt_attn_{n}")).unflatten(-1, (heads, -1)) for n in "qkv")
    q = rms_norm(q, block.txt_attn_q_norm).to(v)
    k = rms_norm(k, block.txt_attn_k_norm).to(v)
    attn = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    txt = txt + apply_gate(linear(attn.transpose(1, 2).flatten(2), block.txt_attn_proj), gate1)
    mlp = block.txt_mlp
    hidden = F.gelu(linear(modulate(layer_norm(txt), shift2, scale2), mlp.fc1), approximate="tanh")
    return txt + apply_gate(linear(hidden, mlp.fc2), gate2)


@pytest.mark.parametrize("stream", [torch.float32, BF16])
def test_a_text_block_casts_as_upstream_under_autocast(dit, stream):
    """The text stream is float32 once SigLIP's projection (ending in a LayerNorm) joins it,
    bf16 otherwise; either way the block equals the statement op for op."""
    g = torch.Generator().manual_seed(3)
    c = dit.cfg.hidden_size
    txt = torch.randn(1, 9, c, generator=g).to(stream)
    vec = torch.randn(1, c, generator=g).to(BF16)
    block = dit.double_blocks[0]
    with torch.no_grad():
        ours = block.text(txt, vec, None)
        want = text_block(block, txt, vec)
    assert ours.dtype == want.dtype == stream
    assert torch.equal(ours, want)  # the same ops on the same tensors, in the same order


def test_the_final_layer_modulates_in_float32(dit):
    g = torch.Generator().manual_seed(4)
    c = dit.cfg.hidden_size
    x = torch.randn(1, 6, c, generator=g).to(BF16)
    vec = torch.randn(1, 6, c, generator=g).to(BF16)  # per token, as the vision stream's
    fl = dit.final_layer
    with torch.no_grad():
        shift, scale = linear(F.silu(vec), fl.adaLN_modulation[1]).chunk(2, dim=-1)
        h = layer_norm(x) * (1 + scale.float()) + shift.float()
        want = linear(h, fl.linear)
        ours = fl(x, vec)
    assert torch.equal(ours, want)


def test_the_text_stream_is_float32_as_autocast_promotes_it(dit, conditions):
    """``vision_in`` ends in a LayerNorm (float32 under autocast); concatenated with the bf16
    Qwen and ByT5 tokens the text stream becomes float32 (``torch.cat`` promotes)."""
    cond, _ = conditions(dit, dit.cfg, "w-7", 8)
    assert cond.txt.dtype == torch.float32 and cond.vec_txt.dtype == BF16


def test_the_sampler_keeps_latents_as_its_precision_says(tmp_path):
    from jbkv_cli.models.cases import Case
    from jbkv_cli.models.hy_worldplay import load_model

    Image.new("RGB", (24, 16), (200, 40, 90)).save(tmp_path / "1.png")
    case = Case("a red house", image=str(tmp_path / "1.png"), trajectory="w-7")
    out = {}
    for precision in ("upstream", "fp32-accum"):
        model = load_model(
            config="tiny-random", device="cpu", dtype="bfloat16", num_chunks=2, precision=precision
        )
        assert model.settings["precision"] == precision
        out[precision], _, _ = model.sample_latents(case, 0, FULL_PRECISION)
    assert out["upstream"].dtype == BF16 and out["fp32-accum"].dtype == torch.float32
    rel = (out["upstream"].float() - out["fp32-accum"]).norm() / out["fp32-accum"].norm()
    assert 0 < rel < 5e-2, rel
