"""Which backend corrected attention takes when none is named, per device.

The bilinear corrections (taylor, signed) run as :func:`~jbkv_cli.attention.attend.attend`'s
``fused`` backend (``G`` extra channels through SDPA, zero-padded to a multiple of 8:
:func:`~jbkv_cli.attention.correction.fused_width`) or its ``flex`` backend (FlexAttention with
a ``score_mod``). :func:`choose_backend` is the rule when a caller names neither (no
``backend=`` argument, no :func:`~jbkv_cli.attention.attend.attention_backend` block, no
``attention_backend`` model option):

- **not CUDA** (CPU): ``fused``. SDPA's CPU flash kernel takes any head dim (``q``, ``k`` and
  ``v`` of one width), and eager FlexAttention materializes every score on a CPU.
- **CUDA**: ``fused`` when SDPA has a fused kernel for the padded tensors (FlashAttention,
  memory-efficient or cuDNN; :func:`fused_kernel_fits`); otherwise ``flex``, compiled
  (:func:`flex_kernel`), when Triton is installed for ``torch.compile``; otherwise ``fused``
  (SDPA's math kernel, which materializes every score). Where both run fused kernels, the padded
  SDPA form is kept: FlashAttention-class kernels are the fastest SDPA has, and a compiled
  ``score_mod`` adds ``G`` gathers per score (``G = D`` for per-channel steps).

What the SDPA kernels accept (torch's ``sdp_utils.cpp``, sm80 and newer): FlashAttention takes
``q``, ``k`` and ``v`` of one head dim ≤ 256, FP16/BF16, no ``attn_mask`` (GQA yes), and copies
all three to a multiple of 8 when the head dim is not one; the memory-efficient kernel takes an
``attn_mask`` (a pruner's ``−inf``/``ln m`` row) and FP32, with ``q``/``k`` of one head dim and the
``q`` and ``v`` head dims each a multiple of 8 in 16-bit (4 in FP32; ``v`` may be narrower than
``q``/``k``); cuDNN's needs multiples of 8 too. The fused form builds ``v'`` as wide as ``q'``/``k'``
so FlashAttention stays eligible. On a CUDA device the rule asks torch itself
(``torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention`` on small tensors of the call's
dtype, widths and heads: it also sees the GPU's architecture and kernels disabled at run time);
elsewhere (no CUDA device: tests of the rule) the constraints above stand in.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch

from jbkv_cli.attention.correction import fused_width

FLASH_MAX_HEAD_DIM = 256
HALF = (torch.float16, torch.bfloat16)


def fused_kernel_fits(dtype: torch.dtype, width: int, gqa: bool, masked: bool) -> bool:
    """Whether SDPA on CUDA (sm80+) has a fused kernel for ``q'``/``k'``/``v'`` of head dim
    ``width`` (the documented constraints, module docstring): FlashAttention without a mask,
    or the memory-efficient kernel (``gqa``: both take grouped heads, so it changes nothing
    here; torch's probe sees it)."""
    flash = not masked and dtype in HALF and width <= FLASH_MAX_HEAD_DIM
    alignment = 8 if dtype in HALF else 4
    efficient = dtype in (*HALF, torch.float32) and width % alignment == 0
    return flash or efficient


@functools.lru_cache(maxsize=64)
def probe_fused_kernel(
    device: str, dtype: torch.dtype, width: int, q_heads: int, kv_heads: int, masked: bool
) -> bool | None:
    """torch's own answer on a CUDA ``device`` (``can_use_*_attention`` on ``[1, H, 8, width]``
    tensors and, if ``masked``, a float mask); None where this torch cannot be asked. Asked once
    per configuration and process (a kernel disabled later is not seen)."""
    cuda = torch.backends.cuda
    names = ("can_use_flash_attention", "can_use_efficient_attention", "can_use_cudnn_attention")
    checks = [getattr(cuda, name) for name in names if hasattr(cuda, name)]
    if not hasattr(cuda, "SDPAParams") or not checks:
        return None
    q = torch.zeros((1, q_heads, 8, width), dtype=dtype, device=device)
    k = torch.zeros((1, kv_heads, 8, width), dtype=dtype, device=device)
    mask = torch.zeros((1, q_heads, 1, 8), dtype=dtype, device=device) if masked else None
    try:
        params = cuda.SDPAParams(q, k, k, mask, 0.0, False, q_heads != kv_heads)
    except TypeError:  # a torch whose SDPAParams predates enable_gqa
        return None
    return any(_answer(check, params) for check in checks)


def _answer(check: Callable[..., bool], params) -> bool:
    try:
        return bool(check(params, False))
    except RuntimeError:  # cuDNN's check initializes CUDA before it looks at the tensors
        return False


def flex_compiles(device_type: str) -> bool:
    """Whether ``torch.compile`` can build FlexAttention's kernel on ``device_type``: Triton
    installed, for CUDA."""
    return device_type == "cuda" and importlib.util.find_spec("triton") is not None


def choose_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    head_dim: int,
    groups: int,
    *,
    q_heads: int = 1,
    kv_heads: int = 1,
    masked: bool = False,
    fits: Callable[[torch.dtype, int, bool, bool], bool] | None = None,
    compiles: bool | None = None,
) -> str:
    """The backend of a bilinear-corrected call with no backend named (module docstring):
    ``fused`` or ``flex``. ``device``: where the call runs (``"cuda"`` without a GPU evaluates
    the CUDA rule); ``groups``: the correction's ``G``; ``masked``: the call carries a pruner's
    mask. ``fits`` (default: :func:`probe_fused_kernel` on a CUDA device, else
    :func:`fused_kernel_fits`) and ``compiles`` (default: :func:`flex_compiles`) stand in for
    what the machine offers."""
    device = torch.device(device)
    if device.type != "cuda":
        return "fused"
    width = fused_width(head_dim, groups)
    gqa = q_heads != kv_heads
    if fits is not None:
        fast = fits(dtype, width, gqa, masked)
    else:
        fast = None
        if torch.cuda.is_available():
            fast = probe_fused_kernel(str(device), dtype, width, q_heads, kv_heads, masked)
        if fast is None:
            fast = fused_kernel_fits(dtype, width, gqa, masked)
    if fast:
        return "fused"
    return "flex" if (flex_compiles(device.type) if compiles is None else compiles) else "fused"


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_kernel(device_type: str) -> Callable[..., torch.Tensor]:
    """FlexAttention for ``device_type``: compiled into one kernel on CUDA where Triton is
    installed (built on first use, once per process), eager elsewhere (on a CPU the reference
    implementation, which materializes the scores of each head)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if flex_compiles(device_type) else flex_attention
