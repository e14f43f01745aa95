"""The backend rule per device (jbkv_cli.attention.kernels). No GPU here: the CUDA rule is
evaluated with the device as a parameter (``choose_backend("cuda", ...)`` on a machine without
CUDA takes the documented kernel constraints), and torch's own probe is exercised on CPU
tensors, where it must answer (False: not CUDA) rather than fail on this torch's API."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from jbkv_cli.attention import kernels
from jbkv_cli.attention.correction import fused_width
from jbkv_cli.attention.kernels import (
    choose_backend,
    flex_kernel,
    fused_kernel_fits,
    probe_fused_kernel,
)

HEAD_DIMS = (32, 64, 128)
GROUP_SIZES = (16, 32, 64, 128, 1)  # 1: a step per channel (G = D)


def _groups(d: int) -> list[int]:
    return sorted({d // g for g in GROUP_SIZES if d % g == 0})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_padded_widths_fit_a_fused_cuda_kernel(dtype, masked):
    """Every width the fused form builds fits FlashAttention or the memory-efficient kernel, with
    or without a pruner's mask; unpadded, a masked 16-bit call at D + G = 132 (D = 128, g = 32)
    would not (the math kernel: every score materialized)."""
    for d in HEAD_DIMS:
        for g in _groups(d):
            assert fused_kernel_fits(dtype, fused_width(d, g), gqa=True, masked=masked), (d, g)
    if dtype != torch.float32:
        assert not fused_kernel_fits(dtype, 128 + 4, gqa=False, masked=True)
        assert fused_kernel_fits(dtype, 128 + 4, gqa=False, masked=False)  # flash (it pads)


def test_documented_constraints():
    assert not fused_kernel_fits(torch.float64, 72, gqa=False, masked=False)
    assert fused_kernel_fits(torch.float32, 68, gqa=False, masked=True)  # FP32: a multiple of 4
    assert not fused_kernel_fits(torch.bfloat16, 68, gqa=False, masked=True)  # 16-bit: of 8
    assert fused_kernel_fits(torch.bfloat16, 264, gqa=False, masked=False)  # memory-efficient


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_keeps_the_fused_backend(dtype):
    for d in HEAD_DIMS:
        for g in _groups(d):
            assert choose_backend("cpu", dtype, d, g, masked=True) == "fused"
    assert choose_backend("cpu", dtype, 64, 2, fits=lambda *a: False, compiles=True) == "fused"


def test_cuda_rule():
    """CUDA: the padded fused form where a fused SDPA kernel takes it; compiled flex where none
    does and Triton is there; the fused form (math kernel) where neither."""
    for d in HEAD_DIMS:
        for g in _groups(d):
            for masked in (False, True):
                got = choose_backend(
                    "cuda", torch.bfloat16, d, g, q_heads=24, kv_heads=8, masked=masked
                )
                assert got == "fused", (d, g, masked)
    assert choose_backend("cuda", torch.float64, 64, 2, compiles=True) == "flex"
    assert choose_backend("cuda", torch.float64, 64, 2, compiles=False) == "fused"
    asked = []

    def fits(dtype, width, gqa, masked):
        asked.append((dtype, width, gqa, masked))
        return False

    got = choose_backend(
        "cuda:0",
        torch.bfloat16,
        128,
        4,
        q_heads=4,
        kv_heads=2,
        masked=True,
        fits=fits,
        compiles=True,
    )
    assert got == "flex" and asked == [(torch.bfloat16, 136, True, True)]


def test_cuda_rule_asks_torch_on_a_cuda_device(monkeypatch):
    """With CUDA present the rule takes torch's probe; where the probe cannot answer (None) the
    documented constraints stand in."""
    answers = {"value": False}
    seen = []

    def probe(device, dtype, width, q_heads, kv_heads, masked):
        seen.append((device, dtype, width, q_heads, kv_heads, masked))
        return answers["value"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels, "probe_fused_kernel", probe)
    assert (
        choose_backend("cuda", torch.bfloat16, 64, 2, q_heads=2, masked=True, compiles=True)
        == "flex"
    )
    assert seen == [("cuda", torch.bfloat16, 72, 2, 1, True)]
    answers["value"] = None
    assert choose_backend("cuda", torch.bfloat16, 64, 2, compiles=True) == "fused"


def test_probe_answers_on_this_torch():
    """torch's ``can_use_*_attention`` exists here and refuses CPU tensors: False, not None
    (None would mean this torch's SDPAParams could not be built)."""
    probe_fused_kernel.cache_clear()
    assert probe_fused_kernel("cpu", torch.bfloat16, 72, 2, 1, True) is False
    assert probe_fused_kernel("cpu", torch.float32, 64, 1, 1, False) is False


def test_flex_is_compiled_on_cuda_only(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    assert not kernels.flex_compiles("cpu")
    assert kernels.flex_compiles("cuda") == (importlib.util.find_spec("triton") is not None)
    assert flex_kernel("cpu") is flex_attention
    monkeypatch.setattr(kernels, "flex_compiles", lambda device_type: device_type == "cuda")
    compiled = flex_kernel("cuda")
    assert compiled is not flex_attention and flex_kernel("cuda") is compiled  # built once
    monkeypatch.setattr(kernels, "flex_compiles", lambda device_type: False)
    assert flex_kernel("cuda") is flex_attention  # no Triton: eager
