"""QueryStats: what a layer has learned about its queries so far (strictly causal).

Some methods (QuantWM's QSAC and PSAC) weigh key error by the queries that will read the keys.
QuantWM's protocol (App. C.3) is strictly causal: a chunk is quantized with the statistics of
the queries of *earlier* chunks, ``M^{t−1}``, and its own queries (its denoising and refresh
passes) are added only after it is quantized. The cache keeps two of these: the queries it
attends with go to a pending one (:meth:`QueryStats.update`), and a commit stores its chunk with
the history, then folds the pending queries in (:meth:`QueryStats.absorb`).

Per batch row ``b`` and KV head ``h`` (GQA: the query heads ``h·r .. h·r + r − 1`` of the group
share their KV head, as SDPA's ``enable_gqa`` maps them)::

    M_bh = Σ_{calls} Σ_{query heads of h} Σ_t q_t q_tᵀ     second moment  [B, Hkv, D, D]
    n    = query vectors summed per (b, h)
    s_c  = M_cc / n = E[q_c²]                                channel sensitivity  [B, Hkv, D]
    U_r  = the r leading eigenvectors of M                   dominant query subspace [B, Hkv, D, r]

so for a key error ``e`` the mean squared logit error over the history is
``E[(q·e)²] = eᵀ (M/n) e``; its diagonal part is ``Σ_c s_c e_c²``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QueryStats:
    """Running second moment of the queries attended with, per (batch row, KV head)."""

    moment: torch.Tensor | None = None  # [B, Hkv, D, D], float32
    count: int = 0

    def update(self, q: torch.Tensor, kv_heads: int) -> None:
        """Add the queries ``q [B, Hq, Lq, D]`` read over ``kv_heads`` KV heads."""
        b, hq, lq, d = q.shape
        if hq % kv_heads:
            raise ValueError(f"{hq} query heads do not group over {kv_heads} KV heads")
        qg = q.detach().float().reshape(b, kv_heads, (hq // kv_heads) * lq, d)
        m = qg.transpose(-1, -2) @ qg
        if self.moment is not None and self.moment.shape != m.shape:
            raise ValueError(f"queries of shape {tuple(q.shape)} do not match earlier queries")
        self.moment = m if self.moment is None else self.moment + m
        self.count += (hq // kv_heads) * lq

    def absorb(self, other: QueryStats) -> None:
        """Add ``other``'s queries to these (``other`` is left as it was)."""
        if other.empty:
            return
        if self.moment is not None and self.moment.shape != other.moment.shape:
            raise ValueError("query statistics of different shapes cannot be combined")
        self.moment = other.moment.clone() if self.moment is None else self.moment + other.moment
        self.count += other.count

    @property
    def empty(self) -> bool:
        return self.moment is None or self.count == 0

    def check(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` unless the statistics fit chunk keys ``x [B, Hkv, L, D]``."""
        if self.moment is None:
            return
        want = (*x.shape[:-2], x.shape[-1], x.shape[-1])
        if tuple(self.moment.shape) != want:
            raise ValueError(
                f"query statistics {tuple(self.moment.shape)} do not fit keys {tuple(x.shape)}"
            )

    def sensitivity(self) -> torch.Tensor:
        """``s_c = E[q_c²]`` ``[B, Hkv, D]`` (float32)."""
        if self.moment is None:
            raise ValueError("no queries recorded yet")
        return self.moment.diagonal(dim1=-2, dim2=-1) / self.count

    def subspace(self, rank: int) -> torch.Tensor:
        """``U_r`` ``[B, Hkv, D, r]``: orthonormal leading eigenvectors of ``M`` (float32), each
        signed so that its largest-magnitude entry is positive (a deterministic basis)."""
        if self.moment is None:
            raise ValueError("no queries recorded yet")
        m = self.moment.double() / self.count
        _, vecs = torch.linalg.eigh(m)  # ascending eigenvalues
        u = vecs[..., -rank:].flip(-1) if rank else vecs[..., :0]
        pivot = u.abs().argmax(dim=-2, keepdim=True)
        sign = torch.sign(u.gather(-2, pivot))
        return (u * torch.where(sign == 0, 1.0, sign)).float()
