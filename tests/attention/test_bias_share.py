"""The attention-error split (jbkv_cli.attention.bias_share) where the answer is known, and its
path through the recorder (fixed seeds; tolerances stated per test)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from jbkv_cli.attention import AttentionRecorder, attend
from jbkv_cli.attention.attend import CachedKV
from jbkv_cli.attention.bias_share import error_summary, error_terms, explained, removed, share
from jbkv_cli.kvcache import ChunkKVCache, KVSpec

G = torch.Generator().manual_seed(7)
HQ, LQ, LC, LCUR, D = 4, 16, 48, 16, 32


def _scores():
    s = 2.0 * torch.randn(1, HQ, LQ, LC + LCUR, generator=G)
    v = torch.randn(1, HQ, LC + LCUR, D, generator=G)
    return s, v


def test_pure_bias_has_share_one():
    """Stored scores that are the exact ones plus the predicted bias: E_bias = E_quant."""
    s, v = _scores()
    bias = 0.3 * torch.rand(1, HQ, LQ, LC, generator=G)
    s_hat = s.clone()
    s_hat[..., :LC] += bias
    eq, eb, el, _ = error_terms(s_hat, s, bias, v)
    assert float(eq.sum()) > 0
    assert abs(share(float(eb.sum()), float(eq.sum())) - 1.0) < 1e-6
    assert torch.allclose(eq, eb, rtol=1e-5)  # per head too
    assert abs(explained(float(el.sum()), float(eq.sum())) - 1.0) < 1e-6


def test_a_prediction_of_the_wrong_sign_is_explained_below_zero():
    """The share compares sizes only: −β reproduces an error as large as β's (share ≈ 1 within
    10 %), but removing it doubles the error, so ``explained`` ≈ 1 − 4 < 0."""
    s, v = _scores()
    bias = 0.05 * torch.rand(1, HQ, LQ, LC, generator=G)
    s_hat = s.clone()
    s_hat[..., :LC] += bias
    eq, eb, el, _ = error_terms(s_hat, s, -bias, v)
    total = float(eq.sum())
    assert abs(share(float(eb.sum()), total) - 1.0) < 0.10
    assert explained(float(el.sum()), total) < -2.5


def test_noise_the_prediction_does_not_see_has_share_near_zero():
    """Zero-mean score noise with a bias-free prediction (β ≈ 0): share ≈ 0 (< 1e-3)."""
    s, v = _scores()
    s_hat = s.clone()
    s_hat[..., :LC] += 0.3 * torch.randn(1, HQ, LQ, LC, generator=G)
    tiny = torch.full((1, HQ, LQ, LC), 1e-4)
    eq, eb, el, _ = error_terms(s_hat, s, tiny, v)
    assert share(float(eb.sum()), float(eq.sum())) < 1e-3
    assert abs(explained(float(el.sum()), float(eq.sum()))) < 1e-2


def test_bias_and_noise_errors_add_to_first_order():
    """Small independent bias and noise: E_quant ≈ E_bias + E_noise (within 10 %), so the
    share is E_bias / (E_bias + E_noise) and lies strictly between 0 and 1."""
    s, v = _scores()
    bias = 0.02 * (1 + torch.rand(1, HQ, LQ, LC, generator=G))
    noise = 0.03 * torch.randn(1, HQ, LQ, LC, generator=G)
    s_hat, s_noise = s.clone(), s.clone()
    s_hat[..., :LC] += bias + noise
    s_noise[..., :LC] += noise
    eq, eb, el, _ = error_terms(s_hat, s, bias, v)
    en, *_ = error_terms(s_noise, s, bias, v)
    total, e_bias, e_noise = float(eq.sum()), float(eb.sum()), float(en.sum())
    assert abs(total - (e_bias + e_noise)) < 0.10 * total
    assert 0.1 < share(e_bias, total) < 0.9
    # removing β leaves the noise's error: explained ≈ the share (within 0.1)
    assert abs(explained(float(el.sum()), total) - share(e_bias, total)) < 0.1


def test_masked_tokens_carry_no_error():
    """A cached token masked (pruned) in all three outputs contributes nothing."""
    s, v = _scores()
    mask = torch.zeros(1, 1, 1, LC + LCUR)
    mask[..., :LC] = -torch.inf  # every cached token dropped: the outputs are the current keys'
    s_hat = s.clone()
    s_hat[..., :LC] += 5.0
    terms = error_terms(s_hat, s, torch.ones(1, HQ, LQ, LC), v, mask, -torch.ones(1, HQ, LQ, LC))
    assert all(float(t.abs().max()) == 0 for t in terms)


def _view(quantize_noise: bool):
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 2, LC, D, generator=g)
    v = torch.randn(1, 2, LC, D, generator=g)
    step = torch.full((1, 2, LC, 2), 0.75).to(torch.float8_e4m3fn).float()
    noise = (torch.rand(k.shape, generator=g) - 0.5) * 0.75 if quantize_noise else 0.0
    view = CachedKV(k + noise, v, step)
    view.k_ref, view.v_ref = k, v
    return view, g


def test_recorder_reports_share_per_layer_head_and_step():
    """Through compare_attention: uniform rounding noise of step Δ on the keys (what the exact
    bias is predicted for) gives a share in (0, 1]; the record keeps layer, head and step."""
    view, g = _view(True)
    q = 2.0 * torch.randn(1, 4, LQ, D, generator=g)
    k_cur, v_cur = torch.randn(1, 2, LCUR, D, generator=g), torch.randn(1, 2, LCUR, D, generator=g)
    rec = AttentionRecorder(max_queries=LQ, every=1)
    for step in range(2):
        rec.observe(q, k_cur, v_cur, view, D**-0.5, "none", layer=1, step=step)
    summary = rec.summary()
    assert 0 < summary["bias_share"] <= 1.0
    assert summary["attn_err_bias"] < summary["attn_err_quant"]
    err = rec.attention_error()
    assert [e[0] for e in err["layers"]] == [1] and len(err["layers"][0][4]) == 4
    assert [c[:3] for c in err["cells"]] == [[1, 0, 1], [1, 1, 1]]
    assert summary["bias_share"] == error_summary(rec.errors)["bias_share"]
    assert summary["bias_explained"] <= 1.0


def test_exact_keys_have_no_share():
    """No rounding noise: the stored keys are exact, E_quant = 0 and the share is None."""
    view, g = _view(False)
    q = torch.randn(1, 4, LQ, D, generator=g)
    k_cur, v_cur = torch.randn(1, 2, LCUR, D, generator=g), torch.randn(1, 2, LCUR, D, generator=g)
    rec = AttentionRecorder(max_queries=LQ, every=1)
    rec.observe(q, k_cur, v_cur, view, D**-0.5, "none", layer=0, step=0)
    assert rec.summary()["bias_share"] is None


def test_removed_is_measured_and_the_share_does_not_bound_it():
    """``E_corr`` is the error of the stored scores with the correction's ``a`` added (1e-6), and
    what the correction removes, ``1 − E_corr/E_quant``, is a measurement of its own: with an
    error correlated with the bias (as the rounding that causes it is) the correction removes
    more than the share of the error the bias alone reproduces."""
    s, v = _scores()
    bias = 0.05 * (1 + torch.rand(1, HQ, LQ, LC, generator=G))
    along = bias * (0.5 + torch.rand(1, HQ, LQ, LC, generator=G))  # an error along the bias
    s_hat, s_left = s.clone(), s.clone()
    s_hat[..., :LC] += bias + along
    s_left[..., :LC] += along
    eq, eb, _, ec = error_terms(s_hat, s, bias, v, added=-bias)
    direct, *_ = error_terms(s_left, s, bias, v)
    assert torch.allclose(ec, direct, rtol=1e-6)
    total = float(eq.sum())
    gone, part = removed(float(ec.sum()), total), share(float(eb.sum()), total)
    assert gone > part + 0.15, (gone, part)  # removes ~0.56 where the share is ~0.36
    assert error_terms(s_hat, s, bias, v)[3] is None  # no correction: nothing measured


def _store(method: str, correction: str, rec: AttentionRecorder | None = None) -> ChunkKVCache:
    g = torch.Generator().manual_seed(11)
    scale = torch.exp(0.5 * torch.randn(D, generator=g))
    k, v = torch.randn(1, 2, 128, D, generator=g) * scale, torch.randn(1, 2, 128, D, generator=g)
    cache = ChunkKVCache(KVSpec.build(method, 2, 32, correction), observer=rec)
    cache.commit(k, v)
    return cache


def _queries():
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 4, LQ, D, generator=g)
    return q, torch.randn(1, 2, LCUR, D, generator=g), torch.randn(1, 2, LCUR, D, generator=g)


@pytest.mark.parametrize("method", ["turboquant-mse", "qvg", "rtn"])
def test_an_uncorrected_variant_is_split_with_its_methods_own_noise_model(method):
    """The share of an uncorrected read predicts with the method's declared noise model (what
    ``signed`` would remove), not taylor's for every method: on the same stored keys and
    queries it equals the ``signed`` read's share (1e-5). QVG's κ is measured at commit for the
    diagnostics without being counted in the bytes."""
    shares = {}
    for correction in ("none", "signed"):
        rec = AttentionRecorder(max_queries=LQ, every=1, noise_model=False)
        cache = _store(method, correction, rec)
        cache.attend(*_queries(), D**-0.5)
        shares[correction] = rec.summary()["bias_share"]
        if correction == "none":
            assert cache.nbytes == _store(method, "none").nbytes  # κ not stored
    assert abs(shares["none"] - shares["signed"]) < 1e-5 * shares["signed"], shares


def test_the_recorder_measures_what_the_correction_removes():
    """``correction_removed`` is 1 − ‖ô_corr − o‖²/‖ô − o‖² with ``ô_corr`` the variant's own
    corrected attention (``attend``) over the stored keys and the exact values, ``ô`` the same
    uncorrected (1e-4): a measurement, not the share."""
    q, k_cur, v_cur = _queries()
    rec = AttentionRecorder(max_queries=LQ, every=1, noise_model=False)
    cache = _store("turboquant-mse", "signed", rec)
    cache.attend(q, k_cur, v_cur, D**-0.5)
    view = cache.read()
    exact_values = replace(view, v=view.v_ref)
    ref = attend(q, k_cur, v_cur, replace(exact_values, k=view.k_ref), scale=D**-0.5,
                 correction="none")  # fmt: skip
    errors = [
        float((attend(q, k_cur, v_cur, exact_values, scale=D**-0.5, correction=c) - ref)
              .square().sum())
        for c in ("none", "signed")
    ]  # fmt: skip
    got = rec.summary()["correction_removed"]
    assert abs(got - (1 - errors[1] / errors[0])) < 1e-4, (got, errors)
    assert got != rec.summary()["bias_share"]
