import torch

from jbkv_cli.attention import AttentionRecorder, CachedKV
from jbkv_cli.attention.diagnostics import compare_attention, jsd, score_noise
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import quantize_kv


def _attention_problem(seed=0, lc=512, lcur=128, d=64, heads=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, lcur, d, generator=g) * 1.5
    kc, vc = (
        torch.randn(1, heads, lc, d, generator=g) * 1.5,
        torch.randn(1, heads, lc, d, generator=g),
    )
    k, v = (
        torch.randn(1, heads, lcur, d, generator=g) * 1.5,
        torch.randn(1, heads, lcur, d, generator=g),
    )
    return q, kc, vc, k, v


def _delta_ps(spec, seed=0):
    q, kc, vc, k, v = _attention_problem(seed)
    rec = AttentionRecorder(max_queries=128, every=1)
    cache = ChunkKVCache(spec, observer=rec)
    cache.commit(kc, vc)
    cache.attend(q, k, v, scale=1 / 8)
    return rec.summary()["delta_ps"]


def test_int2_steals_attention_and_taylor_gives_it_back():
    for scheme in ("rtn", "quarot"):
        raw = _delta_ps(KVSpec.build(scheme, 2))
        corrected = _delta_ps(KVSpec.build(scheme, 2, correction="taylor"))
        exact = _delta_ps(KVSpec.build(scheme, 2, correction="exact"))
        assert raw > 0.005
        assert abs(corrected) * 3 <= raw
        assert abs(exact) * 3 <= raw


def test_full_precision_records_nothing():
    assert _delta_ps(KVSpec()) is None


def test_compare_attention_zero_for_identical_cache():
    q, kc, vc, k, v = _attention_problem(1, lc=64, lcur=32)
    cached = CachedKV(kc, vc, k_ref=kc, v_ref=vc)
    stats = compare_attention(q, k, v, cached, 0.125, "none", block=7)
    assert torch.allclose(stats.p_s, stats.p_s_ref)
    assert stats.jsd.abs().max() < 1e-6 and stats.out_mse.max() < 1e-10
    assert stats.p_s.shape == (4 * 32,)


def test_jsd_properties():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    r = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    out = jsd(p, r)
    assert out[0].abs() < 1e-9
    assert abs(float(out[1]) - 0.6931) < 1e-3  # ln 2 for disjoint supports


def test_noise_model_check_near_uniform_prediction():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 64, 64, generator=g)
    k = torch.randn(1, 2, 1024, 64, generator=g)
    qt = quantize_kv(k, bits=4, group_size=32)
    stats = score_noise(q, k, qt.dequantize(), qt.step, 0.125)
    # measured error variance within 25% of the uniform model's prediction; mean ≈ 0
    assert 0.75 < stats["measured_var"] / stats["predicted_var"] < 1.25
    assert abs(stats["z_mean"]) < 0.05


def test_token_selection_shift_counts_queries_whose_top1_token_changed():
    """A constructed case (QuantWM's Table 4 metric): cached keys A = (1, 0), B = (0, 1) are
    read back as A' = (0.9, 0), B; the current chunk's key is (0.95, −1). Query (4, 0) picks A
    (4 vs 3.8) with full precision, the current token (3.6 vs 3.8) with A'; (4, 3.9) picks A
    (4 vs 3.9), then B; (0, 4) and (3.9, 4) pick B either way: a shift of 2/4."""
    q = torch.tensor([[4.0, 0.0], [0.0, 4.0], [4.0, 3.9], [3.9, 4.0]]).view(1, 1, 4, 2)
    k_ref = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(1, 1, 2, 2)
    k_hat = torch.tensor([[0.9, 0.0], [0.0, 1.0]]).view(1, 1, 2, 2)
    k_cur = torch.tensor([[0.95, -1.0]]).view(1, 1, 1, 2)
    v = torch.zeros(1, 1, 2, 2)
    cached = CachedKV(k_hat, v, k_ref=k_ref, v_ref=v)
    stats = compare_attention(q, k_cur, v[..., :1, :], cached, 1.0, "none", block=3)
    assert stats.top1_shift.tolist() == [1.0, 0.0, 1.0, 0.0]
    rec = AttentionRecorder(every=1)
    rec.observe(q, k_cur, v[..., :1, :], cached, 1.0, "none")
    assert rec.summary()["token_shift"] == 0.5
    same = CachedKV(k_ref, v, k_ref=k_ref, v_ref=v)
    assert compare_attention(q, k_cur, v[..., :1, :], same, 1.0, "none").top1_shift.sum() == 0


def test_token_selection_shift_is_recorded_for_a_quantized_cache():
    q, kc, vc, k, v = _attention_problem(2)
    rec = AttentionRecorder(max_queries=128, every=1)
    cache = ChunkKVCache(KVSpec.build("rtn", 2), observer=rec)
    cache.commit(kc, vc)
    cache.attend(q, k, v, scale=1 / 8)
    shift = rec.summary()["token_shift"]
    assert 0.0 < shift < 1.0  # INT2 moves some queries' top-1 token, not all
