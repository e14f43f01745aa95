"""The signed correction against a Monte Carlo of every method's real rounding.

Each draw (its own seed for the keys and for the method's rotation, sketch or k-means init)
stores two chunks of seeded Gaussian keys (per-channel scales, as real keys have) through
a :class:`ChunkKVCache` with the method itself (its ``quantize``: codes, scales, codebooks, the
QVG measurement at commit) and attends with queries of the same channel scales; the recorder
measures the cached log-partition shift the stored keys cause and what each correction leaves
(:mod:`jbkv_cli.attention.partition`). Means over ``DRAWS`` fixed seeds, paired per draw.

Tolerances (stated once, used below), at INT2 where the noise is largest and a second-order
correction is least accurate: the uncorrected shift is at least ``SIGNIFICANT`` standard errors
from 0; where the noise model is declared (additive, centroid) ``signed`` leaves at most
``TOLERANCE`` of it (taylor, which it equals on additive noise, leaves 10–35% here: the covering
grid's outward rounding and terms beyond second order), and on TurboQuant-MSE, whose shift taylor
makes worse, at most ``CENTROID_TOLERANCE``. Mixed noise (QVG's dead zone) is measured, and on
these Gaussian keys the second order describes it poorly (the exact per-query second-order term
over-predicts the shift by ~75%, the per-group measurement under-predicts it): the test asks what
the issue asks, that ``signed`` fixes taylor's sign error (it never pushes the shift past 0) and
leaves less than taylor does. ``docs/corrections.md`` has the same on the embedded model's keys.
"""

from __future__ import annotations

import functools
from dataclasses import fields

import pytest
import torch

from jbkv_cli.attention import AttentionRecorder, attend
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import METHODS, quantize_kv
from jbkv_cli.quant.noise import NOISE_MODELS

DRAWS = 16
SIGNIFICANT = 4.0
TOLERANCE = 0.4
CENTROID_TOLERANCE = 0.2
D, HEADS, CHUNK, QUERIES, TAU = 64, 1, 128, 32, 1 / 8


def _draw(seed: int):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(D, generator=g) * 0.5)

    def keys(n):
        return torch.randn(1, HEADS, n, D, generator=g) * scale

    chunks = [(keys(CHUNK), torch.randn(1, HEADS, CHUNK, D, generator=g)) for _ in range(2)]
    q = torch.randn(1, HEADS, QUERIES, D, generator=g) * scale * 0.5
    return chunks, q, keys(QUERIES), torch.randn(1, HEADS, QUERIES, D, generator=g)


@functools.cache
def _shifts(method: str, correction: str) -> torch.Tensor:
    """``[DRAWS, 2]``: (shift, left) of the last observed call per draw."""
    out = []
    for seed in range(DRAWS):
        chunks, q, k_cur, v_cur = _draw(seed)
        rec = AttentionRecorder(max_queries=QUERIES, noise_model=False, every=1)
        # a method's own randomness (rotation, sketch, k-means init) is drawn too
        seeded = {"seed": seed} if "seed" in {f.name for f in fields(METHODS[method])} else {}
        spec = KVSpec.build(method, 2, 32, correction, **seeded)
        cache = ChunkKVCache(spec, observer=rec)
        for k, v in chunks:  # the second commit sees a query history (QuantWM's PSAC)
            cache.commit(k, v)
            cache.attend(q, k_cur, v_cur, TAU)
        _, shift, predicted = rec.partition[-1]
        out.append((shift, shift - predicted))
    return torch.tensor(out, dtype=torch.float64)


def _mean_se(x: torch.Tensor) -> tuple[float, float]:
    return float(x.mean()), float(x.std() / x.numel() ** 0.5)


@pytest.mark.parametrize("method", list(METHODS))
def test_signed_leaves_little_of_the_shift_each_method_causes(method):
    shift, se = _mean_se(_shifts(method, "none")[:, 0])
    taylor = float(_shifts(method, "taylor")[:, 1].mean())
    left = float(_shifts(method, "signed")[:, 1].mean())
    assert abs(shift) > SIGNIFICANT * se, (method, shift, se)
    if METHODS[method].noise_model == "mixed":
        assert left * shift > 0 > taylor * shift, (method, shift, left, taylor)  # sign fixed
        assert abs(left) < min(abs(shift), abs(taylor)), (method, shift, left, taylor)
    else:
        assert abs(left) <= TOLERANCE * abs(shift), (method, shift, left)


def test_signed_is_taylor_on_additive_noise_and_fixes_turboquant_mse():
    for method in ("rtn", "quarot"):  # uniform additive noise: taylor's operations exactly
        assert torch.equal(_shifts(method, "taylor")[:, 1], _shifts(method, "signed")[:, 1])
    prod = [_shifts("turboquant-prod", c)[:, 1] for c in ("taylor", "signed")]
    assert torch.allclose(*prod, atol=1e-5)  # its step is √(12 σ²): equal up to rounding
    shift = float(_shifts("turboquant-mse", "none")[:, 0].mean())
    taylor = float(_shifts("turboquant-mse", "taylor")[:, 1].mean())
    signed = float(_shifts("turboquant-mse", "signed")[:, 1].mean())
    assert shift < 0  # centroid type: the stored keys under-state the partition sum
    assert abs(taylor) > abs(shift)  # subtracting b pushes the wrong way
    assert abs(signed) <= CENTROID_TOLERANCE * abs(shift), (shift, signed)


def test_every_method_declares_its_noise_model_next_to_its_step():
    x = torch.randn(1, 1, 128, D, generator=torch.Generator().manual_seed(1))
    for name, cls in METHODS.items():
        assert cls.noise_model in NOISE_MODELS, name
        stored = quantize_kv(x, 2, 32, name)
        assert stored.noise_model == cls.noise_model, name
        assert stored.noise_model != "additive (assumed)", f"{name} does not declare its model"


def test_mixed_noise_needs_its_measurement():
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(1, 1, 128, D, generator=g), torch.randn(1, 1, 128, D, generator=g)
    q = torch.randn(1, 1, 8, D, generator=g)
    stored = (quantize_kv(k, 2, 32, "qvg"), quantize_kv(v, 2, 32, "qvg"))
    with pytest.raises(ValueError, match="mixed noise"):
        attend(q, k[..., :8, :], v[..., :8, :], stored, scale=TAU, correction="signed")
    plain = ChunkKVCache(KVSpec.build("qvg", 2, 32, "taylor"))
    signed = ChunkKVCache(KVSpec.build("qvg", 2, 32, "signed"))
    for cache in (plain, signed):
        cache.commit(k, v)
    # κ: one FP8 byte per (chunk, batch, head) and key group, counted
    assert signed.nbytes - plain.nbytes == 1 * 1 * (D // 32)
    assert signed.read().k_step2 is not None and plain.read().k_step2 is None


@pytest.mark.parametrize("method", ["rtn", "qvg", "turboquant-mse"])
def test_every_backend_computes_the_same_signed_attention(method):
    """The fused channels, FlexAttention's score_mod and the dense mask agree (GQA 4 over 2
    heads), and on additive keys signed attention is taylor's exactly."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 16, D, generator=g)
    k, v = torch.randn(1, 2, 128, D, generator=g), torch.randn(1, 2, 128, D, generator=g)
    cache = ChunkKVCache(KVSpec.build(method, 2, 32, "signed"))
    cache.commit(k, v)
    cur = (torch.randn(1, 2, 16, D, generator=g), torch.randn(1, 2, 16, D, generator=g))
    outs = [cache.attend(q, *cur, TAU, backend=b) for b in ("fused", "flex", "reference")]
    assert torch.allclose(outs[0], outs[2], atol=2e-6) and torch.allclose(
        outs[1], outs[2], atol=2e-6
    )
    if method == "rtn":
        taylor = attend(q, *cur, cache.read(), scale=TAU, correction="taylor")
        assert torch.equal(outs[0], taylor)


def _isotropic_draw(seed: int):
    """Two chunks of unit-variance Gaussian keys and values, queries, current keys and values."""
    g = torch.Generator().manual_seed(seed)
    chunks = [tuple(torch.randn(1, HEADS, CHUNK, D, generator=g) for _ in range(2)) for _ in "ab"]
    q, k_cur, v_cur = (torch.randn(1, HEADS, QUERIES, D, generator=g) for _ in range(3))
    return chunks, q, k_cur, v_cur


def test_on_isotropic_keys_the_excess_rule_costs_no_error_and_unshrinking_does():
    """TurboQuant-MSE on isotropic Gaussian keys (16 draws, as above but unit channel scales):
    both rules leave at most 10% of the shift, but the unshrink rule scales the stored keys'
    noise by 1/(1 − ρ) and adds to the keys' attention-output error (removed < −0.1; measured
    −0.24 ± 0.03), while the excess rule costs none (removed > −0.01; measured −0.000 ± 0.002).
    On the embedded model's keys, which have a mean and correlated channels, the unshrink rule
    removes more (docs/corrections.md): ``signed`` reads it there."""
    out = {}
    for correction in ("none", "signed-excess", "signed-unshrink"):
        shift, left, removed = [], [], []
        for seed in range(DRAWS):
            chunks, q, k_cur, v_cur = _isotropic_draw(seed)
            rec = AttentionRecorder(max_queries=QUERIES, noise_model=False, every=1)
            spec = KVSpec.build("turboquant-mse", 2, 32, correction, seed=seed)
            cache = ChunkKVCache(spec, observer=rec)
            for k, v in chunks:
                cache.commit(k, v)
                cache.attend(q, k_cur, v_cur, TAU)
            _, s, predicted = rec.partition[-1]
            shift.append(s)
            left.append(s - predicted)
            summary = rec.summary()
            removed.append(summary["correction_removed"] or 0.0)
        out[correction] = [sum(x) / DRAWS for x in (shift, left, removed)]
    shift = out["none"][0]
    for rule in ("signed-excess", "signed-unshrink"):
        assert abs(out[rule][1]) <= 0.1 * abs(shift), (rule, out)
    assert out["signed-excess"][2] > -0.01 and out["signed-unshrink"][2] < -0.1, out
