"""The quantizer registry: ``none``, ``rtn`` and ``quarot`` (rotation + RTN), and quantize_kv."""

from __future__ import annotations

from collections.abc import Callable

import torch

from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.rtn import RTN_BITS, check_group_size, pack_codes, quantize_groups
from jbkv_cli.quant.tensor import QuantizedTensor

ALLOWED_BITS = (*RTN_BITS, 16)


def check_tensor(x: torch.Tensor, name: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is a finite floating tensor with at least 2 dims."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating-point tensor, got {kind}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [..., L, D], got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf values")


def _store(x: torch.Tensor, bits: int, group_size: int, rotation: RandomHadamard | None):
    source = x if rotation is None else rotation.rotate(x.float())
    if bits == 16:
        return QuantizedTensor(source.to(x.dtype), x.shape, x.dtype, rotation=rotation)
    codes, step, zero = quantize_groups(source, bits, group_size)
    packed = pack_codes(codes, bits)
    return QuantizedTensor(packed, x.shape, x.dtype, bits, group_size, step, zero, rotation)


def quantize_none(x: torch.Tensor, bits: int, group_size: int, **_: object) -> QuantizedTensor:
    """The identity: ``x`` stored as-is (the 16-bit reference goes through the same path)."""
    return QuantizedTensor(x, x.shape, x.dtype)


def quantize_rtn(x: torch.Tensor, bits: int, group_size: int, **_: object) -> QuantizedTensor:
    """Group-wise per-token asymmetric RTN (see :mod:`jbkv_cli.quant.rtn`)."""
    return _store(x, bits, group_size, None)


def quantize_quarot(
    x: torch.Tensor,
    bits: int,
    group_size: int,
    *,
    seed: int = 0,
    block_size: int | None = None,
    **_: object,
) -> QuantizedTensor:
    """Seeded randomized Hadamard rotation ``R``, then RTN on ``R x``."""
    return _store(x, bits, group_size, RandomHadamard(x.shape[-1], block_size, seed))


QUANTIZERS: dict[str, Callable[..., QuantizedTensor]] = {
    "none": quantize_none,
    "rtn": quantize_rtn,
    "quarot": quantize_quarot,
}


def quantize_kv(
    x: torch.Tensor,
    bits: int = 2,
    group_size: int = 32,
    scheme: str = "rtn",
    *,
    seed: int = 0,
    block_size: int | None = None,
) -> QuantizedTensor:
    """Quantize keys or values ``x [..., L, D]`` (per token, per group of ``group_size`` channels).

    ``scheme="none"`` (or ``bits=16`` with ``rtn``) stores ``x`` unchanged; ``quarot`` rotates with
    a randomized Hadamard (``seed``, ``block_size``, default the head dim) before RTN. The result's
    ``step`` is the stored Δ the Jensen-bias correction must use.
    """
    if scheme not in QUANTIZERS:
        raise ValueError(f"scheme must be one of {tuple(QUANTIZERS)}, got {scheme!r}")
    if bits not in ALLOWED_BITS:
        raise ValueError(f"bits must be one of {ALLOWED_BITS}, got {bits}")
    check_tensor(x)
    check_group_size(x.shape[-1], group_size)
    if scheme == "rtn" and bits == 16:
        scheme = "none"
    return QUANTIZERS[scheme](x, bits, group_size, seed=seed, block_size=block_size)
