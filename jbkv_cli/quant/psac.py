"""PSAC, QuantWM's principal-subspace attention compensation (arXiv 2609.26425, §3, App. D.1).

Per row ``n`` (one (batch, head) pair of one chunk), with ``e_i = x_i − x̂_i`` the key error
left by the centroid + residual format and ``M`` the second moment of the *earlier* chunks'
queries (App. C.3; without history PSAC stores nothing)::

    U_r  = the r leading eigenvectors of M, stored BF16 [r, D]        (r = 8, Table 9)
    C_i  = e_i U_rᵀ                                                  [r] per token
    Ĉ_i  = INT8 codes · an FP16 scale per row (token): s_i = fp16_up(max|C_i| / 127)
    gate: token i keeps its row only if it lowers the query-weighted error,
          (e_i − Ĉ_i U_r)ᵀ Σ (e_i − Ĉ_i U_r) < e_iᵀ Σ e_i,   Σ = M / n
    x̂'_i = x̂_i + Ĉ_i U_r                                            (kept rows only)

Layout (App. D.1: each chunk takes the smaller): *dense*, every row (``[L, r]`` INT8 codes and
``[L]`` FP16 scales; a gated-off row stores scale 0), or *sparse*, the kept rows only with
their token index (int16; int32 past 32,767 tokens) and a kept-row count per (batch, head)
(int32). Bytes: dense ``N·L·(r + 2)``, sparse ``4N + n_kept·(r + 2 + index bytes)``. Choosing
reads ``n_kept`` on the host and the sparse rows are a shape read from the gate, so off the
CPU (where that read is a host sync per layer and chunk, :mod:`jbkv_cli.utils.host_reads`)
every chunk is stored dense, and counted so: the same values, the bytes of the dense layout.

**jbkv's addition: steps calibrated on the query history (not in the paper).** The
correction's noise model is uniform rounding noise of step ``Δ_ij`` read by ``‖q_j‖²``. PSAC
removes the residual's noise along ``U_r`` in the kept rows, so there a query ``q`` sees the
noise of ``P q``, ``P = I − U_rᵀ U_r``. The kernel reads ``‖q_j‖²`` with one projection for
every chunk, so the kept rows report ``Δ_ij · √ρ_j`` with ``ρ_j = Σ_{c∈j} (P Σ P)_cc /
Σ_{c∈j} Σ_cc`` (clamped to [0, 1], BF16 ``[G]`` per row, stored and counted): the Taylor bias is
then right in expectation over queries distributed like the history (a single query inside
``U_r`` is still over-corrected, one outside under-corrected). Gated-off rows report ``Δ_ij``.
The INT8 rounding of ``C`` is left out of the noise model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.quant.groupwise import round_fp16
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.utils.host_reads import on_host

BASIS_DTYPE = torch.bfloat16
NOISE_DTYPE = torch.bfloat16
INT8_MAX = 127


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


def int8_rows(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``C [N, L, r]`` as INT8 codes and an FP16 scale per row (symmetric absmax, the scale
    rounded up so no code clips): ``(codes int8 [N, L, r], scale fp16 [N, L])``."""
    scale = round_fp16(c.abs().amax(-1) / INT8_MAX, up=True)
    s = scale.float().unsqueeze(-1)
    codes = (c / torch.where(s > 0, s, 1.0)).round().clamp(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8), scale


def weighted_error(e: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``e_iᵀ Σ e_i`` per token: ``e [N, L, D]``, ``Σ [N, D, D]`` -> ``[N, L]``."""
    return ((e @ sigma) * e).sum(-1)


def _index_dtype(length: int) -> torch.dtype:
    return torch.int16 if length <= torch.iinfo(torch.int16).max else torch.int32


@dataclass
class PSACRows:
    """What PSAC stores for one chunk's keys (rows ``N``, tokens ``L``): the basis, the noise
    scales, and the coefficient rows in the dense or sparse layout (module docstring)."""

    basis: torch.Tensor  # BF16 [N, r, D]
    noise_scale: torch.Tensor  # BF16 [N, G]
    codes: torch.Tensor  # int8 [N, L, r] (dense) or [n_kept, r] (sparse)
    scale: torch.Tensor  # fp16 [N, L] (dense) or [n_kept] (sparse)
    length: int
    index: torch.Tensor | None = None  # sparse: token of each kept row, int16/int32 [n_kept]
    counts: torch.Tensor | None = None  # sparse: kept rows per (batch, head), int32 [N]

    @property
    def layout(self) -> str:
        return "dense" if self.index is None else "sparse"

    def stored(self) -> dict[str, torch.Tensor]:
        held = {
            "basis": self.basis,
            "noise_scale": self.noise_scale,
            "codes": self.codes,
            "scale": self.scale,
        }
        if self.index is not None:
            held |= {"index": self.index, "counts": self.counts}
        return held

    def _rows(self) -> torch.Tensor:
        """The (batch, head) row of each stored sparse row."""
        n = self.basis.shape[0]
        lanes = torch.arange(n, device=self.codes.device)
        return lanes.repeat_interleave(self.counts.long().to(self.codes.device))

    def coefficients(self) -> torch.Tensor:
        """``Ĉ`` ``[N, L, r]`` (float32; zero rows where gated off)."""
        values = self.codes.float() * self.scale.float().unsqueeze(-1)
        if self.index is None:
            return values
        n, r = self.basis.shape[0], self.basis.shape[1]
        out = torch.zeros(n, self.length, r, dtype=torch.float32, device=values.device)
        out[self._rows(), self.index.long()] = values
        return out

    def kept(self) -> torch.Tensor:
        """Which tokens keep their row ``[N, L]`` (bool)."""
        if self.index is None:
            return self.scale.float() > 0
        out = torch.zeros(self.basis.shape[0], self.length, dtype=torch.bool)
        out = out.to(self.codes.device)
        out[self._rows(), self.index.long()] = True
        return out

    def compensation(self) -> torch.Tensor:
        """``Ĉ U_r`` ``[N, L, D]`` (float32)."""
        return self.coefficients() @ self.basis.float()


def layout_bytes(rows: int, length: int, kept: int, rank: int) -> dict[str, int]:
    """Bytes of each layout for ``kept`` of ``rows × length`` rows (module docstring)."""
    index = torch.empty(0, dtype=_index_dtype(length)).element_size()
    return {
        "dense": rows * length * (rank + 2),
        "sparse": 4 * rows + kept * (rank + 2 + index),
    }


def psac_rows(error: torch.Tensor, queries: QueryStats, rank: int, group_size: int) -> PSACRows:
    """PSAC for the key error ``error [N, L, D]`` (float32) with the history ``queries``
    (non-empty) at rank ``rank`` (module docstring)."""
    n, length, dim = error.shape
    basis = queries.subspace(rank).reshape(n, dim, rank).transpose(1, 2).to(BASIS_DTYPE)
    u = basis.float().to(error.device)
    sigma = (queries.moment / queries.count).reshape(n, dim, dim).float().to(error.device)
    codes, scale = int8_rows(error @ u.transpose(1, 2))  # [N, L, r], [N, L]
    comp = (codes.float() * scale.float().unsqueeze(-1)) @ u
    keep = weighted_error(error - comp, sigma) < weighted_error(error, sigma)
    codes = torch.where(keep.unsqueeze(-1), codes, torch.zeros_like(codes))
    scale = torch.where(keep, scale, torch.zeros_like(scale))
    noise = projected_noise_scale(sigma, basis, group_size).to(NOISE_DTYPE)
    if not on_host(keep):  # off the CPU: dense (module docstring)
        return PSACRows(basis, noise, codes, scale, length)
    sizes = layout_bytes(n, length, int(keep.sum()), rank)
    if sizes["sparse"] >= sizes["dense"]:
        return PSACRows(basis, noise, codes, scale, length)
    lane, token = keep.nonzero(as_tuple=True)  # row-major: by (batch, head), then token
    return PSACRows(
        basis,
        noise,
        codes[lane, token],
        scale[lane, token],
        length,
        index=token.to(_index_dtype(length)),
        counts=keep.sum(-1).to(torch.int32),
    )
