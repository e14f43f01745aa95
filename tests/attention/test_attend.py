import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.attention import CachedKV, attend, attention_backend
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import RandomHadamard, quantize_kv


def _inputs(hq=4, hkv=4, lq=24, lc=40, lcur=24, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, lq, d, generator=g)
    kc, vc = torch.randn(2, hkv, lc, d, generator=g), torch.randn(2, hkv, lc, d, generator=g)
    k, v = torch.randn(2, hkv, lcur, d, generator=g), torch.randn(2, hkv, lcur, d, generator=g)
    return q, kc, vc, k, v


@pytest.mark.parametrize("scheme", ["rtn", "quarot"])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("backend", ["fused", "flex"])
def test_fused_matches_dense_reference(scheme, hq, hkv, backend):
    q, kc, vc, k, v = _inputs(hq, hkv)
    cached = (quantize_kv(kc, 2, 32, scheme, seed=1), quantize_kv(vc, 2, 32, scheme, seed=1))
    ref = attend(q, k, v, cached, scale=0.125, correction="taylor", backend="reference")
    out = attend(q, k, v, cached, scale=0.125, correction="taylor", backend=backend)
    assert (out - ref).abs().max() <= 1e-5
    plain = attend(q, k, v, cached, scale=0.125, correction="none")
    assert (plain - ref).abs().max() > 1e-3  # the correction changes something


def test_reference_equals_explicit_softmax():
    q, kc, vc, k, v = _inputs(hq=4, hkv=2)
    qk, qv = quantize_kv(kc, 2), quantize_kv(vc, 2)
    tau = 0.1
    for method in ("taylor", "exact"):
        out = attend(q, k, v, (qk, qv), scale=tau, correction=method, backend="reference")
        kk = torch.cat([qk.dequantize(), k], -2).repeat_interleave(2, 1)
        vv = torch.cat([qv.dequantize(), v], -2).repeat_interleave(2, 1)
        from jbkv_cli.attention import jensen_bias

        s = tau * q @ kk.transpose(-1, -2)
        s[..., :40] -= jensen_bias(q, qk.step, tau, method)
        assert torch.allclose(out, s.softmax(-1) @ vv, atol=1e-5)


def test_sixteen_bit_cache_is_bit_identical_to_sdpa():
    q, kc, vc, k, v = _inputs()
    cache = ChunkKVCache(KVSpec(), window=4)
    cache.commit(kc, vc)
    out = cache.attend(q, k, v, scale=0.125)
    plain = F.scaled_dot_product_attention(
        q, torch.cat([kc, k], -2), torch.cat([vc, v], -2), scale=0.125
    )
    assert torch.equal(out, plain)


def test_empty_cache_is_plain_attention():
    q, _, _, k, v = _inputs()
    out = ChunkKVCache(KVSpec.build("rtn", 2, correction="taylor")).attend(q, k, v, scale=0.2)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, scale=0.2))


def test_rotation_without_quantization_leaves_attention_unchanged():
    q, kc, vc, k, v = _inputs()
    rot = RandomHadamard(64, seed=7)
    plain = attend(q, k, v, CachedKV(kc, vc), scale=0.125, correction="none")
    rotated = attend(
        rot.rotate(q),
        rot.rotate(k),
        v,
        CachedKV(rot.rotate(kc), vc),
        scale=0.125,
        correction="none",
    )
    assert (plain - rotated).abs().max() <= 1e-5
    cached16 = (quantize_kv(kc, 16, scheme="quarot", seed=7), quantize_kv(vc, 16, scheme="quarot"))
    assert (attend(q, k, v, cached16, scale=0.125) - plain).abs().max() <= 1e-5


def test_unquantized_keys_get_zero_bias():
    q, kc, vc, k, v = _inputs()
    cached = CachedKV(kc, vc, k_step=torch.zeros(2, 4, 40, 2))
    a = attend(q, k, v, cached, scale=0.125, correction="taylor")
    b = attend(q, k, v, CachedKV(kc, vc), scale=0.125, correction="none")
    assert torch.allclose(a, b, atol=1e-6)


def test_exact_backend_blocks_agree():
    from jbkv_cli.attention.attend import masked

    q, kc, vc, k, v = _inputs(lq=50)
    cached = CachedKV.from_quantized(quantize_kv(kc, 2), quantize_kv(vc, 2))
    kk, vv = torch.cat([cached.k, k], -2), torch.cat([cached.v, v], -2)
    a = masked(q, kk, vv, cached, 0.125, "exact", block=7)
    b = masked(q, kk, vv, cached, 0.125, "exact", block=None)
    assert torch.allclose(a, b, atol=1e-6)


def test_backend_context_manager():
    q, kc, vc, k, v = _inputs()
    cached = (quantize_kv(kc, 2), quantize_kv(vc, 2))
    with attention_backend("reference"):
        a = attend(q, k, v, cached, scale=0.125)
    assert torch.allclose(a, attend(q, k, v, cached, scale=0.125, backend="reference"))
    with pytest.raises(ValueError, match="backend"), attention_backend("triton"):
        pass


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"k": torch.randn(2, 4, 24, 32)}, "k_cur"),
        ({"q": torch.randn(2, 3, 24, 64)}, "multiple"),
        ({"q": torch.ones(2, 4, 24, 64, dtype=torch.long)}, "floating"),
        ({"correction": "quadratic"}, "correction"),
    ],
)
def test_bad_input(change, match):
    q, kc, vc, k, v = _inputs()
    args = {"q": q, "k": k, "correction": "taylor"} | change
    with pytest.raises(ValueError, match=match):
        attend(
            args["q"],
            args["k"],
            v,
            (quantize_kv(kc, 2), quantize_kv(vc, 2)),
            scale=0.1,
            correction=args["correction"],
        )


def test_augment_taylor_is_the_fused_form():
    from jbkv_cli.attention.attend import sdpa
    from jbkv_cli.attention.correction import augment_taylor

    q, kc, vc, k, v = _inputs(hq=4, hkv=2)
    qk, qv = quantize_kv(kc, 2), quantize_kv(vc, 2)
    kk, vv = torch.cat([qk.dequantize(), k], -2), torch.cat([qv.dequantize(), v], -2)
    qa, ka, va = augment_taylor(q, kk, vv, qk.step, 0.125)
    assert qa.shape[-1] == ka.shape[-1] == va.shape[-1] == 64 + 2
    assert (ka[..., 40:, 64:] == 0).all() and (va[..., 64:] == 0).all()
    out = sdpa(qa, ka, va, 0.125)[..., :64]
    ref = attend(q, k, v, (qk, qv), scale=0.125, correction="taylor", backend="reference")
    assert (out - ref).abs().max() <= 1e-5
