"""Where the attention error of quantized keys comes from, and what a correction removes of it.

In the pass where diagnostics observe a cache read (:mod:`jbkv_cli.attention.diagnostics`),
attention outputs are compared with the full-precision one ``o = softmax(s) V``, with the exact
values ``V`` in all of them (so these are the *keys'* errors; the values' own error is in
``out_mse``):

- ``E_quant = ‖softmax(ŝ) V − o‖²``: the stored keys' scores ``ŝ = τ q·k̂``, uncorrected;
- ``E_corr  = ‖softmax(ŝ + a) V − o‖²``: the same scores with what the variant's correction adds
  (``a``: ``−b`` for taylor or exact, ``(u − 1)ŝ − b`` for a signed rule), on the same calls;
- ``E_bias  = ‖softmax(s + β) V − o‖²``: the exact scores with the *predicted* bias ``β`` added
  to the cached ones (the ``bias-only`` ablation at the attention level).

**What the correction removes**, ``1 − Σ E_corr / Σ E_quant`` (``correction_removed``; sums over
queries, heads, channels and observed calls), is measured: the stored keys' attention-output
error with and without the correction. Below 0 the correction adds error. It is None for a
variant without a correction.

``β`` is the shift the variant's correction would remove (``−a``) and, for an uncorrected
variant, what the method's own declared noise model predicts: the shift the default ``signed``
correction would remove (from the read's ``noise_ref``, :mod:`jbkv_cli.quant.noise`; mixed
noise is measured at commit for the diagnostics without being stored), so TurboQuant-MSE's
uncorrected share is split with its centroid model, not with taylor's additive one; taylor's
``b`` only where a read carries no model (``diagnostics.FALLBACK_FORM``). Choice: the end-to-end
``bias-only`` ablation injects the exact form, but its table per query block costs 0.17 s of
diagnostics per embedded-model video against 0.02 s for a bilinear form (measured on 1 core),
and the diagnostics run in every test run; an exact-corrected variant is split with the exact
form.

The **bias share** ``Σ E_bias / Σ E_quant`` is the share of the stored keys' attention error that
the predicted bias alone reproduces: about 1 when the score error is the bias, about 0 when it
is rounding noise the bias does not describe, above 1 when the prediction overshoots the error
it is meant to explain. It compares error sizes; it is not a bound on what a correction removes:
the two errors add only to first order (``E_quant ≈ E_bias + E_noise`` for small independent
score perturbations; tested), and rounding whose error runs along the bias (as the rounding that
causes the bias does) makes ``E_quant`` larger than that sum, so a correction can remove more
than the share (tested; docs/report.md has it measured on the embedded model).

The share compares sizes, not directions: a prediction of the wrong sign (taylor's ``+b`` on a
centroid-type quantizer whose stored keys *under*-state the partition sum) reproduces an error as
large as the right one. So beside it, **bias explained** ``1 − Σ E_left / Σ E_quant`` with
``E_left = ‖softmax(ŝ)V − softmax(s + β)V‖²`` — a first-order estimate of what removing ``β``
would remove: 1 for a score error that is ``β``, about the share for ``β`` plus independent
noise, and below 0 when removing ``β`` would make the output worse.

Tokens a pruner dropped are masked in every output (the split is of quantization, not of
pruning); causal masking follows the variant's.
"""

from __future__ import annotations

import torch


def _out(scores: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is not None:
        scores = scores + mask
    return scores.softmax(-1) @ v


def error_terms(
    s_hat: torch.Tensor,
    s_ref: torch.Tensor,
    predicted: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    added: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(E_quant, E_bias, E_left, E_corr)`` per query head ``[Hq]`` (summed over batch,
    queries, channels); ``E_left = Σ‖softmax(ŝ)V − softmax(s + β)V‖²``, ``E_corr =
    Σ‖softmax(ŝ + a)V − o‖²`` with ``a = added``, what the variant's correction adds to the
    cached scores (None when it adds nothing: then ``E_corr`` is None).

    ``s_hat``/``s_ref``: stored and exact scores ``[..., Hq, Lq, Lk]`` (float32, cached first);
    ``predicted``: the predicted bias on the cached scores ``[..., Hq, Lq, Lc]``; ``v``: the exact
    values ``[..., Hq, Lk, Dv]``; ``mask``: additive, broadcastable to the scores (pruning,
    causality)."""
    lc = predicted.shape[-1]
    o_ref = _out(s_ref, v, mask)
    o_hat = _out(s_hat, v, mask)
    s_bias = s_ref.clone()
    s_bias[..., :lc] += predicted
    o_bias = _out(s_bias, v, mask)
    heads = s_ref.shape[-3]

    def per_head(x: torch.Tensor) -> torch.Tensor:
        return x.square().movedim(-3, 0).reshape(heads, -1).sum(-1)

    e_corr = None
    if added is not None:
        s_corr = s_hat.clone()
        s_corr[..., :lc] += added
        e_corr = per_head(_out(s_corr, v, mask) - o_ref)
    return per_head(o_hat - o_ref), per_head(o_bias - o_ref), per_head(o_hat - o_bias), e_corr


def share(e_bias: float, e_quant: float) -> float | None:
    """``E_bias / E_quant`` (None when the stored keys cause no error)."""
    return e_bias / e_quant if e_quant > 0 else None


def explained(e_left: float, e_quant: float) -> float | None:
    """``1 − E_left / E_quant`` (None when the stored keys cause no error)."""
    return 1.0 - e_left / e_quant if e_quant > 0 else None


def removed(e_corr: float, e_quant: float) -> float | None:
    """``1 − E_corr / E_quant``: the share of the stored keys' attention error the correction
    removes (None when the stored keys cause no error)."""
    return 1.0 - e_corr / e_quant if e_quant > 0 else None


def error_summary(samples: list[tuple]) -> dict[str, float | None]:
    """A video's means over observed calls ``(layer, step, ΔP_S, E_quant[h], E_bias[h], n,
    E_left[h], E_corr[h] or None)``: ``bias_share`` (``Σ E_bias / Σ E_quant``),
    ``bias_explained`` (``1 − Σ E_left / Σ E_quant``), ``correction_removed`` (``1 − Σ E_corr /
    Σ E_quant``, None for a variant without a correction) and the mean squared errors per output
    element, ``attn_err_quant``, ``attn_err_bias`` and ``attn_err_corrected``."""
    e_quant = sum(sum(s[3]) for s in samples)
    e_bias = sum(sum(s[4]) for s in samples)
    e_left = sum(sum(s[6]) for s in samples)
    corrected = all(len(s) > 7 and s[7] is not None for s in samples)
    e_corr = sum(sum(s[7]) for s in samples) if corrected else None
    count = sum(s[5] * len(s[3]) for s in samples)
    return {
        "bias_share": share(e_bias, e_quant),
        "bias_explained": explained(e_left, e_quant),
        "correction_removed": None if e_corr is None else removed(e_corr, e_quant),
        "attn_err_quant": e_quant / count if count else None,
        "attn_err_bias": e_bias / count if count else None,
        "attn_err_corrected": e_corr / count if count and e_corr is not None else None,
    }
