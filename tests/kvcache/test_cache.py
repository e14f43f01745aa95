import pytest
import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant.rtn import RTN


def _chunk(seed, length=16, heads=2, d=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, length, d, generator=g), torch.randn(
        1, heads, length, d, generator=g
    )


def test_window_evicts_whole_chunks_without_requantizing():
    cache = ChunkKVCache(KVSpec.build("rtn", 2), window=2)
    chunks = [_chunk(i) for i in range(4)]
    cache.commit(*chunks[0])
    cache.commit(*chunks[1])
    second = cache.stored(1).data.clone()
    cache.commit(*chunks[2])
    assert cache.num_chunks == 2 and cache.num_tokens == 32
    assert torch.equal(cache.stored(0).data, second)  # the survivor is untouched
    view = cache.read()
    assert view.k.shape == (1, 2, 32, 64)
    assert view.k_step.shape == (1, 2, 32, 2)


def test_read_last_chunks():
    cache = ChunkKVCache(KVSpec(), window=None)
    chunks = [_chunk(i) for i in range(3)]
    for k, v in chunks:
        cache.commit(k, v)
    assert torch.equal(cache.read(last=1).k, chunks[2][0])
    assert torch.equal(cache.read(last=2).k, torch.cat([chunks[1][0], chunks[2][0]], -2))
    assert cache.read(last=0) is None


def test_sink_chunk_stays_full_precision_and_is_never_evicted():
    cache = ChunkKVCache(KVSpec.build("rtn", 2, sink_chunks=1), window=1)
    chunks = [_chunk(i) for i in range(3)]
    for k, v in chunks:
        cache.commit(k, v)
    view = cache.read()
    assert torch.equal(view.k[..., :16, :], chunks[0][0])  # the sink, exact
    assert (view.k_step[..., :16, :] == 0).all()  # unquantized keys: zero bias
    assert (view.k_step[..., 16:, :] > 0).all()
    assert cache.num_chunks == 2


def test_bytes_held_match_formula():
    k, v = _chunk(0, length=64, heads=4, d=128)
    full, int2 = ChunkKVCache(KVSpec()), ChunkKVCache(KVSpec.build("rtn", 2, group_size=32))
    full.commit(k.bfloat16(), v.bfloat16())
    int2.commit(k.bfloat16(), v.bfloat16())
    assert full.nbytes == 2 * k.numel() * 2
    assert int2.nbytes * 8 / (2 * k.numel()) == pytest.approx(2 + 24 / 32)
    assert int2.peak_nbytes == int2.nbytes


def test_keys_only_and_values_only():
    k, v = _chunk(1)
    konly = ChunkKVCache(KVSpec.build("rtn", 2, values=False))
    konly.commit(k, v)
    assert torch.equal(konly.read().v, v) and not torch.equal(konly.read().k, k)
    vonly = ChunkKVCache(KVSpec.build("rtn", 2, keys=False))
    vonly.commit(k, v)
    assert torch.equal(vonly.read().k, k) and vonly.read().k_step is None


def test_bias_only_keeps_exact_keys_and_injects():
    k, v = _chunk(2)
    cache = ChunkKVCache(KVSpec.build("rtn", 2, bias_only=True))
    cache.commit(k, v)
    view = cache.read()
    assert torch.equal(view.k, k) and view.k_step is not None
    assert cache.spec.correction == "bias-only" and cache.spec.correction_.sign == 1.0
    q = torch.randn(1, 2, 8, 64)
    kc, vc = _chunk(3, length=8)
    plain = ChunkKVCache(KVSpec())
    plain.commit(k, v)
    rec = AttentionRecorder(every=1)
    cache2 = ChunkKVCache(KVSpec.build("rtn", 2, bias_only=True), observer=rec)
    cache2.commit(k, v)
    cache2.attend(q, kc, vc, scale=0.125)
    assert rec.summary()["delta_ps"] > 0  # the injected bias steals attention


def test_commit_shape_errors():
    cache = ChunkKVCache(KVSpec())
    with pytest.raises(ValueError, match="B, Hkv, L, D"):
        cache.commit(torch.randn(2, 16, 64), torch.randn(2, 16, 64))
    cache.commit(*_chunk(0))
    with pytest.raises(ValueError, match="does not match"):
        cache.commit(*_chunk(1, heads=3))
    with pytest.raises(ValueError, match="window"):
        ChunkKVCache(KVSpec(), window=-1)


def test_kvspec_validation():
    with pytest.raises(ValueError, match="unknown method 'gptq'"):
        KVSpec.build("gptq", 2)
    with pytest.raises(ValueError, match="bits"):
        KVSpec.build("rtn", 5)
    with pytest.raises(ValueError, match="bits=16"):
        KVSpec.build("rtn", 16)
    assert KVSpec.build("rtn", 2, correction="taylor").label == "INT2 rtn g32 +taylor"


def test_keep_view_controls_the_working_buffer():
    k, v = _chunk(0)
    kept, dropped = (
        ChunkKVCache(KVSpec.build("rtn", 2)),
        ChunkKVCache(KVSpec.build("rtn", 2), keep_view=False),
    )
    for c in (kept, dropped):
        c.commit(k, v)
    a, b = kept.read(), dropped.read()
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert kept.read() is a and kept.working_nbytes == 2 * k.numel() * 4
    assert dropped.read() is not b and dropped.working_nbytes == 0


class _ResidualRTN(RTN):
    """RTN keeping the newest 24 tokens exact (KIVI's residual, on the cache side)."""

    name = "rtn-residual-test"

    def residual_tokens(self, role="key"):
        return 24


def test_residual_tokens_stay_exact_then_are_compressed_once():
    from jbkv_cli.quant.method import KVMethod

    method = _ResidualRTN(2, 32)
    calls = []
    real = KVMethod.quantize

    def counting(self, x, role="key"):
        calls.append((role, x.shape[-2]))
        return real(self, x, role)

    spec = KVSpec(method, method)
    cache = ChunkKVCache(spec, window=None)
    chunks = [_chunk(i, length=16) for i in range(3)]
    KVMethod.quantize = counting
    try:
        cache.commit(*chunks[0])  # 16 tokens, all within the newest 24: exact
        assert calls == [] and cache.read().k_step is None
        assert torch.equal(cache.read().k, chunks[0][0])
        cache.commit(*chunks[1])  # 32 tokens: the oldest 8 are compressed, once
        assert calls == [("key", 8), ("value", 8)]
        cache.commit(*chunks[2])  # 48 tokens: the next 16 (8 + 8 across two chunks)
        assert calls[2:] == [("key", 8), ("key", 8), ("value", 8), ("value", 8)]
    finally:
        KVMethod.quantize = real
    view = cache.read()
    assert torch.equal(
        view.k[..., -24:, :], torch.cat([chunks[1][0][..., 8:, :], chunks[2][0]], -2)
    )
    assert (view.k_step[..., -24:, :] == 0).all() and (view.k_step[..., :24, :] > 0).all()
    assert not torch.equal(view.k[..., :24, :], torch.cat([c[0] for c in chunks], -2)[..., :24, :])
    exact_bytes = 2 * 24 * 2 * 64 * 4  # k and v, 24 tokens, 2 heads, 64 channels, float32
    packed = 2 * 24 * 2 * (64 * 2 // 8 + 2 * (1 + 2))  # codes + FP8 step + BF16 zero per group
    assert cache.nbytes == exact_bytes + packed


def test_a_models_sink_joins_a_spec_that_asks_for_none_or_the_same():
    spec = KVSpec.build("rtn", 2)
    assert spec.with_sink(0) is spec and spec.with_sink(2).sink_chunks == 2
    assert spec.with_sink(2).with_sink(2).sink_chunks == 2
    with pytest.raises(ValueError, match="asks for 2 sink chunk"):
        spec.with_sink(2).with_sink(1)
