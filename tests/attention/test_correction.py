import math

import pytest
import torch

from jbkv_cli.attention.correction import exact_bias, jensen_bias, log_sinhc, taylor_bias
from jbkv_cli.quant import RandomHadamard, quantize_kv


def _mc_ratio(q, step, scale, bias, samples=400_000, seed=0):
    """Monte Carlo of E[exp(δ − b)] for uniform noise with the stored steps Δ (one key).

    Channels are independent, so E[exp δ] = Π_c E[exp(τ q_c ε_c)]: estimate each factor from
    its own samples (float64), which keeps the estimate tight even at large α.
    """
    gen = torch.Generator().manual_seed(seed)
    d = step.double().repeat_interleave(q.shape[-1] // step.shape[-1])
    u = torch.rand(samples, q.shape[-1], generator=gen, dtype=torch.float64) - 0.5
    factors = torch.exp(scale * q.double() * u * d).mean(0)
    return float(torch.exp(factors.log().sum() - bias))


def _key_with_steps(alpha_scale, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 64, generator=gen) * alpha_scale
    q = torch.randn(64, generator=gen)
    return q, quantize_kv(k, bits=2, group_size=32).step[0]


@pytest.mark.parametrize("spread", [0.5, 1.0])
def test_taylor_cancels_jensen_bias_moderate_alpha(spread):
    q, step = _key_with_steps(spread)
    scale = 1 / 8
    b = float(taylor_bias(q[None, None], step[None, None], scale)[0, 0, 0])
    assert _mc_ratio(q, step, scale, 0.0) > 1.01  # uncorrected: clearly inflated
    assert abs(_mc_ratio(q, step, scale, b) - 1) < 0.01


@pytest.mark.parametrize("spread", [0.5, 2.0, 6.0, 15.0])
def test_exact_cancels_jensen_bias_all_alpha(spread):
    q, step = _key_with_steps(spread, seed=1)
    scale = 1 / 8
    b = float(exact_bias(q[None, None], step[None, None], scale)[0, 0, 0])
    raw = _mc_ratio(q, step, scale, 0.0)
    assert raw > 1.005
    assert abs(_mc_ratio(q, step, scale, b) - 1) < 0.005


def test_log_sinhc_stable_and_accurate():
    a = torch.tensor(
        [0.0, 1e-8, 1e-3, 0.1, 0.49, 0.5, 1.0, 5.0, 50.0, 500.0, -3.0], dtype=torch.float64
    )
    got = log_sinhc(a)
    ref = [
        0.0
        if x == 0
        else math.log(math.sinh(abs(x)) / abs(x))
        if abs(x) < 300
        else abs(x) - math.log(2 * abs(x))
        for x in a.tolist()
    ]
    assert torch.isfinite(got).all()
    assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), rtol=1e-7, atol=1e-15)


def test_taylor_matches_exact_for_small_alpha():
    q = torch.randn(1, 2, 5, 64)
    step = torch.rand(1, 2, 7, 2) * 0.01
    t, e = taylor_bias(q, step, 0.125), exact_bias(q, step, 0.125)
    assert torch.allclose(t, e, rtol=1e-3, atol=1e-10)


def test_taylor_formula_by_hand():
    q = torch.zeros(1, 1, 1, 4)
    q[..., :] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    step = torch.tensor([0.5, 2.0]).view(1, 1, 1, 2)  # groups of 2 channels
    want = (0.3**2 / 24) * (0.25 * (1 + 4) + 4.0 * (9 + 16))
    assert taylor_bias(q, step, 0.3).item() == pytest.approx(want, rel=1e-6)


def test_gqa_uses_the_kv_head_it_reads():
    q = torch.randn(1, 4, 3, 64)
    step = torch.rand(1, 2, 5, 2)
    b = taylor_bias(q, step, 0.125)
    for h in range(4):
        one = taylor_bias(q[:, h : h + 1], step[:, h // 2 : h // 2 + 1], 0.125)
        assert torch.allclose(b[:, h : h + 1], one)


def test_rotation_uses_rotated_query():
    rot = RandomHadamard(64, seed=2)
    q = torch.randn(1, 1, 3, 64)
    step = torch.rand(1, 1, 5, 2)
    b = taylor_bias(q, step, 0.125, rot)
    assert torch.allclose(b, taylor_bias(rot.rotate(q), step, 0.125), atol=1e-6)
    # a rotation block equal to the group size keeps group norms: the plain formula holds
    rot32 = RandomHadamard(64, 32, seed=2)
    assert torch.allclose(
        taylor_bias(q, step, 0.125, rot32), taylor_bias(q, step, 0.125), rtol=1e-5
    )


def test_none_is_zero_and_bad_method():
    q, step = torch.randn(1, 1, 3, 64), torch.rand(1, 1, 4, 2)
    assert (jensen_bias(q, step, 0.1, "none") == 0).all()
    with pytest.raises(ValueError, match="method"):
        jensen_bias(q, step, 0.1, "cubic")
    with pytest.raises(ValueError, match="groups"):
        jensen_bias(q, torch.rand(1, 1, 4, 3), 0.1)


def test_exact_table_lookup_equals_direct_evaluation():
    from jbkv_cli.attention.correction import exact_bias_direct

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 33, 64, generator=g) * 2
    step = quantize_kv(torch.randn(1, 2, 70, 64, generator=g) * 3, bits=2).step  # FP8 values
    rot = RandomHadamard(64, seed=1)
    for r in (None, rot):
        fast, direct = exact_bias(q, step, 0.125, r), exact_bias_direct(q, step, 0.125, r)
        assert torch.allclose(fast, direct, rtol=1e-5, atol=1e-6)
    odd = torch.rand(1, 2, 70, 2, generator=g) * 0.3  # not FP8 values: the direct path
    assert torch.equal(exact_bias(q, odd, 0.125), exact_bias_direct(q, odd, 0.125))
