"""Where the attention error of quantized keys comes from: the bias, or the rounding noise.

In the pass where diagnostics observe a cache read (:mod:`jbkv_cli.attention.diagnostics`), two
attention outputs are compared with the full-precision one ``o = softmax(s) V``, with the exact
values ``V`` in all three (so the split is of the *keys'* error; the values' own error is in
``out_mse``):

- ``E_quant = ‖softmax(ŝ) V − o‖²``: the stored keys' scores ``ŝ = τ q·k̂``, uncorrected;
- ``E_bias  = ‖softmax(s + β) V − o‖²``: the exact scores with the *predicted* bias ``β`` added
  to the cached ones (the ``bias-only`` ablation at the attention level).

``β`` is the shift the variant's correction would remove (``−a``, ``a`` what it adds: the taylor
or exact ``b``, or signed's ``b − (u − 1)ŝ``) and, for an uncorrected variant, the paper's
second-order (taylor) bias of the stored steps (``diagnostics.PREDICTED_FORM``). Choice: the
end-to-end ``bias-only`` ablation injects the exact form, but its table per query block cost
0.17 s of diagnostics per embedded-model video against 0.02 s for taylor (measured on 1 core),
and the diagnostics run in every test run; an exact-corrected variant is split with the exact
form, so the two can be compared on the same quantizer. The **bias share** ``Σ E_bias / Σ E_quant``
(sums over queries, heads, channels and observed calls) is the part of the keys' attention error
that the predicted bias alone reproduces: about 1 when the score error is the bias, about 0 when
it is rounding noise the bias does not describe. It bounds what any bias correction can recover
before a sweep is run; above 1 the prediction overshoots the error it is meant to explain. The
two errors add only to first order (``E_quant ≈ E_bias + E_noise`` for small independent score
perturbations; tested), so the share is a ratio of errors, not an exact partition.

The share compares sizes, not directions: a prediction of the wrong sign (taylor's ``+b`` on a
centroid-type quantizer whose stored keys *under*-state the partition sum) reproduces an error as
large as the right one. So beside it, **bias explained** ``1 − Σ E_left / Σ E_quant`` with
``E_left = ‖softmax(ŝ)V − softmax(s + β)V‖²`` — to first order the error left after removing
``β`` from the stored scores: 1 for a score error that is ``β``, about the share for ``β`` plus
independent noise, and below 0 when removing ``β`` would make the output worse.

Tokens a pruner dropped are masked in all three outputs (the split is of quantization, not of
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(E_quant, E_bias, E_left)`` per query head ``[Hq]`` (summed over batch, queries,
    channels); ``E_left = Σ‖softmax(ŝ)V − softmax(s + β)V‖²``.

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

    return per_head(o_hat - o_ref), per_head(o_bias - o_ref), per_head(o_hat - o_bias)


def share(e_bias: float, e_quant: float) -> float | None:
    """``E_bias / E_quant`` (None when the stored keys cause no error)."""
    return e_bias / e_quant if e_quant > 0 else None


def explained(e_left: float, e_quant: float) -> float | None:
    """``1 − E_left / E_quant`` (None when the stored keys cause no error)."""
    return 1.0 - e_left / e_quant if e_quant > 0 else None


def error_summary(samples: list[tuple]) -> dict[str, float | None]:
    """A video's means over observed calls ``(layer, step, ΔP_S, E_quant[h], E_bias[h], n,
    E_left[h])``: ``bias_share`` (``Σ E_bias / Σ E_quant``), ``bias_explained`` (``1 − Σ E_left /
    Σ E_quant``) and the mean squared errors per output element, ``attn_err_quant`` and
    ``attn_err_bias``."""
    e_quant = sum(sum(s[3]) for s in samples)
    e_bias = sum(sum(s[4]) for s in samples)
    e_left = sum(sum(s[6]) for s in samples)
    count = sum(s[5] * len(s[3]) for s in samples)
    return {
        "bias_share": share(e_bias, e_quant),
        "bias_explained": explained(e_left, e_quant),
        "attn_err_quant": e_quant / count if count else None,
        "attn_err_bias": e_bias / count if count else None,
    }
