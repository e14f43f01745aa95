"""What the cache stores for one chunk's keys or values, and how to read it back.

Every compression method returns a :class:`QuantizedTensor`: the tensors it actually holds
(``stored``, whose bytes are the storage the reports show), ``dequantize()`` (the values attention
reads) and ``step``, the noise model the Jensen-bias correction needs:

    step  [..., L, G]   per token i and channel group j, the step Δ_ij of uniform rounding noise
                        ε_ic ~ U[−Δ/2, Δ/2] on every channel c of group j (``G`` groups of
                        ``D/G`` channels), in the basis ``rotation`` (None: the original basis)

so the bias is ``b_i = (τ²/24) Σ_j Δ_ij² ‖(R q)_j‖²`` for every method alike. Next to ``step``
each tensor declares its ``noise_model`` (:mod:`jbkv_cli.quant.noise`: additive, centroid or
mixed; undeclared: ``additive (assumed)``) and from it what the ``signed`` correction reads:
``excess_step2`` (``12 ×`` the excess variance ``Var(k̂) − Var(k)`` per channel: the squared
step of uniform noise with that variance, ``Δ²`` for additive noise, so the signed correction is
then taylor exactly, ``−Δ²`` for centroid noise), and what its ``signed-unshrink`` ablation
reads: ``unshrink`` (``1/a`` for a stored key that is ``a·k`` plus noise; None: 1) and
``noise_step2`` (``12 ×`` the variance of that noise after unshrinking). A method whose
groups run along tokens (KIVI's per-channel keys) reports ``G = D``; a residual quantizer (QVG)
reports its residual's steps (its centroids are stored exactly); tokens kept in full precision
report 0. Subclasses: :class:`RawTensor` (full precision), :class:`GroupQuantized` (group-wise
codes + steps + zeros, RTN and QuaRot), :class:`Segmented` (parts along tokens, e.g. a quantized
head and a full-precision tail), and the methods' own (``kivi.py``, ``qvg.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.quant.groupwise import dequantize_groups, unpack_codes
from jbkv_cli.quant.rotation import RandomHadamard

# How the stored key k̂ relates to the true k (see jbkv_cli.quant.noise, which re-exports these).
ADDITIVE = "additive"  # k̂ = k + e, e independent of k
CENTROID = "centroid"  # k = k̂ + e, e uncorrelated with k̂
MIXED = "mixed"  # both: measured at commit
ASSUMED = "additive (assumed)"  # not declared: today's additive model


class QuantizedTensor:
    """Base of stored chunk tensors ``[..., L, D]``; see the module docstring."""

    shape: torch.Size
    dtype: torch.dtype
    rotation: RandomHadamard | None = None
    noise_model: str = ASSUMED

    def stored(self) -> dict[str, torch.Tensor]:
        """The tensors held in memory, by name (what ``nbytes`` counts)."""
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """``x̂`` in the original basis and dtype, ``[..., L, D]``."""
        raise NotImplementedError

    @property
    def step(self) -> torch.Tensor | None:
        """The uniform-noise steps ``[..., L, G]`` (float32), or None for exact storage."""
        return None

    @property
    def unshrink(self) -> torch.Tensor | None:
        """``u_i = 1/a_i`` ``[..., L, 1]`` (float32) for a stored key ``k̂ = a k + n`` that shrinks
        the true one (centroid type); None means 1 (additive and mixed noise)."""
        return None

    @property
    def noise_step2(self) -> torch.Tensor | None:
        """``w_ij = 12 v_ij`` per token and group ``[..., L, G]`` (float32, basis of ``step``),
        ``v`` the variance per channel of ``u k̂ − k``, from the declared ``noise_model``:
        ``Δ²`` for additive noise. None for exact storage and for mixed noise that was not
        measured (:func:`~jbkv_cli.quant.noise.measure_noise`); a centroid-type tensor
        overrides it."""
        step = self.step
        if step is None or self.noise_model == MIXED:
            return None
        if self.noise_model not in (ADDITIVE, ASSUMED):
            raise NotImplementedError(f"{type(self).__name__} must give its {self.noise_model} w")
        return step.float().square()

    @property
    def excess_step2(self) -> torch.Tensor | None:
        """``12 s_ij`` per token and group ``[..., L, G]`` (float32, basis of ``step``), ``s``
        the excess variance ``Var(k̂) − Var(k)`` per channel from the declared ``noise_model``:
        ``noise_step2`` for additive noise (``Δ²``: it does not shrink, ``s = v``), ``−Δ²`` for
        centroid noise (``Δ²/12`` the variance of a centroid's cell). None for exact storage and
        for mixed noise that was not measured."""
        step = self.step
        if step is None or self.noise_model == MIXED:
            return None
        if self.noise_model == CENTROID:
            return -step.float().square()
        return self.noise_step2

    @property
    def quantized(self) -> bool:
        return self.step is not None

    @property
    def steps_fp8(self) -> bool:
        """Whether every ``step`` is an FP8 E4M3 value by how it is stored (a dtype, read
        without reading the steps; the exact bias then tabulates them). False: not known."""
        return False

    @property
    def nbytes(self) -> int:
        """Bytes actually held by the stored tensors."""
        return sum(t.numel() * t.element_size() for t in self.stored().values())

    @property
    def effective_bits(self) -> float:
        """Stored bits per element: ``nbytes · 8 / numel``."""
        return self.nbytes * 8 / self.shape.numel()

    @property
    def num_tokens(self) -> int:
        return self.shape[-2]


def compact(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when it uses its whole storage, else a contiguous copy of its elements.

    A view keeps its whole storage alive: a model's V sliced from its fused QKV projection holds
    the Q and K beside it, a block sliced from a window's keys the whole window. What a cache
    keeps exact is kept compact, so the device holds exactly the bytes it counts (``nbytes``).
    """
    if x.untyped_storage().nbytes() == x.numel() * x.element_size():
        return x
    return x.clone(memory_format=torch.contiguous_format)


@dataclass
class RawTensor(QuantizedTensor):
    """Stored as is (the 16-bit reference, sinks, full-precision tails, ablations), in a storage
    of its own (:func:`compact`)."""

    data: torch.Tensor

    def __post_init__(self) -> None:
        self.data = compact(self.data)
        self.shape, self.dtype, self.rotation = self.data.shape, self.data.dtype, None

    def stored(self) -> dict[str, torch.Tensor]:
        return {"data": self.data}

    def dequantize(self) -> torch.Tensor:
        return self.data


@dataclass
class GroupQuantized(QuantizedTensor):
    """Group-wise per-token codes: packed uint8 ``data [..., L, D·B/8]``, FP8 ``step_fp8`` and
    BF16 ``zero`` ``[..., L, D/g]`` (KIVI's values: both FP16). With ``rotation`` the codes are
    those of ``R x`` and :meth:`dequantize` rotates back."""

    data: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    group_size: int
    step_fp8: torch.Tensor
    zero: torch.Tensor
    rotation: RandomHadamard | None = None
    noise_model: ClassVar[str] = ADDITIVE  # rounding on a fine uniform grid: s = +Δ²/12

    def stored(self) -> dict[str, torch.Tensor]:
        return {"codes": self.data, "step": self.step_fp8, "zero": self.zero}

    @property
    def step(self) -> torch.Tensor:
        return self.step_fp8.float()

    @property
    def steps_fp8(self) -> bool:
        return self.step_fp8.dtype == torch.float8_e4m3fn  # FP16 for KIVI's values

    def dequantize(self) -> torch.Tensor:
        codes = unpack_codes(self.data, self.bits, self.shape[-1])
        x = dequantize_groups(codes, self.step_fp8, self.zero, torch.float32)
        if self.rotation is not None:
            x = self.rotation.unrotate(x)
        return x.to(self.dtype)


@dataclass
class Segmented(QuantizedTensor):
    """Consecutive token ranges stored differently (e.g. KIVI: a quantized head and the newest
    tokens in full precision until the next commit). ``groups``: step columns of the quantized
    parts (full-precision parts get zero steps)."""

    parts: list[QuantizedTensor]
    groups: int

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("Segmented needs at least one part")
        first = self.parts[0]
        tokens = sum(p.num_tokens for p in self.parts)
        self.shape = torch.Size((*first.shape[:-2], tokens, first.shape[-1]))
        self.dtype = first.dtype
        rotations = {id(p.rotation): p.rotation for p in self.parts if p.quantized}
        if len(rotations) > 1:
            raise ValueError("segments quantized in different bases cannot be combined")
        self.rotation = next(iter(rotations.values()), None)

    def stored(self) -> dict[str, torch.Tensor]:
        return {f"{i}.{k}": t for i, p in enumerate(self.parts) for k, t in p.stored().items()}

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize().to(self.dtype) for p in self.parts], dim=-2)

    @property
    def step(self) -> torch.Tensor | None:
        if not any(p.quantized for p in self.parts):
            return None
        return torch.cat([zero_steps(p, self.groups) for p in self.parts], dim=-2)

    @property
    def noise_model(self) -> str:  # type: ignore[override]
        return next((p.noise_model for p in self.parts if p.quantized), ASSUMED)

    @property
    def steps_fp8(self) -> bool:
        return all(p.steps_fp8 for p in self.parts if p.quantized)  # exact parts: 0

    @property
    def noise_step2(self) -> torch.Tensor | None:
        if not any(p.quantized for p in self.parts):
            return None
        parts = [zero_noise_step2(p, self.groups) for p in self.parts]
        return None if any(p is None for p in parts) else torch.cat(parts, dim=-2)

    @property
    def excess_step2(self) -> torch.Tensor | None:
        if not any(p.quantized for p in self.parts):
            return None
        parts = [zero_noise_step2(p, self.groups, unshrink=False) for p in self.parts]
        return None if any(p is None for p in parts) else torch.cat(parts, dim=-2)

    @property
    def unshrink(self) -> torch.Tensor | None:
        if all(p.unshrink is None for p in self.parts):
            return None
        return torch.cat([unit_unshrink(p) for p in self.parts], dim=-2)


def zero_noise_step2(t: QuantizedTensor, groups: int, unshrink: bool = True) -> torch.Tensor | None:
    """``t.noise_step2`` (``unshrink``) or ``t.excess_step2``, zeros for exactly stored tokens,
    None where a quantized ``t`` cannot say (mixed noise not measured)."""
    if not t.quantized:
        return zero_steps(t, groups)
    return t.noise_step2 if unshrink else t.excess_step2


EXCESS, UNSHRINK, DECLARED = "excess", "unshrink", "declared"  # the signed rules
SIGNED_RULES = (DECLARED, EXCESS, UNSHRINK)
# the rule the default ``signed`` reads per declared noise model: the one that left the smaller
# attention-output error where the two differ (docs/corrections.md, benchmarks/signed_rules.py);
# on additive noise the two are one computation (u = 1, w = Δ²)
DECLARED_RULE = {ADDITIVE: EXCESS, ASSUMED: EXCESS, CENTROID: UNSHRINK, MIXED: EXCESS}


def resolve_rule(t: QuantizedTensor, rule: str) -> str:
    """``excess`` or ``unshrink``: ``rule`` itself, or for ``declared`` the rule
    :data:`DECLARED_RULE` gives ``t``'s noise model."""
    if rule not in SIGNED_RULES:
        raise ValueError(f"rule must be one of {SIGNED_RULES}, got {rule!r}")
    if rule != DECLARED:
        return rule
    return DECLARED_RULE.get(t.noise_model.split(" (")[0], EXCESS)


def signed_terms(
    t: QuantizedTensor, groups: int, rule: str = DECLARED
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What a signed rule reads of ``t``: ``(w [..., L, G], u [..., L, 1] or None)``. The
    unshrink rule: ``(noise_step2, unshrink)``; the excess rule: ``(excess_step2, None)``;
    ``declared``: the rule of ``t``'s noise model (:func:`resolve_rule`). Zeros for exactly
    stored tokens; ``w`` is None where a quantized ``t`` cannot say (mixed noise not measured
    under that rule)."""
    unshrink = resolve_rule(t, rule) == UNSHRINK
    w = zero_noise_step2(t, groups, unshrink)
    return w, t.unshrink if unshrink else None


def unit_unshrink(t: QuantizedTensor) -> torch.Tensor:
    """``t.unshrink``, or ones ``[..., L, 1]`` where a tensor does not shrink."""
    u = t.unshrink
    if u is not None:
        return u
    device = next(iter(t.stored().values())).device
    return torch.ones((*t.shape[:-1], 1), dtype=torch.float32, device=device)


def zero_steps(t: QuantizedTensor, groups: int) -> torch.Tensor:
    """``t.step``, or zeros ``[..., L, groups]`` for exactly stored tokens."""
    step = t.step
    if step is not None:
        return step
    device = next(iter(t.stored().values())).device
    return torch.zeros((*t.shape[:-1], groups), dtype=torch.float32, device=device)
