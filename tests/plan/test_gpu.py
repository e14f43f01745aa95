"""On a CUDA GPU (``cuda``-marked: skipped elsewhere, ``make gpu-check`` runs them): the plan's
SDPA rule is torch's, the corrected fused form keeps FlashAttention, and the plan of the
embedded model matches what the GPU allocates."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.attention.correction import fused_width
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.registry import load_model
from jbkv_cli.plan.run import plan_model
from jbkv_cli.plan.sdpa import sdpa_kernel

pytestmark = pytest.mark.cuda

PROMPT = "a red circle moves right on a dark background"


def _params(dtype, dims, masked, q_heads=8, kv_heads=2):
    q = torch.zeros(1, q_heads, 64, dims[0], dtype=dtype, device="cuda")
    k = torch.zeros(1, kv_heads, 64, dims[1], dtype=dtype, device="cuda")
    v = torch.zeros(1, kv_heads, 64, dims[2], dtype=dtype, device="cuda")
    mask = torch.zeros(1, q_heads, 1, 64, dtype=dtype, device="cuda") if masked else None
    return torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, False, q_heads != kv_heads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dims", [(64, 64, 64), (128, 128, 128), (132, 132, 132), (136, 136, 136)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_plans_sdpa_rule_is_torchs(dtype, dims, masked):
    cuda = torch.backends.cuda
    params = _params(dtype, dims, masked)
    flash = cuda.can_use_flash_attention(params, False)
    fused = flash or cuda.can_use_efficient_attention(params, False)
    kernel = sdpa_kernel(dtype, *dims, masked)
    assert (kernel == "flash") == flash
    assert (kernel != "math") == fused


def test_the_corrected_fused_form_keeps_flash():
    width = fused_width(128, 128 // 32)  # 128 channels + 4 correction channels, padded
    assert width % 8 == 0
    assert torch.backends.cuda.can_use_flash_attention(
        _params(torch.bfloat16, (width,) * 3, False), False
    )


def test_the_plan_of_the_embedded_model_is_what_the_gpu_allocates():
    spec = KVSpec.build("rtn", 2, correction="taylor")
    plan = plan_model("tiny", {"num_chunks": 4}, [spec], Case(PROMPT))
    model = load_model("tiny", num_chunks=4, device="cuda")
    model.generate(PROMPT, 0, spec)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model.generate(PROMPT, 0, spec)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    assert measured == pytest.approx(plan.variants[0].peak.total, rel=0.10)
