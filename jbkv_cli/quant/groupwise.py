"""Group-wise per-token asymmetric round-to-nearest: the primitives behind RTN and QuaRot.

For token ``i`` and channel group ``j`` (``g`` channels), with ``B`` bits, the *covering* grid
(the default)::

    z_ij = round_down_bf16(min_c x_c)                  zero point, stored as BF16
    Δ_ij = round_up_fp8((max_c x_c − z_ij) / (2^B − 1))  step, stored as FP8 E4M3
    c    = clamp(round((x − z_ij) / Δ_ij), 0, 2^B − 1)  code, bit-packed into uint8
    x̂    = c · Δ_ij + z_ij

Rounding ``z`` down and ``Δ`` up (instead of to nearest) keeps the stored grid covering the
group's range ``[min, max]``, so no value is clamped and ``|x − x̂| ≤ Δ/2`` holds for every
element. The price: the grid overshoots the range, so a group's largest value is rounded
outward (up) more often than not, a small positive mean error along each key.

The *nearest* grid rounds ``z`` to the nearest BF16 and ``Δ`` to the nearest FP8 and clamps the
codes: no systematic overshoot, but values beyond the stored grid are clipped (error above Δ/2).

FP8 E4M3 facts that shape this module: 3 mantissa bits (a step rounded up is at most 12.5% too
large), largest finite value 448, subnormal spacing 2⁻⁹. A range so small that its step would be
below 2⁻⁹ is stored with the step 2⁻⁹: still covering, just using fewer codes (a precision floor,
not an error); a group with ``max = min`` stores ``Δ = 0`` and dequantizes to ``z`` exactly (so
any constant representable in BF16 round-trips bit for bit). A step above 448 (a group range over
``448 · (2^B − 1)``) cannot be stored and raises ``ValueError``.

At 1 bit the grid has two levels, ``z`` and ``z + Δ`` with ``Δ`` the group's whole range (both
grids): each value is moved to the nearer end, ``|x − x̂| ≤ Δ/2`` still, but the error is set by
the value (not spread over ``±Δ/2``; :mod:`jbkv_cli.run.bit_specs`, "1 bit").

Packing: INT2 puts 4 codes in a byte, INT4 2, INT8 1, INT1 8 (little-end first). INT3 packs 8 codes into 3 bytes (24 bits, exactly 3 bits per code), so it needs the
channel count to be a multiple of 8. Storage per element is therefore ``B + (8 + 16)/g`` bits.

FP16 scales (``scales="fp16"``, KIVI's format): the same covering grid with ``z`` rounded down
and ``Δ`` up to FP16 (10 mantissa bits: a step at most 2⁻¹⁰ too large; subnormal floor 2⁻²⁴),
``B + 32/g`` bits per element; a value or step beyond ±65504 raises ``ValueError``.
"""

from __future__ import annotations

import torch

from jbkv_cli.utils.host_reads import require

STEP_DTYPE = torch.float8_e4m3fn
ZERO_DTYPE = torch.bfloat16
FP8_MAX = 448.0
FP8_MIN_STEP = 2.0**-9
FP16_MAX = 65504.0
RTN_BITS = (1, 2, 3, 4, 8)  # 1: two levels, z and z + Δ (Δ the group's range)


GRIDS = ("covering", "nearest")
SCALES = ("fp8", "fp16")  # FP8 step + BF16 zero (RTN), or FP16 step + FP16 zero (KIVI)


def check_group_size(dim: int, group_size: int) -> None:
    """Raise ``ValueError`` unless ``group_size`` divides ``dim``."""
    if group_size < 1 or dim % group_size:
        divisors = [g for g in (8, 16, 32, 64, 128, 256) if g <= dim and dim % g == 0]
        raise ValueError(
            f"group size {group_size} does not divide the head dim {dim} (allowed: "
            f"{', '.join(map(str, divisors))})"
        )


def round_down_bf16(x: torch.Tensor) -> torch.Tensor:
    """The largest BF16 value ``≤ x`` (elementwise), returned as BF16."""
    bits = x.float().contiguous().view(torch.int32)
    truncated = bits & -65536  # clear the 16 low mantissa bits: rounds toward zero
    away = (bits < 0) & ((bits & 0xFFFF) != 0)  # negatives rounded toward zero went up: step down
    return torch.where(away, truncated + 0x10000, truncated).view(torch.float32).to(ZERO_DTYPE)


def _check_fp8(step: torch.Tensor) -> None:
    """``ValueError`` (:func:`~jbkv_cli.utils.host_reads.require`) when a step exceeds FP8."""
    worst = step.max() if step.numel() else step.new_zeros(())
    require(
        worst <= FP8_MAX,
        "a group's step {value:.4g} exceeds the FP8 E4M3 maximum "
        f"{FP8_MAX}: its range is too large to quantize with FP8 scales",
        worst,
    )


def round_up_fp8(step: torch.Tensor) -> torch.Tensor:
    """The smallest FP8 E4M3 value ``≥ step`` for ``0 ≤ step ≤ 448``, as FP8; 0 stays 0."""
    _check_fp8(step)
    nearest = step.to(STEP_DTYPE)
    short = nearest.float() < step
    bumped = (nearest.view(torch.uint8) + short.to(torch.uint8)).view(STEP_DTYPE)
    return bumped


def round_nearest_fp8(step: torch.Tensor) -> torch.Tensor:
    """The nearest FP8 E4M3 value to ``step`` (``0 ≤ step ≤ 448``); a positive step that would
    round to 0 keeps the smallest subnormal 2⁻⁹, so the group keeps a usable grid."""
    _check_fp8(step)
    nearest = step.to(STEP_DTYPE)
    return torch.where((nearest.float() == 0) & (step > 0), FP8_MIN_STEP, nearest.float()).to(
        STEP_DTYPE
    )


def round_fp16(x: torch.Tensor, up: bool) -> torch.Tensor:
    """The nearest FP16 value ``≥ x`` (``up``) or ``≤ x`` (down), elementwise, as FP16."""
    x = x.float()
    near = x.to(torch.float16)
    miss = near.float() < x if up else near.float() > x
    toward = torch.full_like(near, float("inf") if up else float("-inf"))
    out = torch.where(miss, torch.nextafter(near, toward), near)
    require(
        torch.isfinite(out).all(),
        f"a group's minimum or step exceeds the FP16 range (±{FP16_MAX:g})",
    )
    return out


def quantize_groups(
    x: torch.Tensor, bits: int, group_size: int, grid: str = "covering", scales: str = "fp8"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., D]`` per group of ``group_size`` channels of the last dim.

    Returns ``(codes, step, zero)``: codes uint8 ``[..., D]`` (unpacked, in ``[0, 2^B − 1]``),
    step and zero ``[..., D/g]`` (FP8 E4M3 and BF16, or both FP16 with ``scales="fp16"``);
    ``grid`` is ``covering`` or ``nearest`` (FP8 scales only; see the module docstring).
    """
    if bits not in RTN_BITS:
        raise ValueError(f"bits must be one of {RTN_BITS}, got {bits}")
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    if scales not in SCALES or (scales == "fp16" and grid != "covering"):
        raise ValueError(f"scales must be one of {SCALES} (fp16: covering grid), got {scales!r}")
    dim = x.shape[-1]
    check_group_size(dim, group_size)
    levels = (1 << bits) - 1
    groups = x.float().unflatten(-1, (dim // group_size, group_size))  # [..., G, g]
    lo, hi = torch.aminmax(groups, dim=-1)
    if scales == "fp16":
        zero = round_fp16(lo, up=False)  # [..., G]
        step = round_fp16((hi - zero.float()) / levels, up=True)
    elif grid == "covering":
        zero = round_down_bf16(lo)  # [..., G]
        step = round_up_fp8((hi - zero.float()) / levels)
    else:
        zero = lo.to(ZERO_DTYPE)
        step = round_nearest_fp8((hi - lo) / levels)
    z = zero.float()
    d = step.float()
    inv = torch.where(d > 0, d, 1.0).reciprocal_()
    scaled = (groups - z.unsqueeze(-1)).mul_(inv.unsqueeze(-1))
    codes = scaled.round_().clamp_(0, levels).to(torch.uint8)
    return codes.flatten(-2), step, zero


def dequantize_groups(
    codes: torch.Tensor,
    step: torch.Tensor,
    zero: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``x̂ = c · Δ + z`` per group; codes ``[..., D]``, step/zero ``[..., G]`` -> ``[..., D]``."""
    groups = codes.unflatten(-1, (step.shape[-1], -1)).float()
    x = groups * step.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return x.flatten(-2).to(dtype)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes ``[..., n]`` into ``[..., n·bits/8]`` bytes (see module docstring)."""
    n = codes.shape[-1]
    if bits == 8:
        return codes.contiguous()
    if bits == 3:
        if n % 8:
            raise ValueError(f"INT3 packing needs the channel count to be a multiple of 8, got {n}")
        blocks = codes.unflatten(-1, (n // 8, 8)).to(torch.int32)
        shifts = torch.arange(0, 24, 3, device=codes.device, dtype=torch.int32)
        word = (blocks << shifts).sum(-1, dtype=torch.int32)  # [..., n/8], 24 bits used
        out = torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], dim=-1)
        return out.to(torch.uint8).flatten(-2)
    if bits not in (1, 2, 4):  # 1: 1-bit codes and sign bits (TurboQuant's QJL sketch)
        raise ValueError(f"bits must be one of {RTN_BITS}, got {bits}")
    per_byte = 8 // bits
    if n % per_byte:
        raise ValueError(f"INT{bits} packing needs a multiple of {per_byte} codes, got {n}")
    blocks = codes.unflatten(-1, (n // per_byte, per_byte))
    shifts = torch.arange(0, 8, bits, device=codes.device, dtype=torch.uint8)
    return (blocks << shifts).sum(-1, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: bytes ``[..., n·bits/8]`` -> uint8 codes ``[..., n]``."""
    if bits == 8:
        return packed
    if bits == 3:
        b = packed.unflatten(-1, (n // 8, 3)).to(torch.int32)
        word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        shifts = torch.arange(0, 24, 3, device=packed.device, dtype=torch.int32)
        return ((word.unsqueeze(-1) >> shifts) & 7).to(torch.uint8).flatten(-2)
    mask = (1 << bits) - 1
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & mask).flatten(-2)
