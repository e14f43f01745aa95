"""QSAC, QuantWM's query-sensitivity-aware clustering (arXiv 2609.26425, §3, Eq. 9, 10, 14).

Per row ``n`` (one (batch, head) pair of one chunk), tokens ``x_i [D]`` and centroids
``c_a [D]``, with ``M`` the second moment of the *earlier* chunks' queries (App. C.3)::

    w_c      = M_cc / mean_c(M_cc)                            channel weights (Eq. 9; 1 without
                                                                history: uniform sensitivity)
    d_Q(i,a) = Σ_c w_c (x_ic − c_ac)²                         query-weighted distance (Eq. 10)
    S(i,a)   = Σ_g (Σ_{c∈g} w_c) · R_g(x_i − c_a)²            the residual's score (Eq. 9, 14),
                                                                R_g = max − min over group g

Assignment (Eq. 14): the ``M`` candidates nearest by ``d_Q`` (top-M, default 4), then the one
of least ``S`` (ties: the nearer by ``d_Q``). ``M = K`` scores every centroid (Table 11: no gain
at ≈2× the latency; ``benchmarks/methods.py`` measures it here).

Clustering (jbkv's reading where the text read is silent): ``iters`` Lloyd rounds in the
``d_Q`` metric (assign to the nearest, update to the cluster means: the mean minimises the
weighted squared distance channel by channel; an empty cluster keeps its centroid; all
``iters`` rounds, no host read between them, with :mod:`~jbkv_cli.quant.kmeans`'s CPU-only early
stop when no assignment changes, which gives the same result), from ``K`` distinct tokens drawn by a seeded generator (as
``qvg``); then the centroids are rounded to BF16 (as stored) and every token is assigned by
Eq. 14 against the *stored* centroids, so its residual is taken against what is read back.

Memory: distances ``[N, b, K]`` and candidate residuals ``[N, b, M, D]`` are computed for
blocks of ``b`` tokens, each at most ``max_elements`` elements.
"""

from __future__ import annotations

import torch

from jbkv_cli.quant.kmeans import (
    CENTROID_DTYPE,
    DEFAULT_MAX_ELEMENTS,
    Draws,
    converged,
    init_centroids,
    update_centroids,
)
from jbkv_cli.quant.queries import QueryStats


def channel_weights(queries: QueryStats, rows: int, dim: int) -> torch.Tensor:
    """``w_c = M_cc / mean(M_cc)`` ``[N, D]`` (Eq. 9); ones without history (App. C.3)."""
    if queries.empty:
        return torch.ones(rows, dim)
    diag = queries.moment.diagonal(dim1=-2, dim2=-1).reshape(rows, dim).float()
    mean = diag.mean(-1, keepdim=True)
    return torch.where(mean > 0, diag / mean.clamp_min(1e-30), 1.0)


def group_weights(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """``W_g = Σ_{c∈g} w_c``: ``[N, D] -> [N, D/g]``."""
    return w.unflatten(-1, (w.shape[-1] // group_size, group_size)).sum(-1)


def group_ranges(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """``max − min`` over each group of ``group_size`` channels: ``[..., D] -> [..., D/g]``."""
    groups = x.unflatten(-1, (x.shape[-1] // group_size, group_size))
    return groups.amax(-1) - groups.amin(-1)


def weighted_distance(x: torch.Tensor, centroids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``d_Q`` up to a per-token constant: ``Σ_c w_c c_c² − 2 Σ_c w_c x_c c_c``.

    ``x [N, b, D]``, ``centroids [N, K, D]``, ``w [N, D]`` -> ``[N, b, K]`` (float32).
    """
    wc = centroids * w[:, None, :]
    c_sq = (wc * centroids).sum(-1).unsqueeze(1)  # [N, 1, K]
    return torch.baddbmm(c_sq, x, wc.transpose(1, 2), alpha=-2.0)


def range_score(
    x: torch.Tensor, candidates: torch.Tensor, weight: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``S = Σ_g W_g R_g²`` of ``x [N, b, D]`` against ``candidates [N, b, M, D]`` with
    ``weight`` ``W [N, G]`` -> ``[N, b, M]``."""
    ranges = group_ranges(x[:, :, None, :] - candidates, group_size)  # [N, b, M, G]
    return (ranges.square() * weight[:, None, None, :]).sum(-1)


def _block(n: int, per_token: int, length: int, max_elements: int) -> int:
    return max(1, min(length, max_elements // max(1, n * per_token)))


def qsac_assign(
    x: torch.Tensor,
    centroids: torch.Tensor,
    w: torch.Tensor,
    group_size: int,
    candidates: int,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> torch.Tensor:
    """Eq. 14: each token of ``x [N, L, D]`` to the candidate of least ``S`` among its
    ``candidates`` nearest centroids by ``d_Q`` -> ids ``[N, L]`` (int64)."""
    n, length, dim = x.shape
    k = centroids.shape[1]
    m = min(candidates, k)
    weight = group_weights(w, group_size)
    block = _block(n, max(k, m * dim), length, max_elements)
    ids = torch.empty(n, length, dtype=torch.long, device=x.device)
    for start in range(0, length, block):
        xb = x[:, start : start + block]
        near = weighted_distance(xb, centroids, w).topk(m, dim=-1, largest=False).indices
        flat = near.flatten(1)  # [N, b·M]
        cand = centroids.gather(1, flat.unsqueeze(-1).expand(-1, -1, dim))
        cand = cand.view(n, xb.shape[1], m, dim)
        best = range_score(xb, cand, weight, group_size).argmin(-1, keepdim=True)  # [N, b, 1]
        ids[:, start : start + block] = near.gather(-1, best).squeeze(-1)
    return ids


def _lloyd_pass(
    x: torch.Tensor, centroids: torch.Tensor, w: torch.Tensor, max_elements: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest centroid by ``d_Q`` of every token, and per cluster the sum and count of its
    tokens: ``ids [N, L]``, ``sums [N, K, D]``, ``counts [N, K]``, one pass over blocks."""
    n, length, dim = x.shape
    k = centroids.shape[1]
    block = _block(n, k, length, max_elements)
    ids = torch.empty(n, length, dtype=torch.long, device=x.device)
    sums = torch.zeros(n, k, dim, dtype=torch.float32, device=x.device)
    counts = torch.zeros(n, k, dtype=torch.float32, device=x.device)
    for start in range(0, length, block):
        xb = x[:, start : start + block]
        best = weighted_distance(xb, centroids, w).argmin(-1)  # [N, b]
        ids[:, start : start + block] = best
        onehot = torch.nn.functional.one_hot(best, k).to(torch.float32)  # [N, b, K]
        sums += onehot.transpose(1, 2) @ xb
        counts += onehot.sum(1)
    return ids, sums, counts


def qsac_cluster(
    x: torch.Tensor,
    k: int,
    w: torch.Tensor,
    group_size: int,
    iters: int,
    candidates: int,
    draws: Draws,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QSAC on rows ``x [N, L, D]``: ``(ids [N, L] int64, stored centroids [N, K, D] BF16)``
    (the module docstring's clustering, then Eq. 14 against the stored centroids)."""
    x = x.float()
    w = w.to(x.device).float()
    cents = init_centroids(x, k, draws)
    previous = None
    for _ in range(iters):
        ids, sums, counts = _lloyd_pass(x, cents, w, max_elements)
        if converged(ids, previous):
            break  # the means would equal the current centroids
        cents = update_centroids(sums, counts, cents)
        previous = ids
    stored = cents.to(CENTROID_DTYPE)
    ids = qsac_assign(x, stored.float(), w, group_size, candidates, max_elements)
    return ids, stored
