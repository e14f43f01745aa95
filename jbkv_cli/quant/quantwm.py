"""After QuantWM: query-aware 2-bit keys (QSAC clustering + PSAC low-rank compensation).

QuantWM (training-free, strictly causal 2-bit KV quantization for video world models) observes
that key error does more damage than value error although it is smaller, because it moves the
logits ``q·k``, and answers with two techniques. Only its abstract was available to us; this is
jbkv's reading of it, every open choice written here.

**Queries.** Both parts use the :class:`~jbkv_cli.quant.queries.QueryStats` the cache keeps of
the queries it was attended with *before* the chunk is committed (the history up to and
including the chunk's own denoising; never a later query): per (batch row, KV head) the second
moment ``M``, the channel sensitivity ``s_c = E[q_c²]`` and the dominant subspace ``U_r``. With
no history yet (nothing attended), QSAC uses ``s_c = 1`` and PSAC stores nothing.

**QSAC** (quantization-sensitivity-aware clustering). Per chunk and (batch row, head), the
chunk's keys are clustered into ``K_eff = min(K, L // tokens_per_centroid)`` centroids (BF16,
uint8 ids; ``K ≤ 256``) and the residual ``x − c_a`` is stored with the RTN format (per-token
groups of ``g`` channels, asymmetric, FP8 step up, BF16 zero down: ``|r − r̂| ≤ Δ/2``). The
INT-``B`` error of a token's group ``j`` is set by the residual's range, ``Δ_j = range_j /
(2^B − 1)``, and its expected squared logit error is ``(1/12) Σ_j S_j Δ_j²`` with ``S_j =
Σ_{c ∈ j} s_c``. QSAC therefore assigns each token to the centroid minimising

    cost(i, a) = Σ_j S_j · range_j(x_i − c_a)²        (the "INT2-friendliness" of centroid a)

and updates each centroid to the mean of its tokens (Lloyd's update as the surrogate for the
range objective; an empty cluster keeps its centroid). Choices: centroids start from distinct
tokens drawn by a seeded generator (as ``qvg``); ``iters`` rounds of (assign, update); then a
final assignment against the *stored* BF16 centroids, so every token takes the stored centroid
of least cost; one stage.

**PSAC** (principal-subspace attention compensation). After the residual is quantized, the key
error ``e = x − x̂`` (float32) is projected on ``U_r`` (stored BF16, ``[r, D]`` per chunk and
(batch row, head)); the coefficients ``C = e U_r`` are stored as FP8 E4M3 ``[L, r]`` and added
back, ``x̂' = x̂ + C U_rᵀ``. For a query ``q ∈ span(U_r)`` the logit error ``q·(x − x̂')`` is then
zero up to the FP8 rounding of ``C`` (3 mantissa bits) and the BF16 rounding of ``U_r``;
``tests/quant/test_quantwm.py`` measures how much of it remains. Choices: ``r = rank`` (default
2) fixed, not adapted per head; the subspace of the raw second moment (not centred).

**Values** are stored with RTN (per-token groups): QuantWM's techniques are about keys.

**Correction.** The residual's noise has steps ``Δ_ij``; PSAC removes its part along ``U_r``, so
a query ``q`` sees the noise of ``P q`` with ``P = I − U_r U_rᵀ``, and the bias is
``(τ²/24) Σ_j Δ_ij² ‖(P q)_j‖²``. The correction's kernel reads ``‖q_j‖²``, one projection for
every chunk, so PSAC reports steps calibrated on the query history instead:
``step_ij = Δ_ij · √ρ_j`` with ``ρ_j = E‖(P q)_j‖² / E‖q_j‖² = Σ_{c∈j} (P Σ P)_cc / Σ_{c∈j} Σ_cc``
(``Σ = M/n``, clamped to [0, 1], stored as BF16 ``[G]`` per chunk and (batch row, head) and
counted). In expectation over queries distributed like the history the Taylor bias is then the
right one; a single query inside ``U_r`` is still over-corrected and one outside it
under-corrected. The FP8 rounding of ``C`` (≤ 2⁻⁴ relative) is left out of the noise model.

**Storage** (counted from the stored tensors): ``B + 24/g`` (residual) ``+ 8/D`` (ids) ``+
16·K_eff/L`` (centroids) ``+ 8·r/D`` (PSAC coefficients) ``+ 16·r/L`` (basis) ``+ 16/(g·L)``
(noise scales) bits per key element; values ``B + 24/g``. Ablations: ``quantwm-qsac`` (QSAC alone) and ``quantwm-psac`` (RTN
keys + PSAC). Not reproduced: anything in QuantWM's full text beyond its abstract; no kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.fields import MAX_SEED, option
from jbkv_cli.quant.groupwise import FP8_MAX, RTN_BITS, STEP_DTYPE
from jbkv_cli.quant.kmeans import (
    CENTROID_DTYPE,
    DEFAULT_MAX_ELEMENTS,
    MAX_CENTROIDS,
    MAX_ITERS,
    MAX_TOKENS_PER_CENTROID,
    capped_centroids,
    init_centroids,
    update_centroids,
)
from jbkv_cli.quant.method import MAX_GROUP_SIZE, KVMethod, Role
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.rtn import store_groups
from jbkv_cli.quant.tensor import ADDITIVE, GroupQuantized, QuantizedTensor

BASIS_DTYPE = torch.bfloat16
NOISE_DTYPE = torch.bfloat16


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest FP8 E4M3 value; ``ValueError`` beyond ±448."""
    if bool((x.abs() > FP8_MAX).any()):
        raise ValueError(f"a PSAC coefficient {float(x.abs().max()):.4g} exceeds FP8's {FP8_MAX}")
    return x.to(STEP_DTYPE)


def projected_noise_scale(
    second_moment: torch.Tensor, basis: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``√ρ_j`` with ``ρ_j = Σ_{c∈j} (P Σ P)_cc / Σ_{c∈j} Σ_cc``, ``P = I − Uᵀ U``, in [0, 1].

    ``second_moment`` ``Σ [N, D, D]``, ``basis`` ``U [N, r, D]`` (as stored) -> ``[N, D/g]``.
    """
    u = basis.float()
    eye = torch.eye(u.shape[-1], dtype=torch.float32, device=u.device)
    p = eye - u.transpose(1, 2) @ u
    kept = (p @ second_moment.float() @ p).diagonal(dim1=-2, dim2=-1)
    total = second_moment.float().diagonal(dim1=-2, dim2=-1)
    groups = (kept.shape[0], kept.shape[1] // group_size, group_size)
    num, den = kept.reshape(groups).sum(-1), total.reshape(groups).sum(-1)
    rho = torch.where(den > 0, num / den.clamp_min(1e-30), 1.0).clamp(0.0, 1.0)
    return rho.sqrt()


def group_ranges(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """``max − min`` over each group of ``group_size`` channels: ``[..., D] -> [..., D/g]``."""
    groups = x.unflatten(-1, (x.shape[-1] // group_size, group_size))
    return groups.amax(-1) - groups.amin(-1)


def range_cost(
    x: torch.Tensor,
    centroids: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> torch.Tensor:
    """``cost[n, i, a] = Σ_j S_nj · range_j(x_ni − c_na)²``.

    ``x [N, L, D]``, ``centroids [N, K, D]``, ``weight`` ``S [N, D/g]`` -> ``[N, L, K]``,
    computed over token blocks holding at most ``max_elements`` residual elements.
    """
    n, length, dim = x.shape
    k = centroids.shape[1]
    block = max(1, min(length, max_elements // max(1, n * k * dim)))
    out = torch.empty(n, length, k, dtype=torch.float32, device=x.device)
    for start in range(0, length, block):
        r = x[:, start : start + block, None, :] - centroids[:, None]  # [N, b, K, D]
        ranges = group_ranges(r, group_size)  # [N, b, K, G]
        out[:, start : start + block] = (ranges.square() * weight[:, None, None]).sum(-1)
    return out


def qsac_cluster(
    x: torch.Tensor,
    k: int,
    weight: torch.Tensor,
    group_size: int,
    iters: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QSAC on rows ``x [N, L, D]``: ``(ids [N, L] int64, stored centroids [N, K, D] BF16)``.

    ``iters`` rounds of (assign by :func:`range_cost`, update to the cluster means), then the
    final assignment against the BF16 centroids (module docstring).
    """
    x = x.float()
    cents = init_centroids(x, k, generator)
    for _ in range(iters):
        ids = range_cost(x, cents, weight, group_size).argmin(-1)
        onehot = torch.nn.functional.one_hot(ids, k).to(torch.float32)  # [N, L, K]
        cents = update_centroids(onehot.transpose(1, 2) @ x, onehot.sum(1), cents)
    stored = cents.to(CENTROID_DTYPE)
    ids = range_cost(x, stored.float(), weight, group_size).argmin(-1)
    return ids, stored


@dataclass
class QuantWMTensor(QuantizedTensor):
    """QuantWM keys ``[..., L, D]``: the RTN-stored residual, uint8 ``ids [..., L]`` and BF16
    ``centroids [..., K, D]`` (QSAC; ``K = 0`` without it), FP8 ``coeffs [..., L, r]`` and BF16
    ``basis [..., r, D]`` (PSAC; ``r = 0`` without it or without query history) and BF16
    ``noise_scale [..., G]`` (``√ρ_j``, module docstring; empty without PSAC)."""

    residual: GroupQuantized
    ids: torch.Tensor
    centroids: torch.Tensor
    coeffs: torch.Tensor
    basis: torch.Tensor
    noise_scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    def stored(self) -> dict[str, torch.Tensor]:
        held = {f"residual.{k}": t for k, t in self.residual.stored().items()}
        if self.centroids.shape[-2]:
            held |= {"cluster_ids": self.ids, "centroids": self.centroids}
        if self.basis.shape[-2]:
            held |= {
                "psac_coeffs": self.coeffs,
                "psac_basis": self.basis,
                "psac_noise_scale": self.noise_scale,
            }
        return held

    noise_model: ClassVar[str] = ADDITIVE  # the RTN residual's rounding (exact centroids)

    @property
    def step(self) -> torch.Tensor:
        """The residual's steps, scaled by ``√ρ_j`` under PSAC (module docstring)."""
        if not self.basis.shape[-2]:
            return self.residual.step
        return self.residual.step * self.noise_scale.float().unsqueeze(-2)

    def smoothing(self) -> torch.Tensor:
        """``c_a`` per token ``[..., L, D]`` (float32; zeros without QSAC)."""
        if not self.centroids.shape[-2]:
            return torch.zeros(self.shape, dtype=torch.float32, device=self.centroids.device)
        index = self.ids.long().unsqueeze(-1).expand(*self.ids.shape, self.shape[-1])
        return self.centroids.float().gather(-2, index)

    def compensation(self) -> torch.Tensor:
        """``C U_rᵀ`` ``[..., L, D]`` (float32; zeros without PSAC)."""
        return self.coeffs.float() @ self.basis.float()

    def dequantize(self) -> torch.Tensor:
        x = self.smoothing() + self.residual.dequantize().float()
        if self.basis.shape[-2]:
            x = x + self.compensation()
        return x.to(self.dtype)


@dataclass(frozen=True)
class QuantWM(KVMethod):
    """Keys: QSAC clustering + RTN residual + PSAC compensation; values: RTN. ``group_size``:
    channels per residual step; ``centroids`` K (≤ 256) capped at ``L // tokens_per_centroid``
    (0: no cap); ``iters`` QSAC rounds; ``seed`` of its init; ``rank`` r of PSAC."""

    name: ClassVar[str] = "quantwm"
    summary: ClassVar[str] = (
        "after QuantWM: query-sensitivity-aware key clustering (QSAC) and low-rank key-error "
        "compensation in the past queries' principal subspace (PSAC)"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = RTN_BITS
    needs_queries: ClassVar[bool] = True
    noise_model: ClassVar[str] = ADDITIVE
    qsac: ClassVar[bool] = True
    psac: ClassVar[bool] = True

    centroids: int = option(256, "int", lo=1, hi=MAX_CENTROIDS, note="uint8 cluster ids")
    tokens_per_centroid: int = option(64, "int", lo=0, hi=MAX_TOKENS_PER_CENTROID)
    iters: int = option(2, "int", lo=1, hi=MAX_ITERS)
    seed: int = option(0, "int", lo=0, hi=MAX_SEED)
    rank: int = option(2, "int", lo=1, hi=MAX_GROUP_SIZE)  # at most the head dim (check)

    def check(self, head_dim: int) -> None:
        super().check(head_dim)
        if self.psac and self.rank > head_dim:
            raise ValueError(f"rank {self.rank} exceeds the head dim {head_dim}")

    def effective_centroids(self, tokens: int) -> int:
        """``K_eff`` for a chunk of ``tokens`` tokens."""
        return capped_centroids(self.centroids, tokens, self.tokens_per_centroid)

    def _quantize(self, x: torch.Tensor, role: Role, queries: QueryStats) -> QuantizedTensor:
        if role == "value":
            return store_groups(x, self.bits, self.group_size)
        lead, (length, dim) = x.shape[:-2], x.shape[-2:]
        rows = x.float().reshape(-1, length, dim)
        n = rows.shape[0]
        groups = dim // self.group_size
        if queries.empty:
            weight = rows.new_ones(n, groups)
        else:
            s = queries.sensitivity().reshape(n, groups, self.group_size).sum(-1)
            weight = s / s.mean(-1, keepdim=True).clamp_min(1e-30)
        if self.qsac:
            k = self.effective_centroids(length)
            generator = torch.Generator().manual_seed(self.seed)
            ids, cents = qsac_cluster(rows, k, weight, self.group_size, self.iters, generator)
            index = ids.unsqueeze(-1).expand(-1, -1, dim)
            smooth = cents.float().gather(1, index)
        else:
            ids = rows.new_zeros(n, length, dtype=torch.long)
            cents = rows.new_zeros(n, 0, dim, dtype=CENTROID_DTYPE)
            smooth = torch.zeros_like(rows)
        residual = store_groups((rows - smooth).reshape(x.shape), self.bits, self.group_size)
        rank = self.rank if self.psac and not queries.empty else 0
        basis = rows.new_zeros(n, 0, dim, dtype=BASIS_DTYPE)
        coeffs = rows.new_zeros(n, length, 0, dtype=STEP_DTYPE)
        noise_scale = rows.new_zeros(n, 0, dtype=NOISE_DTYPE)
        if rank:
            basis = queries.subspace(rank).reshape(n, dim, rank).transpose(1, 2)
            basis = basis.to(BASIS_DTYPE)  # [N, r, D]
            error = rows - smooth - residual.dequantize().float().reshape(n, length, dim)
            coeffs = to_fp8(error @ basis.float().transpose(1, 2))  # [N, L, r]
            sigma = (queries.moment / queries.count).reshape(n, dim, dim)
            noise_scale = projected_noise_scale(sigma, basis, self.group_size).to(NOISE_DTYPE)
        return QuantWMTensor(
            residual=residual,
            ids=ids.to(torch.uint8).reshape(*lead, length),
            centroids=cents.reshape(*lead, cents.shape[1], dim),
            coeffs=coeffs.reshape(*lead, length, coeffs.shape[-1]),
            basis=basis.reshape(*lead, basis.shape[1], dim),
            noise_scale=noise_scale.reshape(*lead, noise_scale.shape[-1]),
            shape=x.shape,
            dtype=x.dtype,
        )

    def extra_id(self) -> list[str]:
        parts = []
        if self.qsac:
            parts += [f"k{self.centroids}"] if self.centroids != 256 else []
            parts += [f"tpc{self.tokens_per_centroid}"] if self.tokens_per_centroid != 64 else []
            parts += [f"it{self.iters}"] if self.iters != 2 else []
            parts += [f"ks{self.seed}"] if self.seed else []
        if self.psac and self.rank != 2:
            parts.append(f"r{self.rank}")
        return parts


@dataclass(frozen=True)
class QuantWMQSAC(QuantWM):
    """QSAC alone (ablation): clustered keys, RTN residual, no compensation."""

    name: ClassVar[str] = "quantwm-qsac"
    summary: ClassVar[str] = "after QuantWM, QSAC alone: query-sensitivity-aware key clustering"
    psac: ClassVar[bool] = False
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ("rank",)


@dataclass(frozen=True)
class QuantWMPSAC(QuantWM):
    """PSAC alone (ablation): RTN keys plus the low-rank compensation."""

    name: ClassVar[str] = "quantwm-psac"
    summary: ClassVar[str] = "after QuantWM, PSAC alone: RTN keys + principal-subspace compensation"
    qsac: ClassVar[bool] = False
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = (
        "centroids",
        "tokens_per_centroid",
        "iters",
        "seed",
    )
