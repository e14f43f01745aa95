import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jbkv_cli.quant import quantize_kv
from jbkv_cli.quant.groupwise import (
    FP8_MIN_STEP,
    dequantize_groups,
    pack_codes,
    quantize_groups,
    round_down_bf16,
    round_up_fp8,
    unpack_codes,
)


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([1, 2, 3, 4, 8]), blocks=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_pack_unpack_round_trip(bits, blocks, seed):
    n = 8 * blocks
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (3, n), generator=gen, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape[-1] * 8 == n * bits  # exactly B bits per code
    assert torch.equal(unpack_codes(packed, bits, n), codes)


def test_int2_packs_four_codes_little_end_first():
    codes = torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8)
    assert pack_codes(codes, 2).item() == 1 | (2 << 2) | (3 << 4)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [8, 32, 64])
def test_error_bounded_by_half_step(bits, group_size):
    x = torch.randn(4, 2, 50, 64, generator=torch.Generator().manual_seed(bits)) * 3
    codes, step, zero = quantize_groups(x, bits, group_size)
    x_hat = dequantize_groups(codes, step, zero)
    half = step.float().repeat_interleave(group_size, -1) / 2
    assert ((x - x_hat).abs() <= half * (1 + 1e-5) + 1e-6).all()


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_stored_grid_covers_range_no_clamping(bits):
    # The top code must never be needed beyond 2^B - 1: max reaches at most the top grid point.
    x = torch.randn(2000, 32, generator=torch.Generator().manual_seed(1)) * 0.7
    _, step, zero = quantize_groups(x, bits, 32)
    top = (zero.float() + step.float() * ((1 << bits) - 1)).squeeze(-1)
    assert (top >= x.amax(-1)).all()
    assert (zero.float().squeeze(-1) <= x.amin(-1)).all()
    unclamped = (x - zero.float()) / step.float()
    assert unclamped.max() <= (1 << bits) - 1 + 0.5  # the clamp never changes a rounded code


@pytest.mark.parametrize("bits", [2, 4])
def test_mean_error_is_zero_no_bias(bits):
    x = torch.randn(20000, 64, generator=torch.Generator().manual_seed(2))
    qt = quantize_kv(x, bits=bits, group_size=32)
    err = (qt.dequantize() - x).unflatten(-1, (2, 32))  # [N, G, g]
    mean_step = qt.step.mean()
    # per group position, the mean error over many tokens is a tiny fraction of the step
    assert err.mean(0).abs().max() < 0.02 * mean_step


@pytest.mark.parametrize("grid", ["covering", "nearest"])
def test_one_bit_codes_are_the_two_ends_of_each_group(grid):
    """At 1 bit a group has two levels, ``z`` and ``z + Δ`` with ``Δ`` the group's range (up to
    the FP8/BF16 rounding of the stored grid), and each value goes to the nearer one; the codes
    take 1 bit each and the group's step and zero point 24 bits: ``1 + 24/g`` bits per element."""
    x = torch.randn(300, 64, generator=torch.Generator().manual_seed(5)) * 2
    codes, step, zero = quantize_groups(x, 1, 32, grid)
    assert set(codes.unique().tolist()) <= {0, 1}
    lo, hi = x.unflatten(-1, (2, 32)).aminmax(dim=-1)
    d, z = step.float(), zero.float()
    assert torch.allclose(d, hi - lo, rtol=0.13) and torch.allclose(z, lo, rtol=0.01, atol=0.02)
    x_hat = dequantize_groups(codes, step, zero)
    ends = torch.stack([z, z + d]).repeat_interleave(32, -1)  # [2, N, D]
    nearer = (x - ends).abs().argmin(0)
    assert (nearer == codes.long()).float().mean() > 0.999  # ties at the midpoint aside
    assert torch.equal(x_hat, ends.gather(0, codes.long().unsqueeze(0)).squeeze(0))
    qt = quantize_kv(x, bits=1, group_size=32)
    assert qt.nbytes * 8 == x.numel() * (1 + 24 / 32)


def test_covering_grid_rounds_group_extremes_outward():
    """The stored grid covers each group (step rounded up to FP8, zero point down), so a
    group's maximum is never rounded down and its minimum never up: keys grow along themselves
    on average (k·e > 0). This is the positive mean score error the diagnostics report as
    ``noise_z_mean`` and the Jensen correction does not model (README, ablations)."""
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(3))
    qt = quantize_kv(x, bits=2, group_size=32)
    err = qt.dequantize() - x
    xg, eg = x.unflatten(-1, (2, 32)), err.unflatten(-1, (2, 32))
    at_max = eg.gather(-1, xg.argmax(-1, keepdim=True))
    at_min = eg.gather(-1, xg.argmin(-1, keepdim=True))
    assert (at_max >= 0).all() and (at_min <= 0).all()
    assert at_max.mean() > 0.05 * qt.step.mean()
    assert (x * err).sum(-1).mean() > 0.01 * x.shape[-1]


def test_constant_group_dequantizes_exactly():
    x = torch.randn(5, 64)
    x[:, :32] = torch.tensor([0.0, 1.5, -3.25, 7.0, 100.0]).unsqueeze(-1)
    for bits in (1, 2, 3, 4, 8):
        qt = quantize_kv(x, bits=bits, group_size=32)
        assert (qt.step[:, 0] == 0).all()
        assert torch.equal(qt.dequantize()[:, :32], x[:, :32])
    xb = torch.full((3, 64), -0.3).bfloat16()
    assert torch.equal(quantize_kv(xb, bits=2).dequantize(), xb)


def test_small_magnitude_inputs_still_covered():
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(3)) * 1e-4
    for bits in (2, 4, 8):
        qt = quantize_kv(x, bits=bits, group_size=32)
        step = qt.step
        nonzero = step[step > 0]
        assert (nonzero >= FP8_MIN_STEP).all()  # the FP8 subnormal floor, documented
        half = step.repeat_interleave(32, -1) / 2
        assert ((qt.dequantize() - x).abs() <= half + 1e-7).all()


def test_round_up_fp8_is_smallest_cover():
    s = torch.rand(10000, generator=torch.Generator().manual_seed(4)) * 100
    up = round_up_fp8(s).float()
    assert (up >= s).all()
    assert (up / s < 1.13).all()  # 3 mantissa bits: at most 12.5% above (normals)
    # the next representable value below is < s
    below = (round_up_fp8(s).view(torch.uint8) - 1).view(torch.float8_e4m3fn).float()
    assert (below < s).all()
    assert round_up_fp8(torch.tensor([0.0])).float().item() == 0.0


def test_round_down_bf16():
    x = torch.randn(10000) * 10
    down = round_down_bf16(x).float()
    assert (down <= x).all()
    assert ((x - down) <= x.abs() * 2**-7 + 1e-30).all()


def test_range_too_large_for_fp8_is_an_error():
    x = torch.zeros(1, 32)
    x[0, 0] = 5000.0
    with pytest.raises(ValueError, match="FP8"):
        quantize_kv(x, bits=2, group_size=32)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_effective_bits_from_stored_bytes(bits, group_size):
    x = torch.randn(2, 8, 256, 128)
    qt = quantize_kv(x, bits=bits, group_size=group_size)
    measured = qt.nbytes * 8 / x.numel()
    expected = bits + 24 / group_size
    assert abs(measured - expected) / expected < 0.005
    assert qt.effective_bits == pytest.approx(expected, rel=0.005)


def test_sixteen_bit_is_identity():
    x = torch.randn(3, 10, 64)
    qt = quantize_kv(x, bits=16)
    assert qt.step is None
    assert torch.equal(qt.dequantize(), x)
    assert qt.nbytes == x.numel() * 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bits": 5}, "bits"),
        ({"group_size": 24}, "does not divide the head dim 64"),
        ({"scheme": "gptq"}, "unknown method .gptq."),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_kv(torch.randn(4, 64), **kwargs)


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.ones(4, 64, dtype=torch.int32), "floating"),
        (torch.full((4, 64), float("nan")), "NaN"),
        (torch.full((4, 64), float("inf")), "NaN or inf"),
        (torch.ones(64), r"\[\.\.\., L, D\]"),
    ],
)
def test_bad_tensors(x, match):
    with pytest.raises(ValueError, match=match):
        quantize_kv(x)
