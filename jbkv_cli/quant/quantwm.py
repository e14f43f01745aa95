"""QuantWM (Zhao et al., arXiv 2609.26425 v2/v3): query-aware 2-bit KV for video world models.

Implemented from the full text (§3, Eq. 1–14, Tables 4–11, Appendices C–D) as summarised in
``shared/docs/methods-sources.md`` ("QuantWM (paper)"); no code is published. Per committed
chunk ``x [..., L, D]`` and (batch, head); each rule names where the paper states it:

**Format** — QuantVideoGen's centroid + residual (Eq. 3–4) for keys *and* values (App. D.1):
``x̂_i = c_{a_i} + r̂_i (+ Ĉ_i U_r for keys)``, one stage, ``K_eff`` BF16 centroids with uint8
ids; the residual ``x − c_a`` in the affine INT-``b`` format (Eq. 1–2) with integer zero points
bit-packed at ``b`` bits and INT8 scale codes under a shared FP16 secondary scale (App. D.1),
group ``g = 64`` (App. D.1; :mod:`jbkv_cli.quant.affine`). ``K = 256`` (the paper's default).

**Keys — QSAC** (§3, Eq. 9, 10, 14; :mod:`jbkv_cli.quant.qsac`): channel weights ``w_c = M_cc
/ mean(M_cc)`` from the diagonal of the query second moment ``M`` (Eq. 9; the full ``M`` gives
no consistent gain, Table 10); clustering in the query-weighted distance ``d_Q`` (Eq. 10);
each token then takes, among its ``M = 4`` nearest centroids by ``d_Q``, the one whose residual
has the least score ``S = Σ_g (Σ_{c∈g} w_c) R_g²`` (Eq. 14; ``-M quantwm.candidates=256``
scores every centroid: Table 11, no gain at ≈ 2× the latency).

**Keys — PSAC** (§3, Table 9, App. D.1; :mod:`jbkv_cli.quant.psac`): the key error left by the
format, ``E``, projected on the ``r = 8`` leading eigenvectors ``U_r`` of ``M`` (Table 9; BF16),
``C = E U_rᵀ`` as INT8 codes with an FP16 scale per row, a row kept only where it lowers the
query-weighted error, and per chunk the smaller of a dense and a sparse layout (App. D.1; off
the CPU always dense, since choosing reads the kept rows on the host: :mod:`jbkv_cli.quant.psac`).

**Values** follow the same reconstruction path without PSAC (App. D.1).

**Causality** (App. C.3): ``M`` is that of the queries of *earlier* chunks, ``M^{t−1}``; the
first chunk gets uniform channel sensitivity (``w_c = 1``) and no PSAC; a chunk's own queries
(its denoising steps and its refresh pass) are added only after it is quantized. The cache
keeps that protocol (:class:`~jbkv_cli.kvcache.ChunkKVCache`: the queries since the last
commit wait in a pending buffer until the next commit has stored its chunk).

**Ablations** (Table 5): ``quantwm-qsac`` (QSAC, no PSAC) and ``quantwm-psac`` (Euclidean
k-means keys + PSAC). Table 5's baseline row "without QSAC, without PSAC" equals the paper's
QVG row (Table 3; QuantWM ran its baselines from their official repositories), so the literal
Table 5 baseline is QVG as its code runs it: jbkv's ``qvg`` at g = 64 (symmetric residual, FP8
scales). ``quantwm-base`` (neither technique, this affine format) is jbkv's own control, not a
row of the paper: against it an ablation's gain is QSAC's or PSAC's alone, against ``qvg`` the
technique's and the format's together.

**jbkv's own addition — PSAC steps calibrated on the query history (not the paper's).** The
Jensen-bias correction reads each cached token's rounding steps ``Δ``. Rows PSAC keeps report
``Δ·√ρ_j`` instead, ``ρ_j`` the share of the history's query energy in group ``j`` outside
``U_r`` (BF16 ``[D/g]`` per chunk and head, stored and counted; :mod:`jbkv_cli.quant.psac`):
with it the correction's uniform-noise model fits the score noise PSAC leaves. Gated-off rows
and values report ``Δ``. Without a correction these scales change nothing but the bytes.

**Storage**, counted from the stored tensors (:meth:`QuantWMTensor.stored`), bits per element:
values ``b + (b + 8)/g + 16/(L·D) + 8/D + 16·K_eff/L``; keys add PSAC's dense rows ``(8r +
16)/D``, the basis ``16r/L`` and the noise scales ``16/(g·L)``, or the sparse rows when smaller.

What remains different from the paper, or is jbkv's choice where the text read is silent:

1. **QSAC's loop**: ``iters = 2`` Lloyd rounds in the ``d_Q`` metric (QVG's scripts' 2
   iterations; all of them, no host read between rounds, :mod:`~jbkv_cli.quant.kmeans`) from ``K`` distinct tokens drawn by a seeded generator, then Eq. 14 against the
   BF16-rounded centroids; Eq. 14's ties go to the nearer by ``d_Q``.
2. **Values** are clustered by Euclidean k-means (QSAC's weights measure the keys' logit error;
   the text does not weigh values by queries).
3. **The query history** ``M`` is the running sum over every earlier query of the layer
   (all denoising steps and refresh passes, post-RoPE, a GQA group's query heads pooled on
   their KV head); the text says "earlier steps" and names no decay or window.
4. **The affine format's rounding**: the range widened to hold 0, scale codes rounded up
   (uint8 1..255), one FP16 secondary scale per (chunk, batch, head)
   (:mod:`jbkv_cli.quant.affine`).
5. **PSAC's details**: ``U_r`` from the uncentred ``M``; the gate's weight ``Σ = M/n``; the
   sparse layout's int16/int32 token indices and int32 row counts; the FP16 row scale rounded
   up. The ``Δ·√ρ`` steps above are jbkv's and cost ``16/(g·L)`` bits.
6. **K on small chunks** (jbkv's, the rule ``qvg`` uses): ``K = 256`` where a chunk holds at
   least ``16·K`` tokens (Self-Forcing's 4,680 per chunk); below that, where ``K = 256`` would
   store (nearly) every token as its own centroid, ``K_eff = min(K, L // tokens_per_centroid)``
   (64: the embedded model's 256-token chunks get 4 centroids, and its rows say so).
7. **Group size**: ``g = 64``, the paper's, is the method's default
   (:meth:`~jbkv_cli.quant.method.KVMethod.default_group_size`); a run's ``--group-sizes``
   sets another, as for every method.
8. **Scope**: one codebook per chunk (the text read names no multi-chunk span); plain PyTorch,
   no kernels; the stored tensor is not token-prunable; keys cached post-RoPE.
9. **The token-selection shift** (Table 4's metric, :mod:`jbkv_cli.attention.diagnostics`) is
   measured on the recorder's strided sample of queries and over ``[cached | current]`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.quant.affine import AFFINE_BITS, AffineResidual, check_affine, quantize_affine
from jbkv_cli.quant.kmeans import (
    CENTROID_DTYPE,
    DEFAULT_MAX_ELEMENTS,
    MAX_CENTROIDS,
    MAX_ITERS,
    MAX_TOKENS_PER_CENTROID,
    Draws,
    capped_centroids,
    kmeans,
)
from jbkv_cli.quant.method import MAX_GROUP_SIZE, KVMethod, Role
from jbkv_cli.quant.psac import PSACRows, psac_rows
from jbkv_cli.quant.qsac import channel_weights, qsac_cluster
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.qvg_policy import UNCAPPED_TOKENS_PER_CENTROID
from jbkv_cli.quant.tensor import MIXED, QuantizedTensor
from jbkv_cli.utils.fields import MAX_SEED, option


def quantwm_centroids(k: int, tokens: int, tokens_per_centroid: int) -> tuple[int, bool]:
    """``(K_eff, capped)`` for a chunk of ``tokens`` tokens (module docstring, "K")."""
    if tokens_per_centroid == 0 or tokens >= UNCAPPED_TOKENS_PER_CENTROID * k:
        return min(k, tokens), False
    capped = capped_centroids(k, tokens, tokens_per_centroid)
    return capped, capped < min(k, tokens)


@dataclass
class QuantWMTensor(QuantizedTensor):
    """One chunk's keys or values ``[..., L, D]``: uint8 ``ids [N, L]`` and BF16 ``centroids
    [N, K, D]`` (``N`` = the leading dims flattened), the affine ``residual`` and, for keys with
    query history, ``psac`` (:class:`~jbkv_cli.quant.psac.PSACRows`)."""

    ids: torch.Tensor
    centroids: torch.Tensor
    residual: AffineResidual
    psac: PSACRows | None
    shape: torch.Size
    dtype: torch.dtype

    def stored(self) -> dict[str, torch.Tensor]:
        held = {"cluster_ids": self.ids, "centroids": self.centroids}
        held |= {f"residual.{k}": t for k, t in self.residual.stored().items()}
        if self.psac is not None:
            held |= {f"psac.{k}": t for k, t in self.psac.stored().items()}
        return held

    @property
    def num_centroids(self) -> int:
        return self.centroids.shape[-2]

    # exact centroids + a coarse affine grid over a peaked residual (at INT2 no level at 0: small
    # residuals round outward, as RTN's do, but the grid is not fine next to their spread):
    # neither additive nor centroid type, so measured at commit (jbkv_cli.quant.noise)
    noise_model: ClassVar[str] = MIXED

    @property
    def step(self) -> torch.Tensor:
        """The residual's steps; ``Δ·√ρ_j`` where PSAC kept the row (module docstring)."""
        step = self.residual.rows_step  # [N, L, G]
        if self.psac is not None:
            scale = self.psac.noise_scale.float().unsqueeze(1)  # [N, 1, G]
            step = torch.where(self.psac.kept().unsqueeze(-1), step * scale, step)
        return step.reshape(*self.shape[:-1], -1)

    def smoothing(self) -> torch.Tensor:
        """``c_a`` per token ``[N, L, D]`` (float32)."""
        index = self.ids.long().unsqueeze(-1).expand(*self.ids.shape, self.shape[-1])
        return self.centroids.float().gather(-2, index)

    def dequantize(self) -> torch.Tensor:
        x = self.smoothing() + self.residual.rows()
        if self.psac is not None:
            x = x + self.psac.compensation()
        return x.reshape(self.shape).to(self.dtype)


@dataclass(frozen=True)
class QuantWM(KVMethod):
    """QuantWM (module docstring). ``group_size`` g of the residual; ``centroids`` K (≤ 256,
    capped at ``L // tokens_per_centroid`` below ``16·K`` tokens; 0: no cap); ``candidates``
    M of Eq. 14; ``iters`` clustering rounds; ``seed`` of the init; ``rank`` r of PSAC."""

    name: ClassVar[str] = "quantwm"
    summary: ClassVar[str] = (
        "QuantWM: centroid + affine INT2 residual for K and V, keys clustered by query "
        "sensitivity (QSAC) and compensated in the past queries' principal subspace (PSAC)"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = AFFINE_BITS
    needs_queries: ClassVar[bool] = True
    noise_model: ClassVar[str] = MIXED
    qsac: ClassVar[bool] = True
    psac: ClassVar[bool] = True

    group_size: int = option(64, "int", lo=1, hi=MAX_GROUP_SIZE, cli=False)
    centroids: int = option(256, "int", lo=1, hi=MAX_CENTROIDS, note="uint8 cluster ids")
    tokens_per_centroid: int = option(64, "int", lo=0, hi=MAX_TOKENS_PER_CENTROID)
    candidates: int = option(4, "int", lo=1, hi=MAX_CENTROIDS, note="top-M of Eq. 14")
    iters: int = option(2, "int", lo=1, hi=MAX_ITERS)
    seed: int = option(0, "int", lo=0, hi=MAX_SEED)
    rank: int = option(8, "int", lo=1, hi=MAX_GROUP_SIZE)  # at most the head dim (check)

    def check(self, head_dim: int) -> None:
        check_affine(head_dim, self.bits, self.group_size)
        if self.psac and self.rank > head_dim:
            raise ValueError(f"rank {self.rank} exceeds the head dim {head_dim}")

    def effective_centroids(self, tokens: int) -> int:
        """``K_eff`` for a chunk of ``tokens`` tokens."""
        return quantwm_centroids(self.centroids, tokens, self.tokens_per_centroid)[0]

    def storage_note(self, tokens: int) -> str:
        """What a result row says about ``K`` for chunks of ``tokens`` tokens ("" uncapped)."""
        k, capped = quantwm_centroids(self.centroids, tokens, self.tokens_per_centroid)
        return f"K={k}: L/{self.tokens_per_centroid} cap" if capped else ""

    def _cluster(
        self, rows: torch.Tensor, role: Role, queries: QueryStats
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, length, dim = rows.shape
        k = self.effective_centroids(length)
        draws = Draws(self.seed)
        if role == "key" and self.qsac:
            w = channel_weights(queries, n, dim)
            return qsac_cluster(rows, k, w, self.group_size, self.iters, self.candidates, draws)
        ids, cents = kmeans(rows, k, self.iters, draws, DEFAULT_MAX_ELEMENTS)
        return ids, cents.to(CENTROID_DTYPE)

    def _quantize(self, x: torch.Tensor, role: Role, queries: QueryStats) -> QuantizedTensor:
        length, dim = x.shape[-2:]
        rows = x.float().reshape(-1, length, dim)  # [N, L, D], N = batch · heads
        ids, cents = self._cluster(rows, role, queries)
        smooth = cents.float().gather(1, ids.unsqueeze(-1).expand(-1, -1, dim))
        residual = quantize_affine(rows - smooth, self.bits, self.group_size, x.shape, x.dtype)
        psac = None
        if role == "key" and self.psac and not queries.empty:
            error = rows - smooth - residual.rows()
            psac = psac_rows(error, queries, self.rank, self.group_size)
        return QuantWMTensor(ids.to(torch.uint8), cents, residual, psac, x.shape, x.dtype)

    def extra_id(self) -> list[str]:
        parts = [f"k{self.centroids}"] if self.centroids != 256 else []
        parts += [f"tpc{self.tokens_per_centroid}"] if self.tokens_per_centroid != 64 else []
        parts += [f"it{self.iters}"] if self.iters != 2 else []
        parts += [f"ks{self.seed}"] if self.seed else []
        if self.qsac and self.candidates != 4:
            parts.append(f"m{self.candidates}")
        if self.psac and self.rank != 8:
            parts.append(f"r{self.rank}")
        return parts


@dataclass(frozen=True)
class QuantWMQSAC(QuantWM):
    """QSAC alone (Table 5): QSAC-clustered keys, no PSAC."""

    name: ClassVar[str] = "quantwm-qsac"
    summary: ClassVar[str] = "QuantWM with QSAC alone (Table 5 ablation): no PSAC"
    psac: ClassVar[bool] = False
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ("rank",)


@dataclass(frozen=True)
class QuantWMPSAC(QuantWM):
    """PSAC alone (Table 5): Euclidean k-means keys (as QVG) plus PSAC."""

    name: ClassVar[str] = "quantwm-psac"
    summary: ClassVar[str] = "QuantWM with PSAC alone (Table 5 ablation): k-means keys, no QSAC"
    qsac: ClassVar[bool] = False
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ("candidates",)


@dataclass(frozen=True)
class QuantWMBase(QuantWM):
    """Neither technique: QuantWM's format alone (k-means + affine residual, K and V)."""

    name: ClassVar[str] = "quantwm-base"
    summary: ClassVar[str] = (
        "QuantWM's format without QSAC or PSAC: k-means centroids + affine INT2 residual"
    )
    needs_queries: ClassVar[bool] = False
    qsac: ClassVar[bool] = False
    psac: ClassVar[bool] = False
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ("candidates", "rank")

    def _quantize(self, x: torch.Tensor, role: Role) -> QuantizedTensor:  # type: ignore[override]
        return super()._quantize(x, role, QueryStats())
