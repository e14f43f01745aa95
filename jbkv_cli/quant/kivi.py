"""After KIVI (Liu et al., arXiv 2402.02750; code jy-yuan/KIVI @876b4d2d): keys per channel,
values per token, the newest tokens in full precision.

With ``B`` bits, ``L = 2^B − 1`` levels and ``g = group_size`` (the paper's ``G``: tokens per key
group *and* channels per value group)::

    keys    per channel c and group t of g consecutive tokens:
            z_tc = min_{i∈t} k_ic,  Δ_tc = (max_{i∈t} k_ic − z_tc) / L
    values  per token i and group j of g consecutive channels:
            z_ij = min_{c∈j} v_ic,  Δ_ij = (max_{c∈j} v_ic − z_ij) / L
    code    c = clamp(round((x − z) / Δ), 0, L),   x̂ = c · Δ + z

Scale and minimum are stored in FP16 (KIVI keeps them in the model's fp16), so both sides store
``B + 32/g`` bits per element (3.0 at INT2 g32, 5.0 at INT4 g32), measured from the stored
tensors. The newest ``residual`` tokens (``R``, default 128) of keys and values are kept in
full precision by :class:`~jbkv_cli.kvcache.cache.ChunkKVCache`, which quantizes each piece of
tokens once as it falls out of the residual.

The key noise is ``ε_ic ~ U[−Δ_t(i)c/2, Δ_t(i)c/2]`` with a step per *channel*, so the stored
key ``step`` is ``[..., L, D]`` (``G = D``) and the Jensen bias is
``b_i = (τ²/24) Σ_c Δ_t(i)c² q_c²`` (taylor) or ``Σ_c log sinhc(τ q_c Δ_t(i)c / 2)`` (exact).

Choices where the paper and code are silent or jbkv differs (hence "after KIVI"):

- **Covering FP16 grid.** ``z`` is rounded *down* and ``Δ`` *up* to FP16
  (:func:`~jbkv_cli.quant.groupwise.round_fp16`), so the grid covers ``[min, max]`` and
  ``|x − x̂| ≤ Δ/2`` holds for every element (the uniform noise model the correction assumes).
  KIVI computes both in fp16 arithmetic, where rounding to nearest can clip by a fraction of an
  fp16 ulp. Dequantization runs in float32, then casts to the input dtype (KIVI: fp16).
- **Residual.** Both sides keep exactly the newest ``R`` tokens exact and compress the tokens
  pushed out. KIVI does that for values (one token at a time while decoding) but keeps
  ``L mod R`` keys (0 … R−1) exact and flushes them in blocks of ``R``; jbkv keeps up to ``R``
  more exact keys than KIVI at the same ``R``. ``R`` must be a multiple of ``g`` (KIVI asserts
  it); ``R = 0`` compresses every committed chunk at once.
- **Key groups follow the pieces.** Token groups start at the first token of each piece the
  cache quantizes (a chunk, or the part of a chunk leaving the residual). A piece whose length
  is not a multiple of ``g`` ends with one shorter group with its own scale and minimum (KIVI
  never has one: its flushes are multiples of ``g``); its storage is then slightly above
  ``B + 32/g``, and the reports measure it.
- **Packing.** Codes are bit-packed into uint8 along the channels of each token (4 per byte at
  INT2, 2 at INT4); KIVI packs keys along tokens into int32. Same bytes per element.
- **1 bit.** KIVI's paper and kernels run 2 and 4 bits; jbkv also offers 1 bit (two levels per
  group, 2.0 bits per element at g32) because AsymKV (Tao et al., COLING 2025) quantizes the
  KV cache of its 1-bit layers with KIVI's quantizer (per a third-party summary of the paper;
  its code is not public): ``--quantizers kivi --bits asymkv:LK/LV``
  (:mod:`jbkv_cli.run.bit_specs`).
- Not reproduced: the fused CUDA/Triton kernels (scores on packed keys); attention here
  dequantizes the cache.

Defaults ``g = 32``, ``R = 128`` follow the paper's experiments (the repository's CLI defaults
are ``group_size = 128``, ``residual_length = 128``; its ``example.py`` uses 32 and 32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.quant.groupwise import pack_codes, quantize_groups, unpack_codes
from jbkv_cli.quant.method import KVMethod, Role
from jbkv_cli.quant.rtn import store_groups
from jbkv_cli.quant.tensor import ADDITIVE, GroupQuantized, QuantizedTensor
from jbkv_cli.utils.fields import option

DEFAULT_RESIDUAL = 128
MAX_RESIDUAL = 2**20


@dataclass
class TokenGroupQuantized(QuantizedTensor):
    """Per-channel codes over groups of ``group_size`` tokens (KIVI's keys): packed uint8
    ``data [..., L, D·B/8]`` (each token's codes along its channels), FP16 ``scale`` and
    ``zero`` ``[..., ⌈L/g⌉, D]`` (the last group may hold fewer than ``g`` tokens)."""

    data: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    group_size: int
    scale: torch.Tensor
    zero: torch.Tensor

    noise_model: ClassVar[str] = ADDITIVE  # uniform rounding per channel: s = +Δ²/12

    def stored(self) -> dict[str, torch.Tensor]:
        return {"codes": self.data, "scale": self.scale, "zero": self.zero}

    def _per_token(self, t: torch.Tensor) -> torch.Tensor:
        """``[..., ⌈L/g⌉, D]`` -> ``[..., L, D]`` float32 (each token its group's row)."""
        return t.float().repeat_interleave(self.group_size, dim=-2)[..., : self.num_tokens, :]

    @property
    def step(self) -> torch.Tensor:
        """``Δ`` per token and channel, ``[..., L, D]`` (``G = D``)."""
        return self._per_token(self.scale)

    def dequantize(self) -> torch.Tensor:
        codes = unpack_codes(self.data, self.bits, self.shape[-1]).float()
        return (codes * self.step + self._per_token(self.zero)).to(self.dtype)


def store_token_groups(x: torch.Tensor, bits: int, group_size: int) -> TokenGroupQuantized:
    """KIVI keys: ``x [..., L, D]`` quantized per channel over groups of ``group_size`` tokens
    (covering FP16 grid), the codes bit-packed per token."""
    length = x.shape[-2]
    groups = -(-length // group_size)
    xt = x.float().transpose(-1, -2)  # [..., D, L]: token groups along the last dim
    pad = groups * group_size - length
    if pad:  # repeat the last token: a short group's min and max are unchanged
        xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
    codes, scale, zero = quantize_groups(xt, bits, group_size, scales="fp16")  # [.., D, ·]
    packed = pack_codes(codes[..., :length].transpose(-1, -2), bits)
    scale, zero = (t.transpose(-1, -2).contiguous() for t in (scale, zero))
    return TokenGroupQuantized(packed, x.shape, x.dtype, bits, group_size, scale, zero)


@dataclass(frozen=True)
class KIVI(KVMethod):
    """``group_size``: tokens per key group and channels per value group (the paper's ``G``);
    ``residual``: newest tokens kept in full precision (the paper's ``R``, a multiple of
    ``group_size``)."""

    name: ClassVar[str] = "kivi"
    summary: ClassVar[str] = (
        "after KIVI: keys per channel over token groups, values per token, FP16 scale and "
        "minimum, newest R tokens exact"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (1, 2, 4)  # 1: as AsymKV runs KIVI's quantizer
    noise_model: ClassVar[str] = ADDITIVE

    residual: int = option(DEFAULT_RESIDUAL, "int", lo=0, hi=MAX_RESIDUAL)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.residual % self.group_size:
            raise ValueError(
                f"kivi residual must be a non-negative multiple of group_size "
                f"{self.group_size}, got {self.residual}"
            )

    def step_groups(self, head_dim: int, role: Role = "key") -> int:
        return head_dim if role == "key" else head_dim // self.group_size

    def residual_tokens(self, role: Role = "key") -> int:
        return self.residual

    def _quantize(self, x: torch.Tensor, role: Role) -> TokenGroupQuantized | GroupQuantized:
        if role == "key":
            return store_token_groups(x, self.bits, self.group_size)
        return store_groups(x, self.bits, self.group_size, scales="fp16")

    def extra_id(self) -> list[str]:
        return [] if self.residual == DEFAULT_RESIDUAL else [f"r{self.residual}"]
