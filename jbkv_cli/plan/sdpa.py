"""Which SDPA kernel a GPU runs, and the tensors it allocates, for the plan's fake device.

On a CPU-only machine torch decomposes ``F.scaled_dot_product_attention`` of fake CUDA tensors
into its math kernel, which materializes every score in float32; a GPU of compute capability 8.0
or newer runs a fused kernel instead whenever one takes the call, and allocates only the output
(and FlashAttention's log-sum-exp). :func:`planned_sdpa` stands in for SDPA inside the plan and
takes the kernel torch's rules would take (``aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp``, torch ≥ 2.5, sm80+, dense tensors; priority flash, memory-efficient, math —
cuDNN, preferred on sm90/sm100 with cuDNN ≥ 9.15, takes the calls the first two take and
allocates as the memory-efficient kernel does):

- **flash**: ``q``, ``k``, ``v`` FP16/BF16 of one head dim ≤ 256, no ``attn_mask`` (GQA yes);
  a head dim that is not a multiple of 8 is copied padded first. Allocates the output and the
  float32 log-sum-exp ``[B, Hq, Lq]``;
- **memory-efficient**: FP16/BF16/FP32, ``q`` and ``k`` of one head dim, ``q``'s and ``v``'s a
  multiple of 8 (16-bit) or 4 (FP32), a mask allowed (GQA yes). Allocates the output; a boolean
  mask is converted to a float one first, and a mask whose last dim is not a multiple of 16 is
  copied padded;
- **math**: everything else: the float32 scores and probabilities of every query and key
  (torch's own decomposition runs).

The rule is :func:`sdpa_kernel`; ``jbkv plan`` states it in ``docs/plan.md`` and ``make
gpu-check`` compares the plan with the GPU's measured peak.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256
MASK_ALIGNMENT = 16  # memory-efficient attention's mask rows are padded to this

_ORIGINAL = F.scaled_dot_product_attention


def sdpa_kernel(
    dtype: torch.dtype, q_dim: int, k_dim: int, v_dim: int, masked: bool, device: str = "cuda"
) -> str:
    """``flash``, ``efficient`` or ``math``: the SDPA kernel a CUDA GPU (sm80+) takes for a call
    of these dtypes, head dims and mask (module docstring); ``math`` off CUDA."""
    if device != "cuda":
        return "math"
    if not masked and dtype in HALF and q_dim == k_dim == v_dim <= FLASH_MAX_HEAD_DIM:
        return "flash"
    alignment = 8 if dtype in HALF else 4
    aligned = q_dim % alignment == 0 and v_dim % alignment == 0
    if dtype in (*HALF, torch.float32) and q_dim == k_dim and aligned:
        return "efficient"
    return "math"


def planned_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as a GPU runs it (the kernel of :func:`sdpa_kernel`,
    called directly so the fake device allocates what that kernel allocates)."""
    kernel = sdpa_kernel(
        query.dtype,
        query.shape[-1],
        key.shape[-1],
        value.shape[-1],
        attn_mask is not None,
        query.device.type,
    )
    if kernel == "math" or query.dim() != 4:
        return _ORIGINAL(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    aten = torch.ops.aten
    if kernel == "flash":
        dim = query.shape[-1]
        q, k, v = (_pad8(t) for t in (query, key, value))
        out = aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale
        )[0]
        return out[..., :dim] if out.shape[-1] != dim else out
    mask = attn_mask
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device)
        pad = -mask.shape[-1] % MASK_ALIGNMENT
        if pad:
            mask = F.pad(mask, (0, pad))[..., : attn_mask.shape[-1]]
        mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return aten._scaled_dot_product_efficient_attention(
        query, key, value, mask, False, dropout_p, is_causal, scale=scale
    )[0]


def _pad8(t: torch.Tensor) -> torch.Tensor:
    pad = -t.shape[-1] % 8
    return F.pad(t, (0, pad)) if pad else t


@contextlib.contextmanager
def gpu_kernels(
    around: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> Iterator[None]:
    """Inside the block SDPA is :func:`planned_sdpa`: ``torch.nn.functional``'s and every
    ``jbkv_cli`` module's own reference to it (``from torch.nn.functional import …``); each
    call runs inside ``around()`` when given (the plan's ``attention`` label)."""
    if around is None:
        replacement = planned_sdpa
    else:

        def replacement(*args, **kwargs):
            with around():
                return planned_sdpa(*args, **kwargs)

    original = _ORIGINAL
    holders = [F] + [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("jbkv_cli") and name != __name__ and module is not None
    ]
    patched = []
    for holder in holders:
        for attr, value in list(vars(holder).items()):
            if value is original:
                setattr(holder, attr, replacement)
                patched.append((holder, attr))
    try:
        yield
    finally:
        for holder, attr in patched:
            setattr(holder, attr, original)
