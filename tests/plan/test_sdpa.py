"""The SDPA kernel a GPU takes, and what the plan allocates for it."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.plan.sdpa import gpu_kernels, planned_sdpa, sdpa_kernel
from jbkv_cli.plan.tracker import MemoryTracker
from jbkv_cli.utils.fake_cuda import FakeCuda

BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("dtype", "dims", "masked", "kernel"),
    [
        (BF16, (128, 128, 128), False, "flash"),
        (BF16, (132, 132, 132), False, "flash"),  # flash pads to a multiple of 8 itself
        (BF16, (264, 264, 264), False, "efficient"),  # past flash's 256
        (BF16, (128, 128, 128), True, "efficient"),  # a mask: not flash
        (BF16, (132, 132, 132), True, "math"),  # masked and not a multiple of 8
        (F32, (128, 128, 128), False, "efficient"),  # flash is 16-bit only
        (F32, (66, 66, 66), False, "math"),
        (BF16, (128, 128, 64), False, "efficient"),  # v narrower than q, k
    ],
)
def test_the_kernel_rule(dtype, dims, masked, kernel):
    assert sdpa_kernel(dtype, *dims, masked) == kernel


def test_off_cuda_it_is_torch_itself():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8, 16, generator=g) for _ in range(3))
    assert torch.equal(planned_sdpa(q, k, v), F.scaled_dot_product_attention(q, k, v))


def _fake_call(q_shape, kv_shape, dtype=BF16, mask=None, **kw) -> tuple[int, torch.Size]:
    """Bytes left live by one fake-CUDA SDPA call (its output) and the output's shape."""
    with FakeCuda(), MemoryTracker() as tracker, gpu_kernels():
        q = torch.empty(q_shape, device="cuda", dtype=dtype)
        kv = torch.empty(kv_shape, device="cuda", dtype=dtype)
        m = None if mask is None else torch.zeros(mask, device="cuda", dtype=dtype)
        before = tracker.total
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=m, **kw)
        gc.collect()
        return tracker.total - before, out.shape


def test_a_fused_kernel_leaves_only_its_output():
    # flash with grouped heads: out [1, 8, 100, 128] bf16 = 204,800 bytes (its log-sum-exp dies)
    added, shape = _fake_call((1, 8, 100, 128), (1, 2, 300, 128), enable_gqa=True)
    assert shape == (1, 8, 100, 128)
    assert added == 1 * 8 * 100 * 128 * 2
    # memory-efficient with a mask row: the same output
    added, _ = _fake_call((1, 8, 100, 128), (1, 2, 300, 128), mask=(1, 8, 1, 300), enable_gqa=True)
    assert added == 1 * 8 * 100 * 128 * 2


def test_the_math_kernel_materializes_the_scores():
    # a masked call of head dim 132 has no fused kernel: float32 scores [1, 4, 64, 64] at least
    with FakeCuda(), MemoryTracker() as tracker, gpu_kernels():
        q = torch.empty(1, 4, 64, 132, device="cuda", dtype=BF16)
        m = torch.zeros(1, 4, 1, 64, device="cuda", dtype=BF16)
        tracker.reset_peak()
        F.scaled_dot_product_attention(q, q, q, attn_mask=m)
        assert tracker.peak.total - 2 * q.numel() >= 4 * 64 * 64 * 4


def test_gpu_kernels_restores_sdpa():
    original = F.scaled_dot_product_attention
    with gpu_kernels():
        assert F.scaled_dot_product_attention is not original
    assert F.scaled_dot_product_attention is original
