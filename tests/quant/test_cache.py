import pytest
import torch

from jbkv_cli.attention import record_attention
from jbkv_cli.quant import KVSpec
from jbkv_cli.quant.cache import ChunkKVCache


def _chunk(seed, length=16, heads=2, d=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, length, d, generator=g), torch.randn(
        1, heads, length, d, generator=g
    )


def test_window_evicts_whole_chunks_without_requantizing():
    cache = ChunkKVCache(KVSpec("rtn", 2), window=2)
    chunks = [_chunk(i) for i in range(4)]
    cache.commit(*chunks[0])
    cache.commit(*chunks[1])
    second = cache.chunks[1].k.data.clone()
    cache.commit(*chunks[2])
    assert cache.num_chunks == 2 and cache.num_tokens == 32
    assert torch.equal(cache.chunks[0].k.data, second)  # the survivor is untouched
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
    cache = ChunkKVCache(KVSpec("rtn", 2, sink_chunks=1), window=1)
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
    full, int2 = ChunkKVCache(KVSpec()), ChunkKVCache(KVSpec("rtn", 2, group_size=32))
    full.commit(k.bfloat16(), v.bfloat16())
    int2.commit(k.bfloat16(), v.bfloat16())
    assert full.nbytes == 2 * k.numel() * 2
    assert int2.nbytes * 8 / (2 * k.numel()) == pytest.approx(2 + 24 / 32)
    assert int2.peak_nbytes == int2.nbytes


def test_keys_only_and_values_only():
    k, v = _chunk(1)
    konly = ChunkKVCache(KVSpec("rtn", 2, values=False))
    konly.commit(k, v)
    assert torch.equal(konly.read().v, v) and not torch.equal(konly.read().k, k)
    vonly = ChunkKVCache(KVSpec("rtn", 2, keys=False))
    vonly.commit(k, v)
    assert torch.equal(vonly.read().k, k) and vonly.read().k_step is None


def test_bias_only_keeps_exact_keys_and_injects():
    k, v = _chunk(2)
    cache = ChunkKVCache(KVSpec("rtn", 2, bias_only=True))
    cache.commit(k, v)
    view = cache.read()
    assert torch.equal(view.k, k) and view.inject and view.k_step is not None
    q = torch.randn(1, 2, 8, 64)
    kc, vc = _chunk(3, length=8)
    plain = ChunkKVCache(KVSpec())
    plain.commit(k, v)
    with record_attention(every=1) as rec:
        cache2 = ChunkKVCache(KVSpec("rtn", 2, bias_only=True))
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
    with pytest.raises(ValueError, match="quantizer"):
        KVSpec("gptq", 2)
    with pytest.raises(ValueError, match="bits"):
        KVSpec("rtn", 5)
    with pytest.raises(ValueError, match="bits=16"):
        KVSpec("rtn", 16)
    assert KVSpec("rtn", 2, correction="taylor").label == "INT2 rtn g32 +taylor"


def test_keep_view_controls_the_working_buffer():
    k, v = _chunk(0)
    kept, dropped = ChunkKVCache(KVSpec("rtn", 2)), ChunkKVCache(KVSpec("rtn", 2), keep_view=False)
    for c in (kept, dropped):
        c.commit(k, v)
    a, b = kept.read(), dropped.read()
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert kept.read() is a and kept.working_nbytes == 2 * k.numel() * 4
    assert dropped.read() is not b and dropped.working_nbytes == 0
