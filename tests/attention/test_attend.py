import functools
import importlib

import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.attention import CachedKV, attend, attention_backend
from jbkv_cli.attention.correction import CORRECTIONS, fused_width
from jbkv_cli.attention.memory import metering
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import RandomHadamard, quantize_kv

attend_module = importlib.import_module(
    "jbkv_cli.attention.attend"
)  # the package's `attend` is the function
correction_module = importlib.import_module("jbkv_cli.attention.correction")


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
    assert qa.shape[-1] == ka.shape[-1] == va.shape[-1] == 72  # 64 + 2, padded to 8
    assert (ka[..., 40:, 64:] == 0).all() and (va[..., 64:] == 0).all()
    assert (ka[..., 66:] == 0).all() and (qa[..., 66:] == 0).all()
    assert (qa[..., 64:66] > 0).all() and (ka[..., :40, 64:66] < 0).all()
    out = sdpa(qa, ka, va, 0.125)[..., :64]
    ref = attend(q, k, v, (qk, qv), scale=0.125, correction="taylor", backend="reference")
    assert (out - ref).abs().max() <= 1e-5


# --- the fused form's padding (zeros up to a head dim that is a multiple of 8) -----------------

BILINEAR = [name for name, c in CORRECTIONS.items() if c.form in ("taylor", "variance")]
PAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # |padded − unpadded|; outputs are O(1)


def _view(method, correction, d=64, group=32, hq=4, hkv=2, pruned=False, dtype=torch.float32):
    q, kc, vc, k, v = _inputs(hq, hkv, d=d, seed=3)
    kq = quantize_kv(kc, 2, group, method, seed=1)
    cached = CachedKV.from_quantized(
        kq, quantize_kv(vc, 2, group, seed=1), CORRECTIONS[correction].rule
    )
    if pruned:
        cached.valid = (
            torch.rand(cached.k.shape[:-1], generator=torch.Generator().manual_seed(2)) > 0.3
        )
    cast = [t.to(dtype) for t in (q, k, v)]
    cached.k, cached.v = cached.k.to(dtype), cached.v.to(dtype)
    return *cast, cached


@pytest.mark.parametrize("correction", BILINEAR)
@pytest.mark.parametrize("method", ["rtn", "turboquant-mse"])
@pytest.mark.parametrize(
    ("d", "group", "hq", "hkv", "pruned", "causal", "dtype"),
    [
        (64, 32, 4, 2, False, False, torch.float32),  # G = 2: 66 -> 72
        (128, 32, 4, 4, True, False, torch.float32),  # G = 4: 132 -> 136, a pruner's mask
        (32, 16, 6, 1, False, True, torch.float32),  # G = 2: 34 -> 40, causal (LLM prefill)
        (64, 64, 2, 2, True, True, torch.float32),  # G = 1: 65 -> 72
        (128, 32, 4, 2, True, False, torch.bfloat16),  # 132 -> 136 in BF16, GQA and a mask
    ],
)
def test_padding_leaves_every_fused_form_unchanged(
    correction, method, d, group, hq, hkv, pruned, causal, dtype, monkeypatch
):
    """The fused backend padded (the default) and unpadded (``multiple=1``) through ``attend``'s
    own paths: taylor, signed (each rule) on additive and centroid keys, GQA, masks, causal."""
    q, k, v, cached = _view(method, correction, d, group, hq, hkv, pruned, dtype)
    kw = {"scale": d**-0.5, "correction": correction, "backend": "fused", "causal": causal}
    padded = attend(q, k, v, cached, **kw)
    monkeypatch.setitem(
        attend_module.BACKENDS, "fused", functools.partial(attend_module._fused, multiple=1)
    )
    unpadded = attend(q, k, v, cached, **kw)
    assert padded.dtype == unpadded.dtype == dtype
    assert (padded.float() - unpadded.float()).abs().max() <= PAD_TOL[dtype]
    plain = attend(q, k, v, cached, scale=d**-0.5, correction="none", causal=causal)
    assert (padded.float() - plain.float()).abs().max() > 1e-3  # the correction is in both


HEAD_DIMS = (32, 64, 128)  # the tiny-random Wan configs, the embedded model, the real models


def _widths_built(monkeypatch) -> list[int]:
    """Record the head dim of every fused tensor the fused path builds (queries and keys, each
    where ``attend`` and ``build_augmented`` look it up)."""
    built: list[int] = []

    def record(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            built.extend(t.shape[-1] for t in (out if isinstance(out, tuple) else (out,)))
            return out

        return wrapper

    for name in ("augment_keys", "augment_queries"):
        wrapped = record(getattr(correction_module, name))
        monkeypatch.setattr(correction_module, name, wrapped)
        monkeypatch.setattr(attend_module, name, wrapped)
    return built


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_every_fused_head_dim_is_a_multiple_of_8(d, monkeypatch):
    """Over every correction × group size (16..128 and per-channel steps, G = D) × causal: the
    fused path's tensors are ``fused_width(D, G)`` wide, a multiple of 8; only the bilinear
    corrections build them (exact and bias-only take the masked path)."""
    built = _widths_built(monkeypatch)
    for group in (16, 32, 64, 128, 1):  # group 1: a step per channel, G = D (as KIVI's keys)
        if d % group:
            continue
        groups = d // group if group > 1 else d
        for name in CORRECTIONS:
            for causal in (False, True):
                q, k, v, cached = _view("rtn", name, d, group, hq=2, hkv=1)
                assert cached.k_step.shape[-1] == groups
                built.clear()
                kw = {"scale": d**-0.5, "correction": name, "causal": causal}
                attend(q, k, v, cached, backend="fused", **kw)
                if name in BILINEAR:
                    assert built, (name, group)
                    assert set(built) == {fused_width(d, groups)}, (name, group, built)
                    assert all(w % 8 == 0 and w >= d + groups for w in built)
                else:
                    assert not built, name


def test_no_backend_named_takes_the_device_rule(monkeypatch):
    """With no backend named, ``attend`` asks ``choose_backend`` with the call's device, dtype,
    widths, heads and whether a pruner's mask is present, and takes its answer."""
    q, k, v, cached = _view("rtn", "taylor", 64, 32, hq=4, hkv=2, pruned=True)
    asked = []

    def choose(device, dtype, head_dim, groups, **kw):
        asked.append((torch.device(device).type, dtype, head_dim, groups, kw))
        return "reference"

    monkeypatch.setattr(attend_module, "choose_backend", choose)
    with metering() as meter:
        out = attend(q, k, v, cached, scale=0.125, correction="taylor")
    assert meter.peak.path == "reference" and meter.paths == {"reference": 1}
    assert asked == [("cpu", torch.float32, 64, 2, {"q_heads": 4, "kv_heads": 2, "masked": True})]
    with attention_backend("fused"):  # a named backend wins; the rule is not asked
        named = attend(q, k, v, cached, scale=0.125, correction="taylor")
    assert len(asked) == 1 and (out - named).abs().max() <= 1e-5
