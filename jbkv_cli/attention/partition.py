"""The measured bias itself: how far stored keys move the cached log-partition, and how much of
that the active correction predicts.

Per query (and head), over the cached tokens only::

    shift      = log Σ_cached exp(τ q·k̂) − log Σ_cached exp(τ q·k)      (k: the exact copy)
    predicted  = log Σ_cached exp(τ q·k̂) − log Σ_cached exp(τ q·k̂ + a)  (a: what the correction
                                                                        adds, −b)
    left       = shift − predicted = log Σ exp(τ q·k̂ + a) − log Σ exp(τ q·k)

``predicted`` is the shift the correction removes (0 without one), ``left`` what it leaves, and
``predicted / shift`` the share of the measured shift it predicts: 1 is exact, above 1 an
over-correction, below 0 the wrong sign. ``ΔP_S`` is this bias seen through the softmax (with
the current chunk's keys in the denominator); the log-partition shift is the quantity the
correction's derivation is about (:mod:`jbkv_cli.attention.correction`).
"""

from __future__ import annotations

import torch


def log_partition_shift(
    s_hat: torch.Tensor,
    s_ref: torch.Tensor,
    added: torch.Tensor | None = None,
    dropped: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(shift, predicted)`` per row (module docstring) from the cached scores ``τ q·k̂`` and
    ``τ q·k`` ``[..., Lc]``; ``added`` (broadcastable) is what the correction adds to the stored
    scores, ``dropped`` an additive ``−inf`` mask of tokens a pruner removed (both optional)."""
    if dropped is not None:
        s_hat, s_ref = s_hat + dropped, s_ref + dropped
    lse_hat = torch.logsumexp(s_hat, -1)
    shift = lse_hat - torch.logsumexp(s_ref, -1)
    if added is None:
        return shift, torch.zeros_like(shift)
    return shift, lse_hat - torch.logsumexp(s_hat + added, -1)


def partition_summary(samples: list[tuple[int, float, float]]) -> dict[str, float | None]:
    """Means over observations ``(layer, shift, predicted)``: ``lp_shift``, ``lp_predicted``,
    ``lp_left`` and ``lp_ratio = Σ predicted / Σ shift`` (None when the shift sums to 0)."""
    keys = ("lp_shift", "lp_predicted", "lp_left", "lp_ratio")
    if not samples:
        return dict.fromkeys(keys)
    shift = sum(s for _, s, _ in samples)
    predicted = sum(p for _, _, p in samples)
    n = len(samples)
    ratio = predicted / shift if shift != 0 else None
    return dict(zip(keys, (shift / n, predicted / n, (shift - predicted) / n, ratio), strict=True))
