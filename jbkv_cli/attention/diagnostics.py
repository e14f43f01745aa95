"""Diagnostics of quantized attention (paper §5.3), computed in bounded query blocks.

- ``P_S = Σ_{i ∈ cached} softmax_i``: attention mass on cached tokens; ``ΔP_S = P̂_S − P_S``
  (quantized, corrected as the variant does, minus full precision; same query).
- ``JSD(p̂ ‖ p)`` of attention rows (natural log), and the MSE of attention outputs.
- Token-selection shift (QuantWM's Table 4): the share of queries whose top-1 attended token
  (over ``[cached | current]``) differs from the one they attend most with full precision.
- The noise model itself: cached-score errors ``δ_i = τ q·(k̂_i − k_i)`` against the predicted
  mean 0 and variance ``σ_i² = (τ²/12) Σ_j Δ_ij² ‖q_j‖²``: ``z = δ/σ`` should have mean ≈ 0 and
  variance ≈ 1 if the noise is uniform and independent, as the analysis assumes.
- The bias itself (:mod:`jbkv_cli.attention.partition`): per observed attention call (one
  block of queries of one layer) the shift of the cached log-partition the stored keys cause and
  the shift the active correction predicts (``partition``: ``(layer, shift, predicted)``).

:class:`AttentionRecorder` is an *observer*: hand it to a model's ``generate`` (which hands it to
every layer's :class:`~jbkv_cli.kvcache.ChunkKVCache`), and each cache feeds it every ``every``-th
attention call with the full-precision copy of what it read. Tokens a pruner dropped
(``cached.valid``) are masked in the variant's attention, so ``ΔP_S`` includes the mass
pruning moved off the cache, and are left out of the noise statistics. ``causal=True`` (LLM
prefill) masks, for each recorded query, the current keys after its own position, as
``attend(..., causal=True)`` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
import torch.nn.functional as F

from jbkv_cli.attention.attend import CachedKV, cached_bias, key_mask
from jbkv_cli.attention.bias_share import error_summary, error_terms
from jbkv_cli.attention.correction import (
    Correction,
    _expand_kv_heads,
    get_correction,
    taylor_bias,
)
from jbkv_cli.attention.memory import active_meter
from jbkv_cli.attention.partition import log_partition_shift, partition_summary
from jbkv_cli.attention.rope import KeyRotation, rope_taylor_bias

FALLBACK_FORM = "taylor"  # an uncorrected read without the method's own model (bias_share.py)


class AttentionObserver(Protocol):
    """What a cache calls: ``observe`` every ``every``-th attention call of a layer, with the
    full-precision keys and values of the cached tokens in ``cached.k_ref``/``v_ref``; and, if
    the observer has it, ``committed(layer, k, v)`` at every commit with the chunk's keys and
    values as the cache stores them (keys before RoPE in a pre-RoPE cache; ``layer`` None for a
    cache outside a model's layer stack), e.g.
    :class:`~jbkv_cli.quant.kvquant_calibration.CommitCollector`."""

    every: int

    def observe(
        self,
        q: torch.Tensor,
        k_cur: torch.Tensor,
        v_cur: torch.Tensor,
        cached: CachedKV,
        scale: float,
        correction: Correction,
        layer: int | None = None,
        step: int | None = None,
    ) -> None: ...


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``τ q kᵀ`` in float32 with GQA: ``[B, Hq, Lq, D] × [B, Hkv, Lk, D] -> [B, Hq, Lq, Lk]``."""
    return scale * (q.float() @ _expand_kv_heads(k.float(), q.shape[-3]).transpose(-1, -2))


def attention_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    cached_bias: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax rows ``[B, Hq, Lq, Lk]``, with ``cached_bias [B, Hq, Lq, Lc]`` added to the
    first ``Lc`` scores when given, and ``−inf`` where ``allowed [Lq, Lk]`` is False."""
    s = _scores(q, k, scale)
    if cached_bias is not None:
        s[..., : cached_bias.shape[-1]] += cached_bias
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s.softmax(-1)


def jsd(p: torch.Tensor, r: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Jensen–Shannon divergence of rows (last dim), natural log: ``½ KL(p‖m) + ½ KL(r‖m)``."""
    log_m = torch.log(0.5 * (p + r) + eps)
    kl_p = (p * (torch.log(p + eps) - log_m)).sum(-1)
    kl_r = (r * (torch.log(r + eps) - log_m)).sum(-1)
    return 0.5 * (kl_p + kl_r)


def score_noise(
    q: torch.Tensor,
    k: torch.Tensor,
    k_hat: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rotation=None,
    valid: torch.Tensor | None = None,
    key_rotation: KeyRotation | None = None,
) -> dict[str, float]:
    """Measured cached-score error vs the uniform-noise model (see module docstring), over the
    cached tokens ``valid [B, Hkv, Lc]`` (default: all); ``key_rotation``: keys read from a
    pre-RoPE cache (the noise rotated with them, :mod:`jbkv_cli.attention.rope`)."""
    delta = _scores(q, k_hat.float() - k.float(), scale)  # [B, Hq, Lq, Lc]
    if key_rotation is not None:
        var = 2.0 * rope_taylor_bias(q, step, scale, key_rotation)
    else:
        var = 2.0 * taylor_bias(q, step, scale, rotation)  # (τ²/12) Σ_j Δ_ij² ‖q_j‖²
    ok = var > 0
    held_delta, held_var = delta, var.expand_as(delta)  # every cached token held
    if valid is not None:
        held = _expand_kv_heads(valid[..., None], q.shape[-3]).transpose(-1, -2).to(q.device)
        held = held.expand_as(delta)
        ok = ok & held
        held_delta, held_var = delta[held], held_var[held]
    n = int(ok.sum())
    z = torch.where(ok, delta * var.clamp_min(1e-30).rsqrt(), 0.0)
    z_mean = float(z.sum()) / n if n else 0.0
    z_var = (float(z.square().sum()) - n * z_mean**2) / (n - 1) if n > 1 else 0.0
    count = max(1, held_delta.numel())
    return {
        "mean_error": float(held_delta.sum()) / count,
        "predicted_var": float(held_var.sum()) / count,
        "measured_var": float(held_delta.square().sum()) / count,
        "z_mean": z_mean,
        "z_var": z_var,
    }


def top1_shift(p_hat: torch.Tensor, p_ref: torch.Tensor) -> torch.Tensor:
    """1.0 where a row's most attended token differs between ``p_hat`` and ``p_ref`` (last
    dim; the first of equal maxima), else 0.0: ``[..., Lk] -> [...]``."""
    return (p_hat.argmax(-1) != p_ref.argmax(-1)).float()


@dataclass
class AttentionStats:
    """Per-query statistics of one block of queries against one cache read."""

    p_s: torch.Tensor  # [N] P̂_S (as the variant attends)
    p_s_ref: torch.Tensor  # [N] P_S (full precision)
    jsd: torch.Tensor  # [N]
    out_mse: torch.Tensor  # [N]
    lp_shift: torch.Tensor | None = None  # [N] cached log-partition shift (stored keys)
    lp_predicted: torch.Tensor | None = None  # [N] the part the active correction predicts
    top1_shift: torch.Tensor | None = None  # [N] 1.0 where the top-1 token changed, else 0.0
    # per query head [Hq], summed over the block (attention/bias_share.py): the keys' output
    # error with the stored keys, and with the exact keys plus the predicted bias
    err_quant: torch.Tensor | None = None
    err_bias: torch.Tensor | None = None
    err_left: torch.Tensor | None = None  # ‖softmax(ŝ)V − softmax(s + β)V‖² per head
    err_corr: torch.Tensor | None = None  # ‖softmax(ŝ + a)V − o‖² per head (corrected only)


def compare_attention(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    cached: CachedKV,
    scale: float,
    correction: str | Correction,
    block: int = 128,
    query_index: torch.Tensor | None = None,
) -> AttentionStats:
    """Attention of ``q`` as the variant does it vs with the full-precision cache, per query.

    ``query_index [Lq]``: each query's position in the current chunk, for causal attention (it
    sees the current keys up to that position); None: every query sees every current key."""
    corr = get_correction(correction)
    if cached.k_ref is None:
        raise ValueError("compare_attention needs the full-precision copy (cached.k_ref)")
    lc = cached.num_tokens
    k_hat = torch.cat([cached.k.float(), k_cur.float()], -2)
    v_hat = torch.cat([cached.v.float(), v_cur.float()], -2)
    k_ref = torch.cat([cached.k_ref.float(), k_cur.float()], -2)
    v_ref = torch.cat([cached.v_ref.float(), v_cur.float()], -2)
    v_hat, v_ref = (_expand_kv_heads(t, q.shape[-3]) for t in (v_hat, v_ref))
    partition = corr.quantizes and cached.k_step is not None
    parts: list[list[torch.Tensor]] = [[], [], [], [], [], []]
    shifts: list[torch.Tensor] = []
    errors: list[tuple[torch.Tensor, torch.Tensor]] = []
    for start in range(0, q.shape[-2], block):
        qb = q[..., start : start + block, :].float()
        s_hat, s_ref = _scores(qb, k_hat, scale), _scores(qb, k_ref, scale)
        added = None
        if cached.k_step is not None and corr.active:
            added = corr.sign * cached_bias(qb, cached, scale, corr.form)
            if corr.form == "variance":  # u·ŝ − b
                added = _unshrunk(added, cached.k_unshrink, s_hat[..., :lc])
        dropped = key_mask(cached, qb.float(), lc)
        bias = added
        if dropped is not None:
            bias = dropped if bias is None else bias + dropped
        if partition:  # over the cached keys only: causality masks current keys, not these
            cut = None if dropped is None else dropped[..., :lc]
            shift, predicted = log_partition_shift(s_hat[..., :lc], s_ref[..., :lc], added, cut)
            parts[4].append(shift.flatten())
            parts[5].append(predicted.flatten())
            allowed = _allowed(query_index, start, block, lc, k_hat.shape[-2], q.device)
            terms = _error_terms(qb, s_hat, s_ref, v_ref, cached, scale, corr, added, cut, allowed)
            errors.append(terms)
        if bias is not None:
            s_hat[..., :lc] += bias
        if query_index is not None:
            allowed = _allowed(query_index, start, block, lc, k_hat.shape[-2], q.device)
            s_hat = s_hat.masked_fill(~allowed, float("-inf"))
            s_ref = s_ref.masked_fill(~allowed, float("-inf"))
        p_hat, p_ref = s_hat.softmax(-1), s_ref.softmax(-1)
        o_hat, o_ref = p_hat @ v_hat, p_ref @ v_ref
        parts[0].append(p_hat[..., :lc].sum(-1).flatten())
        parts[1].append(p_ref[..., :lc].sum(-1).flatten())
        parts[2].append(jsd(p_hat, p_ref).flatten())
        parts[3].append((o_hat - o_ref).square().mean(-1).flatten())
        shifts.append(top1_shift(p_hat, p_ref).flatten())
    stats = (torch.cat(p) if p else None for p in parts)
    out = AttentionStats(*stats, top1_shift=torch.cat(shifts))
    if errors:
        out.err_quant, out.err_bias, out.err_left = (sum(e[i] for e in errors) for i in range(3))
        if all(e[3] is not None for e in errors):
            out.err_corr = sum(e[3] for e in errors)
    return out


def _unshrunk(added: torch.Tensor, unshrink: torch.Tensor | None, s_cached: torch.Tensor):
    """``added + (u − 1)·ŝ``: what a signed rule that unshrinks adds to the cached scores
    (``added`` itself when ``u`` is None)."""
    if unshrink is None:
        return added
    u = _expand_kv_heads(unshrink.float(), s_cached.shape[-3]).transpose(-1, -2)
    return added + (u - 1) * s_cached


def _allowed(query_index, start: int, block: int, lc: int, lk: int, device):
    """``[b, Lk]`` bool: the keys each causal query of the block sees (None: not causal)."""
    if query_index is None:
        return None
    last = lc + query_index[start : start + block].to(device)
    return torch.arange(lk, device=device)[None, :] <= last[:, None]


def _error_terms(qb, s_hat, s_ref, v_ref, cached: CachedKV, scale, corr, added, cut, allowed):
    """``(E_quant, E_bias, E_left, E_corr)`` per head of one block
    (:mod:`jbkv_cli.attention.bias_share`): ``β = −added`` under an active correction, else what
    the method's own declared noise model predicts (:func:`declared_bias`); pruned tokens
    (``cut``) and, for causal queries, later keys (``allowed``) masked in all of them."""
    predicted = -added if added is not None else declared_bias(qb, cached, scale, s_hat)
    lk = s_ref.shape[-1]
    mask = None if cut is None else F.pad(cut, (0, lk - cut.shape[-1]))
    if allowed is not None:
        causal = torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, -torch.inf)
        mask = causal if mask is None else mask + causal
    return error_terms(s_hat, s_ref, predicted, v_ref, mask, added)


def declared_bias(qb, cached: CachedKV, scale: float, s_hat: torch.Tensor) -> torch.Tensor:
    """The bias ``β`` the method's own noise model predicts on the cached scores of an
    uncorrected read: what the default ``signed`` rule would remove, ``b − (u − 1)·ŝ`` from the
    view's ``noise_ref`` (``b`` the variance term of its ``w``); the taylor bias of the steps
    when the read carries none (a view built without diagnostics)."""
    if cached.noise_ref is None:
        return cached_bias(qb, cached, scale, FALLBACK_FORM)
    w, u = cached.noise_ref
    model = replace(cached, k_step2=w, k_unshrink=u)
    lc = cached.num_tokens
    return -_unshrunk(-cached_bias(qb, model, scale, "variance"), u, s_hat[..., :lc])


@dataclass
class AttentionRecorder:
    """Collects :class:`AttentionStats` over a generation; ``max_queries`` per call (strided)."""

    max_queries: int = 32
    noise_model: bool = True
    every: int = 2  # observe every n-th attention call of each layer (per cache)
    causal: bool = False  # queries see the current keys up to their own position (LLM prefill)
    stats: list[AttentionStats] = field(default_factory=list)
    noise: list[dict[str, float]] = field(default_factory=list)
    # per observed call (a block of queries of one layer): (layer, shift, predicted), means
    # over the block's queries and heads (jbkv_cli.attention.partition); layer -1 if unknown
    partition: list[tuple[int, float, float]] = field(default_factory=list)
    seconds: float = 0.0  # time spent here, so callers can report generation time without it
    # per observed call of quantized keys (attention/bias_share.py): (layer, step, ΔP_S mean,
    # E_quant per head, E_bias per head, elements per head, E_left per head, E_corr per head or
    # None); step: the read's index since the layer's last commit (a denoising step, or a pass
    # of one), -1 if unknown
    errors: list[tuple] = field(default_factory=list)

    def observe(
        self, q, k_cur, v_cur, cached: CachedKV, scale: float, correction, layer=None, step=None
    ) -> None:
        start = time.perf_counter()
        self._observe(q, k_cur, v_cur, cached, scale, get_correction(correction), layer, step)
        self.seconds += time.perf_counter() - start

    def _observe(
        self, q, k_cur, v_cur, cached: CachedKV, scale: float, corr: Correction, layer, step
    ) -> None:
        stride = max(1, -(-q.shape[-2] // self.max_queries))
        qs = q[..., ::stride, :]
        index = torch.arange(0, q.shape[-2], stride) if self.causal else None
        stats = compare_attention(qs, k_cur, v_cur, cached, scale, corr, query_index=index)
        self.stats.append(stats)
        meter = active_meter()
        if meter is not None:
            meter.observed(qs.shape[-2])
        if stats.err_quant is not None:
            count = stats.p_s.numel() // qs.shape[-3] * v_cur.shape[-1]
            self.errors.append(
                (
                    -1 if layer is None else int(layer),
                    -1 if step is None else int(step),
                    float((stats.p_s - stats.p_s_ref).mean()),
                    stats.err_quant.tolist(),
                    stats.err_bias.tolist(),
                    count,
                    stats.err_left.tolist(),
                    None if stats.err_corr is None else stats.err_corr.tolist(),
                )
            )
        if stats.lp_shift is not None:
            shift, predicted = float(stats.lp_shift.mean()), float(stats.lp_predicted.mean())
            self.partition.append((-1 if layer is None else int(layer), shift, predicted))
        if self.noise_model and cached.k_step is not None and corr.quantizes:
            self.noise.append(
                score_noise(
                    qs,
                    cached.k_ref,
                    cached.k,
                    cached.k_step,
                    scale,
                    cached.rotation,
                    cached.valid,
                    cached.key_rotation,
                )
            )

    def delta_ps(self) -> torch.Tensor:
        """All recorded per-query ``ΔP_S`` values (for histograms)."""
        if not self.stats:
            return torch.zeros(0)
        return torch.cat([s.p_s - s.p_s_ref for s in self.stats])

    def summary(self) -> dict[str, float | None]:
        """Means over every recorded query (None when nothing was recorded)."""
        if not self.stats:
            empty = ("delta_ps", "p_s", "p_s_ref", "jsd", "out_mse", "token_shift")
            return dict.fromkeys(empty)
        cat = {
            f: torch.cat([getattr(s, f) for s in self.stats])
            for f in ("p_s", "p_s_ref", "jsd", "out_mse")
        }
        out = {
            "delta_ps": float((cat["p_s"] - cat["p_s_ref"]).mean()),
            "p_s": float(cat["p_s"].mean()),
            "p_s_ref": float(cat["p_s_ref"].mean()),
            "jsd": float(cat["jsd"].mean()),
            "out_mse": float(cat["out_mse"].mean()),
        }
        shifts = [s.top1_shift for s in self.stats if s.top1_shift is not None]
        out["token_shift"] = float(torch.cat(shifts).mean()) if shifts else None
        if self.noise:
            for key in self.noise[0]:
                out[f"noise_{key}"] = sum(n[key] for n in self.noise) / len(self.noise)
        if self.partition:
            out |= partition_summary(self.partition)
        if self.errors:
            out |= error_summary(self.errors)
        return out

    def attention_error(self) -> dict | None:
        """What a video record keeps of :attr:`errors` (None when nothing was observed), sums
        over observed calls: ``layers`` ``[[layer, E_quant, E_bias, elements, E_quant per head,
        E_bias per head, E_left, E_corr]]`` (``E_corr`` null for a variant without a correction)
        and ``cells`` ``[[layer, step, calls, ΔP_S sum, E_quant, E_bias, E_left]]`` (the
        heatmap's). Lists, not objects: compact, one schema per row."""
        if not self.errors:
            return None
        layers: dict[int, list] = {}
        cells: dict[tuple[int, int], list] = {}
        for layer, step, dps, eq, eb, count, el, ec in self.errors:
            row = layers.setdefault(
                layer, [layer, 0.0, 0.0, 0, [0.0] * len(eq), [0.0] * len(eb), 0.0, 0.0]
            )
            row[6] += sum(el)
            row[7] = None if ec is None or row[7] is None else row[7] + sum(ec)
            row[1] += sum(eq)
            row[2] += sum(eb)
            row[3] += count * len(eq)
            row[4] = [a + b for a, b in zip(row[4], eq, strict=True)]
            row[5] = [a + b for a, b in zip(row[5], eb, strict=True)]
            cell = cells.setdefault((layer, step), [layer, step, 0, 0.0, 0.0, 0.0, 0.0])
            cell[6] += sum(el)
            cell[2] += 1
            cell[3] += dps
            cell[4] += sum(eq)
            cell[5] += sum(eb)
        return {"layers": [layers[k] for k in sorted(layers)], "cells": sorted(cells.values())}
