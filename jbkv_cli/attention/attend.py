"""Attention over ``[cached | current]`` keys with the Jensen-bias correction on cached scores.

One entry point, :func:`attend`, and three backends behind a registry by name:

- ``fused``: the augmented-channel form of the Taylor correction
  (:func:`~jbkv_cli.attention.correction.augment_taylor`, zero-padded to a head dim that is a
  multiple of 8) through SDPA; no ``[Lq, Lk]`` tensor. The signed correction is the same
  bilinear form with other channel values
  (:func:`~jbkv_cli.attention.correction.bilinear_channels`), so it runs the same way.
- ``flex``: FlexAttention with a ``score_mod`` subtracting the Taylor (or signed) bias
  (compiled on CUDA: :func:`~jbkv_cli.attention.kernels.flex_kernel`).
- ``reference``: a dense float mask ``[B, Hq, Lq, Lk]`` through SDPA (tests and tiny shapes).

With none named, :func:`~jbkv_cli.attention.kernels.choose_backend` picks ``fused`` or ``flex``
for the call's device, dtype and widths.

The exact correction (and the bias-only ablation, which *adds* the exact bias) is not a bilinear
form, so every backend computes it with a float mask built one query block at a time
(``masked``), holding at most ``block × Lk`` scores per head. ``correction`` is a name or a
:class:`~jbkv_cli.attention.correction.Correction`.

Keys read from a pre-RoPE cache carry the rotation they got on read (``CachedKV.key_rotation``):
where that changes the bias (the exact form, or steps that split RoPE pairs) attention takes the
``masked`` path with :func:`~jbkv_cli.attention.rope.rope_bias`; per-token groups of whole pairs
keep the post-RoPE Taylor term and every backend (:mod:`jbkv_cli.attention.rope`).

Cached tokens a pruner dropped (``CachedKV.valid`` False) get ``−inf`` in every backend
(:func:`key_mask`, a ``[B, Hq, 1, Lk]`` additive mask, or inside the ``score_mod``), so the
output equals attention over the kept tokens alone; their correction term is irrelevant. A
token held ``m`` times (``CachedKV.copies``) gets ``ln m``: a softmax over ``m`` identical rows
weighs the token ``m · exp(s)``, so the output equals attention over the rows repeated.

``causal=True`` (LLM partial prefill, :mod:`jbkv_cli.llm`): query ``i`` of the current chunk
sees every cached key and the current keys ``0..i`` (a causal mask aligned at the chunk's end,
unlike SDPA's top-left ``is_causal``). The SDPA paths then run :data:`CAUSAL_BLOCK` query rows at
a time over the keys those rows can see (:func:`causal_sdpa`); the only mask is a boolean
``[block, Lc + end]`` one shared by every head, so no ``[Hq, Lq, Lk]`` tensor exists. ``flex``
masks inside its ``score_mod``; ``reference`` folds the causal ``−inf`` into its dense float mask.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from jbkv_cli.attention.correction import (
    CHANNEL_MULTIPLE,
    NO_NOISE_VAR,
    Correction,
    augment_keys,
    augment_queries,
    bilinear_channels,
    build_augmented,
    get_correction,
    group_sq_norms,
    jensen_bias,
)
from jbkv_cli.attention.kernels import choose_backend, flex_kernel
from jbkv_cli.attention.memory import active_meter, shape_of
from jbkv_cli.attention.rope import KeyRotation, needs_pair_terms, rope_bias
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.tensor import DECLARED, QuantizedTensor, signed_terms
from jbkv_cli.utils.host_reads import maybe_any, surely_all


@dataclass
class CachedKV:
    """What attention reads from a cache: dequantized ``k``/``v`` ``[B, Hkv, Lc, D]``.

    ``k_step`` ``[B, Hkv, Lc, G]`` holds the stored key steps Δ (zeros for keys kept in full
    precision; None when no cached key is quantized). ``rotation``: keys were quantized in the
    rotated basis. ``k_ref``/``v_ref``: full-precision copies, present only while diagnostics
    are recorded. ``valid`` ``[B, Hkv, Lc]`` (bool): the tokens a pruner kept for each KV head
    (None: all); attention masks the others. ``k_step2`` ``[B, Hkv, Lc, G]`` and ``k_unshrink``
    ``[B, Hkv, Lc, 1]``: what the variant's signed correction reads (``w``: the keys'
    ``excess_step2``, 12 × their excess variance, or under the ``signed-unshrink`` ablation their
    ``noise_step2``, 12 × the variance of their unshrunk noise; zeros for exact keys; ``u``: the
    ablation's ``unshrink``, None for all ones; both None when not gathered). ``noise_ref``:
    the same pair under the default ``signed`` rule for a variant that does not read it, kept
    for the diagnostics only (the method's own model, :mod:`jbkv_cli.attention.bias_share`).
    ``copies`` ``[B, Hkv, Lc]`` (uint8): how many times each cached token is read (0 where not
    ``valid``; None: once each). ``steps_fp8``: every ``k_step`` is an FP8 E4M3 value by its
    storage format (the exact bias tabulates them without reading them; False: unknown).
    """

    k: torch.Tensor
    v: torch.Tensor
    k_step: torch.Tensor | None = None
    rotation: RandomHadamard | None = None
    k_ref: torch.Tensor | None = None
    v_ref: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    k_step2: torch.Tensor | None = None
    k_unshrink: torch.Tensor | None = None
    key_rotation: KeyRotation | None = None
    copies: torch.Tensor | None = None
    noise_ref: tuple[torch.Tensor, torch.Tensor | None] | None = None
    steps_fp8: bool = False

    @property
    def num_tokens(self) -> int:
        return self.k.shape[-2]

    @classmethod
    def from_quantized(
        cls, k: QuantizedTensor, v: QuantizedTensor, rule: str = DECLARED
    ) -> CachedKV:
        """The view of stored keys and values, with the signed terms of ``rule``
        (:func:`~jbkv_cli.quant.tensor.signed_terms`)."""
        kv = cls(k.dequantize(), v.dequantize(), k.step, k.rotation, steps_fp8=k.steps_fp8)
        if k.step is not None:
            kv.k_step2, kv.k_unshrink = signed_terms(k, k.step.shape[-1], rule)
        return kv

    def unshrunk(self) -> CachedKV:
        """The view with ``k`` multiplied by ``k_unshrink`` (itself when there is none): what the
        signed correction attends with."""
        if self.k_unshrink is None:
            return self
        k = (self.k.float() * self.k_unshrink.to(self.k.device)).to(self.k.dtype)
        return replace(self, k=k, k_unshrink=None)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask=None, causal=False):
    """``softmax(τ q kᵀ + mask) v`` with GQA by head ratio (``causal``: SDPA's ``is_causal``,
    for ``Lq == Lk`` only)."""
    gqa = q.shape[-3] != k.shape[-3]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa, is_causal=causal
    )


CAUSAL_BLOCK = 1024  # query rows per causal SDPA call: a [1024, Lk] boolean mask at a time


def visible(start: int, rows: int, lc: int, lk: int, device=None) -> torch.Tensor:
    """``[rows, lk]`` bool, True where current query ``start + r`` may look: every one of the
    ``lc`` cached keys and the current keys up to its own position."""
    last = lc + start + torch.arange(rows, device=device)
    return torch.arange(lk, device=device)[None, :] <= last[:, None]


def causal_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lc: int,
    scale: float,
    mask: torch.Tensor | None = None,
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    block: int = CAUSAL_BLOCK,
) -> torch.Tensor:
    """Causal attention of the current chunk ``q [.., Lq, D]`` over ``[cached (lc) | current]``
    keys ``k``/``v [.., lc + Lq, D']``, one query block at a time (see the module docstring).

    ``mask``: an additive ``[.., 1, Lk]`` mask on top (pruned tokens). ``augment``: applied to
    each query block (the Taylor form's extra query channels, so no augmented copy of every
    query exists); the output keeps the first ``D`` channels.
    """
    lq, d = q.shape[-2], q.shape[-1]
    out = q.new_empty((*q.shape[:-1], d))
    for start in range(0, lq, block):
        rows = min(block, lq - start)
        end = lc + start + rows
        allowed = visible(start, rows, lc, end, q.device)
        m = allowed if mask is None else mask[..., :end].masked_fill(~allowed, float("-inf"))
        qb = q[..., start : start + rows, :]
        qb = qb if augment is None else augment(qb)
        o = sdpa(qb, k[..., :end, :], v[..., :end, :], scale, m)
        out[..., start : start + rows, :] = o[..., :d]
    return out


def held_log(cached: CachedKV, device) -> torch.Tensor:
    """``[B, Hkv, Lc]`` float32: ``ln m`` of each cached token read ``m`` times (``−inf`` where
    dropped, 0 where read once)."""
    if cached.copies is not None:
        return cached.copies.to(device).float().log()
    drop = torch.zeros(cached.valid.shape, device=device)
    return drop.masked_fill_(~cached.valid.to(device), -torch.inf)


def key_mask(cached: CachedKV | None, q: torch.Tensor, lk: int) -> torch.Tensor | None:
    """Additive ``[B, Hq, 1, Lk]``: ``−inf`` on the cached tokens a pruner dropped, ``ln m`` on
    those held ``m`` times, 0 on the others and on the ``Lk − Lc`` current keys (GQA by head
    ratio); None when every token is held once."""
    if cached is None or cached.valid is None:
        return None
    if cached.copies is None and surely_all(cached.valid):
        return None  # read on a CPU only: elsewhere the mask is all zeros (the same output)
    rep = q.shape[-3] // cached.valid.shape[-2]
    held = held_log(cached, q.device).repeat_interleave(rep, dim=-2)  # [B, Hq, Lc]
    mask = torch.zeros((*held.shape[:-1], 1, lk), dtype=q.dtype, device=q.device)
    mask[..., 0, : held.shape[-1]] = held
    return mask


def cached_bias(q, cached: CachedKV, scale: float, method: str) -> torch.Tensor:
    """The bias ``[..., Hq, Lq, Lc]`` of ``cached``'s keys in ``method`` (``taylor``, ``exact``,
    ``variance``, ``none``), with their rotation or, from a pre-RoPE cache, their RoPE where it
    matters."""
    if needs_pair_terms(cached.k_step, q.shape[-1], cached.key_rotation, method):
        return rope_bias(q, cached.k_step, scale, method, cached.key_rotation, cached.k_step2)
    step2, fp8 = cached.k_step2, cached.steps_fp8
    return jensen_bias(q, cached.k_step, scale, method, cached.rotation, step2, fp8)


def masked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cached: CachedKV,
    scale: float,
    method: str,
    sign: float = -1.0,
    block: int | None = 256,
    causal: bool = False,
) -> torch.Tensor:
    """Attention with ``sign · b`` added to the cached scores via a float mask per query block
    (``causal``: and ``−inf`` on the current keys after each query)."""
    lc, lq = cached.num_tokens, q.shape[-2]
    block = lq if block is None else block
    dropped = key_mask(cached, q, k.shape[-2])
    outs = []
    for start in range(0, lq, block):
        qb = q[..., start : start + block, :]
        bias = sign * cached_bias(qb, cached, scale, method)  # [B, Hq, b, Lc]
        mask = F.pad(bias, (0, k.shape[-2] - lc)).to(q.dtype)
        if dropped is not None:
            mask = mask + dropped
        if causal:
            allowed = visible(start, qb.shape[-2], lc, k.shape[-2], q.device)
            mask = mask.masked_fill(~allowed, float("-inf"))
        kx = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        vx = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        outs.append(sdpa(qb, kx, vx, scale, mask))
    return torch.cat(outs, dim=-2)


def concat_kv(cached: CachedKV, k_cur: torch.Tensor, v_cur: torch.Tensor):
    """``[cached | current]`` keys and values (one copy each)."""
    k = torch.cat([cached.k.to(k_cur.dtype), k_cur], dim=-2)
    v = torch.cat([cached.v.to(v_cur.dtype), v_cur], dim=-2)
    return k, v


def _fused(
    q,
    k_cur,
    v_cur,
    cached: CachedKV,
    scale: float,
    sign: float,
    form="taylor",
    causal=False,
    multiple: int = CHANNEL_MULTIPLE,
) -> torch.Tensor:
    """The fused backend: ``q'``/``k'``/``v'`` with the correction's channels, zero-padded to
    a head dim that is a multiple of ``multiple`` (1: none), through SDPA at the original
    ``scale``; the output is sliced back to ``D``."""
    channels = None
    if form != "taylor":
        channels = bilinear_channels(form, cached.k_step, cached.k_step2, scale, sign)
    if causal:
        ka, va = augment_keys(
            cached.k, cached.v, k_cur, v_cur, cached.k_step, scale, sign, channels, multiple
        )
        groups, rotation = cached.k_step.shape[-1], cached.rotation
        dropped = key_mask(cached, q, ka.shape[-2])
        augment = lambda qb: augment_queries(qb, groups, rotation, multiple)  # noqa: E731
        return causal_sdpa(q, ka, va, cached.num_tokens, scale, dropped, augment)
    qa, ka, va = build_augmented(
        q,
        cached.k,
        cached.v,
        k_cur,
        v_cur,
        cached.k_step,
        scale,
        cached.rotation,
        sign,
        channels,
        multiple,
    )
    return sdpa(qa, ka, va, scale, key_mask(cached, q, ka.shape[-2]))[..., : q.shape[-1]]


def _flex(
    q, k_cur, v_cur, cached: CachedKV, scale: float, sign: float, form="taylor", causal=False
) -> torch.Tensor:
    k, v = concat_kv(cached, k_cur, v_cur)
    groups = cached.k_step.shape[-1]
    rep = q.shape[-3] // k.shape[-3]
    qn2 = group_sq_norms(q, groups, cached.rotation)  # [B, Hq, Lq, G]
    # bias = coef Σ_j ‖q_j‖² d2_ij with d2 = Δ² (taylor) or the keys' w = 12 v (signed)
    d2 = cached.k_step.float().square() if form == "taylor" else cached.k_step2.float()
    coef = sign * scale * scale / 24.0
    lc = cached.num_tokens
    drop = torch.zeros(d2.shape[:-1], device=q.device)  # [B, Hkv, Lc]: −inf where pruned
    if cached.valid is not None:
        drop = held_log(cached, q.device)

    def score_mod(score, b, h, q_idx, kv_idx):
        kv, hk = torch.clamp(kv_idx, max=lc - 1), h // rep
        bias = qn2[b, h, q_idx, 0] * d2[b, hk, kv, 0]
        for j in range(1, groups):  # scalar reads: what a compiled kernel takes
            bias = bias + qn2[b, h, q_idx, j] * d2[b, hk, kv, j]
        score = score + torch.where(kv_idx < lc, coef * bias + drop[b, hk, kv], 0.0)
        if causal:
            score = torch.where(kv_idx - lc > q_idx, -torch.inf, score)
        return score

    flex = flex_kernel(q.device.type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=rep > 1)
    return out


def _reference(
    q, k_cur, v_cur, cached: CachedKV, scale: float, sign: float, form="taylor", causal=False
) -> torch.Tensor:
    k, v = concat_kv(cached, k_cur, v_cur)
    return masked(q, k, v, cached, scale, form, sign, block=None, causal=causal)


BACKENDS: dict[str, Callable[..., torch.Tensor]] = {
    "fused": _fused,
    "flex": _flex,
    "reference": _reference,
}
_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jbkv_attention_backend", default=None
)  # None: choose_backend per call


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """``with attention_backend("reference"):`` makes ``name`` the default inside the block."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {name!r}")
    token = _BACKEND.set(name)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def _choose(q: torch.Tensor, cached: CachedKV) -> str:
    """:func:`~jbkv_cli.attention.kernels.choose_backend` for this call (a pruner's view counts
    as masked, whether or not it dropped a token here)."""
    return choose_backend(
        q.device,
        q.dtype,
        q.shape[-1],
        cached.k_step.shape[-1],
        q_heads=q.shape[-3],
        kv_heads=cached.k.shape[-3],
        masked=cached.valid is not None,
    )


def _check_shapes(q, k_cur, v_cur, cached: CachedKV | None, causal: bool = False) -> None:
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.ndim < 3:
            raise ValueError(f"{name} must be a floating tensor [..., H, L, D]")
    if k_cur.shape != v_cur.shape:
        raise ValueError(f"k_cur {tuple(k_cur.shape)} and v_cur {tuple(v_cur.shape)} differ")
    if q.shape[-1] != k_cur.shape[-1] or q.shape[:-3] != k_cur.shape[:-3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k_cur {tuple(k_cur.shape)} disagree on batch or head dim"
        )
    if q.shape[-3] % k_cur.shape[-3]:
        raise ValueError(
            f"query heads ({q.shape[-3]}) must be a multiple of KV heads ({k_cur.shape[-3]})"
        )
    if causal and q.shape[-2] != k_cur.shape[-2]:
        raise ValueError(
            f"causal attention needs one query per current key, got {q.shape[-2]} queries "
            f"and {k_cur.shape[-2]} current keys"
        )
    if cached is not None:
        want = (*k_cur.shape[:-2], cached.k.shape[-2], k_cur.shape[-1])
        if tuple(cached.k.shape) != want or cached.v.shape != cached.k.shape:
            raise ValueError(
                f"cached k/v {tuple(cached.k.shape)}/{tuple(cached.v.shape)} must be {want}"
            )
        for name in ("valid", "copies"):
            mask = getattr(cached, name)
            if mask is not None and mask.shape != cached.k.shape[:-1]:
                raise ValueError(f"cached.{name} {tuple(mask.shape)} must be {want[:-1]}")
        if cached.copies is not None and cached.valid is None:
            raise ValueError("cached.copies needs cached.valid")
        rot = cached.key_rotation
        if rot is not None and (rot.num_tokens != want[-2] or cached.rotation is not None):
            raise ValueError("cached.key_rotation must cover every cached key, without a rotation")


def attend(
    q: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    cached: CachedKV | tuple[QuantizedTensor, QuantizedTensor] | None = None,
    *,
    scale: float,
    correction: str | Correction = "taylor",
    backend: str | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """``softmax(τ q [k̂_cached | k_cur]ᵀ − b) [v̂_cached | v_cur]`` -> ``[B, Hq, Lq, D]``.

    ``b`` is the Jensen bias (``correction``: ``taylor``, ``exact``, ``signed``, ``none``, or
    ``bias-only``, which adds it) on cached keys whose step Δ is known, 0 on current keys. Keys
    are concatenated cached-first. ``signed`` reads ``cached.k_step2`` (``ValueError`` without it)
    and ``cached.k_unshrink``. ``causal``: query ``i`` sees the current keys ``0..i`` only (needs
    ``Lq`` equal to the current keys; see the module docstring). ``backend`` (for the bilinear
    corrections): a name in :data:`BACKENDS`; None: the enclosing :func:`attention_backend`'s,
    else :func:`~jbkv_cli.attention.kernels.choose_backend`'s for the call. All steps zero
    (Δ = 0, nothing quantized) gives a zero bias; on a CPU it takes the uncorrected path (the
    steps are read there only: :func:`~jbkv_cli.utils.host_reads.maybe_any`).
    """
    corr = get_correction(correction)
    if isinstance(cached, tuple):
        cached = CachedKV.from_quantized(*cached, corr.rule)
    _check_shapes(q, k_cur, v_cur, cached, causal)
    if cached is None or cached.num_tokens == 0:
        return sdpa(q, k_cur, v_cur, scale, causal=causal)
    meter = None if causal else active_meter()
    shape = None if meter is None else shape_of(q, k_cur, cached)
    if cached.k_step is None or not corr.active or not maybe_any(cached.k_step):
        if meter is not None:
            meter.add(shape, "plain", None)
        lk = cached.num_tokens + k_cur.shape[-2]
        mask = key_mask(cached, q, lk)
        if causal:
            return causal_sdpa(q, *concat_kv(cached, k_cur, v_cur), cached.num_tokens, scale, mask)
        return sdpa(q, *concat_kv(cached, k_cur, v_cur), scale, mask)
    if corr.form == "variance":
        if cached.k_step2 is None or cached.k_step2.shape != cached.k_step.shape:
            raise ValueError(NO_NOISE_VAR)
        cached = cached.unshrunk()  # scores u·τ q·k̂ (centroid-type keys), then subtract b
    if corr.form == "exact" or needs_pair_terms(
        cached.k_step, q.shape[-1], cached.key_rotation, corr.form
    ):
        if meter is not None:
            exact = corr.form == "exact"
            meter.add(shape_of(q, k_cur, cached, exact) if exact else shape, "masked", corr.form)
        kv = concat_kv(cached, k_cur, v_cur)
        return masked(q, *kv, cached, scale, corr.form, corr.sign, causal=causal)
    name = backend or _BACKEND.get() or _choose(q, cached)
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {name!r}")
    if meter is not None:
        meter.add(shape, name, corr.form)
    return BACKENDS[name](q, k_cur, v_cur, cached, scale, corr.sign, corr.form, causal)
