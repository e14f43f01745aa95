"""Attention with per-KV-head dropped cached tokens (``CachedKV.valid``): every backend and
correction equals attention over the kept tokens alone, computed head by head."""

import pytest
import torch

from jbkv_cli.attention import CachedKV, attend, jensen_bias
from jbkv_cli.quant import quantize_kv

TAU = 0.125


def _case(hq=4, hkv=2, lq=12, lc=48, lcur=16, d=64, seed=0, scheme="rtn"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, lq, d, generator=g)
    kc, vc = torch.randn(2, hkv, lc, d, generator=g), torch.randn(2, hkv, lc, d, generator=g)
    k, v = torch.randn(2, hkv, lcur, d, generator=g), torch.randn(2, hkv, lcur, d, generator=g)
    qk, qv = quantize_kv(kc, 2, 32, scheme, seed=1), quantize_kv(vc, 2, 32, scheme, seed=1)
    valid = torch.rand(2, hkv, lc, generator=g) < 0.4
    valid[0, 0] = False  # a head with nothing cached left
    cached = CachedKV(qk.dequantize(), qv.dequantize(), qk.step, qk.rotation, valid=valid)
    return q, k, v, cached


def _oracle(q, k, v, cached: CachedKV, form: str | None, sign: float = -1.0) -> torch.Tensor:
    """Per batch element and query head: softmax over [kept cached | current] only."""
    out = torch.empty_like(q)
    rep = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            kv = h // rep
            idx = cached.valid[b, kv].nonzero().flatten()
            keys = torch.cat([cached.k[b, kv, idx], k[b, kv]])
            values = torch.cat([cached.v[b, kv, idx], v[b, kv]])
            s = TAU * q[b, h] @ keys.T
            if form is not None and len(idx):
                step = cached.k_step[b, kv, idx][None, None]
                bias = jensen_bias(q[b, h][None, None], step, TAU, form, cached.rotation)[0, 0]
                s[:, : len(idx)] += sign * bias
            out[b, h] = s.softmax(-1) @ values
    return out


@pytest.mark.parametrize("scheme", ["rtn", "quarot"])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2)])
@pytest.mark.parametrize("backend", ["fused", "flex", "reference"])
@pytest.mark.parametrize(
    ("correction", "form", "sign"),
    [("none", None, -1.0), ("taylor", "taylor", -1.0), ("exact", "exact", -1.0)],
)
def test_masked_attention_equals_attention_over_kept_tokens(
    scheme, hq, hkv, backend, correction, form, sign
):
    q, k, v, cached = _case(hq, hkv, scheme=scheme)
    out = attend(q, k, v, cached, scale=TAU, correction=correction, backend=backend)
    assert torch.allclose(out, _oracle(q, k, v, cached, form, sign), atol=2e-5)


def test_bias_only_ablation_adds_the_bias_on_kept_tokens():
    q, k, v, cached = _case()
    out = attend(q, k, v, cached, scale=TAU, correction="bias-only")
    assert torch.allclose(out, _oracle(q, k, v, cached, "exact", +1.0), atol=2e-5)


@pytest.mark.parametrize("correction", ["taylor", "exact"])
@pytest.mark.parametrize("backend", ["fused", "flex", "reference"])
def test_correction_of_dropped_tokens_is_irrelevant(correction, backend):
    q, k, v, cached = _case()
    out = attend(q, k, v, cached, scale=TAU, correction=correction, backend=backend)
    cached.k_step = cached.k_step.masked_fill(~cached.valid[..., None], 40.0)
    cached.k = cached.k.masked_fill(~cached.valid[..., None], 1e4)
    again = attend(q, k, v, cached, scale=TAU, correction=correction, backend=backend)
    assert torch.isfinite(again).all() and torch.allclose(out, again, atol=1e-6)


def test_all_valid_is_bit_identical_to_no_mask():
    q, k, v, cached = _case()
    cached.valid = torch.ones_like(cached.valid)
    full = CachedKV(cached.k, cached.v, cached.k_step, cached.rotation)
    for correction in ("none", "taylor"):
        a = attend(q, k, v, cached, scale=TAU, correction=correction)
        assert torch.equal(a, attend(q, k, v, full, scale=TAU, correction=correction))


def test_valid_shape_is_checked():
    q, k, v, cached = _case()
    cached.valid = cached.valid[..., :-1]
    with pytest.raises(ValueError, match="valid"):
        attend(q, k, v, cached, scale=TAU)


def _repeated(cached: CachedKV) -> CachedKV:
    """``cached`` with each token written out ``copies`` times (upstream's duplicated rows),
    per (batch, KV head) padded with dropped rows to one length."""
    b, h, _, d = cached.k.shape
    rows = int(cached.copies.sum(-1).max())
    k, v = torch.zeros(b, h, rows, d), torch.zeros(b, h, rows, d)
    step = torch.zeros(b, h, rows, cached.k_step.shape[-1])
    valid = torch.zeros(b, h, rows, dtype=torch.bool)
    for i in range(b):
        for j in range(h):
            idx = torch.arange(cached.k.shape[-2]).repeat_interleave(cached.copies[i, j].long())
            n = len(idx)
            k[i, j, :n], v[i, j, :n] = cached.k[i, j, idx], cached.v[i, j, idx]
            step[i, j, :n], valid[i, j, :n] = cached.k_step[i, j, idx], True
    return CachedKV(k, v, step, cached.rotation, valid=valid)


@pytest.mark.parametrize("backend", ["fused", "flex", "reference"])
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_a_token_held_twice_equals_its_row_written_twice(backend, correction):
    q, k, v, cached = _case(4, 2)
    g = torch.Generator().manual_seed(7)
    cached.copies = cached.valid.to(torch.uint8) * torch.randint(
        1, 4, cached.valid.shape, generator=g
    ).to(torch.uint8)
    out = attend(q, k, v, cached, scale=TAU, correction=correction, backend=backend)
    want = attend(q, k, v, _repeated(cached), scale=TAU, correction=correction, backend="reference")
    assert torch.allclose(out, want, atol=2e-5)
    once = CachedKV(cached.k, cached.v, cached.k_step, cached.rotation, valid=cached.valid)
    assert not torch.allclose(out, attend(q, k, v, once, scale=TAU, correction=correction))
