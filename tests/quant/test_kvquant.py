"""KVQuant (after arXiv 2401.18079, SqueezeAILab/KVQuant@57a23835 ``quant/``): the source's rules
stated by hand on small tensors (thresholds, normalisation, dense-and-sparse outliers, NUQ
k-means, per-token value ranges, first tokens, Q-Norm), the bytes counted from the stored
tensors, causality in the cache, the round-trip bound and the noise the corrections read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from jbkv_cli.attention.rope import KeyRotation, needs_pair_terms
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.models.contract import resolve_spec
from jbkv_cli.models.tiny.model import TinyConfig, key_rope
from jbkv_cli.quant import build_method
from jbkv_cli.quant.kvquant import KVQuant, KVQuantTensor, threshold
from jbkv_cli.quant.nuq import (
    cell_variance,
    encode,
    fit_codebook,
    lower_count,
    percentile,
    upper_count,
)
from jbkv_cli.quant.tensor import CENTROID, MIXED
from jbkv_cli.utils.errors import UsageError


def _x(tokens=200, dim=32, heads=2, seed=0, dtype=torch.bfloat16):
    """Heavy-tailed entries (Student t, 3 dof: a seeded normal over the root mean square of
    three) with channels of different scales and offsets; bf16 by default (exact entries are
    then copied bit for bit), float32 where a rule needs distinct values (bf16 has ties)."""
    g = torch.Generator().manual_seed(seed)
    num = torch.randn(1, heads, tokens, dim, generator=g)
    den = torch.randn(3, 1, heads, tokens, dim, generator=g).square().mean(0).sqrt()
    scale = torch.exp(torch.randn(dim, generator=g) * 0.5)
    return (num / den * scale + torch.randn(dim, generator=g)).to(dtype)


def _z(stored: KVQuantTensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The coded tokens ``y`` of ``x`` normalised by the stored ranges, ``(y − (u + l)/2) /
    ((u − l)/2)``, and the stored outlier mask."""
    y = x[..., stored.first.shape[-2] :, :].float()
    upper, lower = stored.split.upper.float(), stored.split.lower.float()
    return (y - (upper + lower) / 2) / ((upper - lower) / 2), stored.outlier_mask()


# --- the source's rules --------------------------------------------------------------------------


def test_threshold_is_one_minus_half_the_outlier_fraction():
    """``t = 1 − (1 − s)/2`` with ``s = 1 − f`` (SimQuant.quantize): 1% -> the 0.5/99.5
    percentiles; 0 -> min-max."""
    assert threshold(0.01) == pytest.approx(0.995) and threshold(0.0) == 1.0


def test_percentile_counts_and_interpolation_match_numpy():
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 7, 100, 254, 1000):
        x = torch.randn(n, generator=g)
        for t in (0.995, 0.9, 0.75, 1.0):
            hi, lo = np.percentile(x.numpy(), 100 * t), np.percentile(x.numpy(), 100 * (1 - t))
            assert upper_count(n, t) == int((x.numpy() > hi).sum()), (n, t)
            assert lower_count(n, t) == int((x.numpy() < lo).sum()), (n, t)
            assert float(percentile(x.sort().values, t)) == pytest.approx(hi, rel=1e-5, abs=1e-6)


def test_key_outliers_are_the_entries_beyond_the_per_channel_percentiles():
    """Keys (get_outliers with calibrated thresholds): per channel, over tokens, ``y > u_c`` or
    ``y < l_c`` with ``u, l`` the 99.5 / 0.5 percentiles; the stored thresholds cover them."""
    x = _x(dtype=torch.float32)  # distinct values: no tie at a percentile
    y = x.numpy()
    stored = KVQuant(2).quantize(x, "key")
    upper = np.percentile(y, 99.5, axis=-2, keepdims=True)
    lower = np.percentile(y, 0.5, axis=-2, keepdims=True)
    want = (y > upper) | (y < lower)
    _, mask = _z(stored, x)
    assert np.array_equal(mask.numpy(), want)
    assert (stored.split.upper.float().numpy() >= upper - 1e-6 * np.abs(upper)).all()
    assert (stored.split.lower.float().numpy() <= lower + 1e-6 * np.abs(lower)).all()
    assert stored.split.upper.dtype == torch.float16 and stored.split.upper.shape == (1, 2, 1, 32)


def test_value_outliers_and_ranges_are_per_token():
    """Values (get_outliers_dynamic, quant_fn_nuq_recon): per token over its channels of every
    head (the source's ``v_proj`` row), ``y ≥ q_t`` or ``y ≤ q_{1−t}`` (torch.quantile); the
    range is the max and min of the token with its outliers replaced by its median."""
    x = _x(dim=64, dtype=torch.float32)  # distinct values: no tie at a quantile
    rows = x.transpose(1, 2).flatten(-2)  # [1, L, H·D]
    stored = KVQuant(2).quantize(x, "value")
    t = threshold(0.01)
    want = (rows >= torch.quantile(rows, t, dim=-1, keepdim=True)) | (
        rows <= torch.quantile(rows, 1 - t, dim=-1, keepdim=True)
    )
    assert int(want.sum()) == 2 * 200  # the max and min of each token's 128 channels
    _, mask = _z(stored, x)
    assert torch.equal(mask.transpose(1, 2).flatten(-2), want)
    median = rows.median(dim=-1, keepdim=True).values
    trimmed = torch.where(want, median, rows)
    top, bottom = trimmed.amax(-1, keepdim=True), trimmed.amin(-1, keepdim=True)
    up, lo = stored.split.upper.float()[:, 0], stored.split.lower.float()[:, 0]
    assert (up >= top).all() and (lo <= bottom).all()
    assert torch.allclose(up, top, rtol=2e-3) and torch.allclose(lo, bottom, rtol=2e-3)
    assert stored.split.upper.shape == (1, 1, 200, 1)  # one range per token, all heads


@pytest.mark.parametrize("role", ["key", "value"])
def test_non_outliers_are_normalised_into_minus_one_one(role):
    """``z = (y − (u + l)/2) / ((u − l)/2)``: every non-outlier within [−1, 1]."""
    x = _x()
    z, mask = _z(KVQuant(2).quantize(x, role), x)
    assert z[~mask].abs().max() <= 1 + 1e-6
    assert z[~mask].abs().max() > 0.9  # the range is the data's, not a loose bound


@pytest.mark.parametrize("role", ["key", "value"])
def test_outliers_and_first_tokens_are_kept_exact_with_zero_step(role):
    x = _x()
    stored = KVQuant(2, first_tokens=3).quantize(x, role)
    out = stored.dequantize()
    assert out.dtype == x.dtype and torch.equal(out[..., :3, :], x[..., :3, :])
    _, mask = _z(stored, x)
    body, got = x[..., 3:, :], out[..., 3:, :]
    assert torch.equal(got[mask], body[mask])  # copied: bf16 kept as bf16
    step = stored.step
    assert (step[..., :3, :] == 0).all() and (step[..., 3:, :][mask] == 0).all()
    assert (step[..., 3:, :][~mask] > 0).all()
    assert stored.split.value.dtype == torch.bfloat16 and stored.first.dtype == torch.bfloat16


def test_lloyd_in_one_dimension_by_hand():
    """Three clear groups, k = 3: the centroids are the group means; a weight of 0 leaves an
    entry out; codes are the nearest centroid (a tie goes to the lower one)."""
    x = torch.tensor([[0.0, 0.25, 0.5, 1.0, 1.5, 5.0, 5.5, 100.0]])
    w = torch.tensor([[1.0, 1, 1, 1, 1, 1, 1, 0]])  # 100 is an outlier
    c = fit_codebook(x, w, 3, iters=50)
    assert torch.equal(c, torch.tensor([[0.25, 1.25, 5.25]]))  # dyadic: exact
    assert encode(torch.tensor([[0.75, 0.76, 3.25, 100.0]]), c).tolist() == [[0, 1, 1, 2]]
    var = cell_variance(x, w, c)
    assert torch.allclose(var, torch.tensor([[0.125 / 3, 0.0625, 0.0625]]), atol=1e-7)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_codebook_has_two_to_the_bits_centroids_meeting_the_centroid_condition(bits):
    """NUQ: ``2^b`` centroids from k-means over the non-outlier normalised values, pooled over
    heads, tokens and channels; after 50 rounds each centroid is the mean of what it codes
    (up to its FP16 rounding) and the stored cell variances are the coded entries' errors."""
    x = _x(tokens=256, dtype=torch.float32)
    stored = KVQuant(bits).quantize(x, "key")
    book = stored.codebook.float()[0]
    assert stored.codebook.shape == (1, 1 << bits) and stored.codebook.dtype == torch.float16
    assert (book.diff() > 0).all()
    z, mask = _z(stored, x)
    codes = encode(z.reshape(1, -1), stored.codebook).reshape(z.shape)
    assert torch.equal(codes.long(), stored.indices())
    for j in range(1 << bits):
        cell = z[(codes == j) & ~mask]
        assert cell.numel() > 0
        assert float(cell.mean()) == pytest.approx(float(book[j]), abs=2e-3 * max(1, abs(book[j])))
        err = (cell - book[j]).square().mean()
        assert float(stored.cell_var.float()[0, j]) == pytest.approx(float(err), rel=2e-3)


def test_one_codebook_per_batch_element():
    x = torch.cat([_x(seed=0), 5 * _x(seed=1)], dim=0)
    stored = KVQuant(2).quantize(x, "key")
    assert stored.codebook.shape == (2, 4)
    alone = KVQuant(2).quantize(x[1:], "key")
    assert torch.equal(stored.codebook[1:], alone.codebook)


def test_qnorm_matches_the_mean_and_std_of_the_normalised_values():
    """Q-Norm: ``ẑ = s c + o`` has the mean and standard deviation of the non-outlier ``z``."""
    x = _x(tokens=256, dtype=torch.float32)
    plain, normed = (KVQuant(2, qnorm=q).quantize(x, "key") for q in (False, True))
    z, mask = _z(normed, x)
    upper, lower = normed.split.upper.float(), normed.split.lower.float()
    zhat = (normed.dequantize().float() - (upper + lower) / 2) / ((upper - lower) / 2)
    keep = ~mask
    assert float(zhat[keep].mean()) == pytest.approx(float(z[keep].mean()), abs=2e-3)
    assert float(zhat[keep].std()) == pytest.approx(float(z[keep].std()), rel=2e-3)
    zplain = (plain.dequantize().float() - (upper + lower) / 2) / ((upper - lower) / 2)
    assert zplain[keep].std() < z[keep].std() * 0.99  # centroids shrink the spread
    assert plain.noise_model == CENTROID and normed.noise_model == MIXED
    assert normed.stored()["qnorm"].shape == (1, 2)


# --- storage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("role", "bits", "first"), [("key", 2, 0), ("value", 4, 2), ("key", 3, 5)])
def test_bytes_are_counted_from_the_stored_tensors(role, bits, first):
    heads, tokens, dim = 2, 256, 64
    x = _x(tokens=tokens, dim=dim, heads=heads)
    stored = KVQuant(bits, first_tokens=first).quantize(x, role)
    n = tokens - first
    t = threshold(0.01)
    if role == "key":  # per channel: token indices (uint8 up to 256 positions) + bf16 values
        k = lower_count(n, t) + upper_count(n, t)
        sparse, ranges = heads * k * dim * (1 + 2), heads * 2 * dim * 2
    else:  # per token over its 2 × 64 channels: >= / <= counts (1 + 1 at 1%)
        k = 2
        sparse, ranges = n * k * (1 + 2), 2 * n * 2
    want = (
        heads * first * dim * 2  # first tokens, bf16
        + heads * n * dim * bits // 8  # codes
        + ranges  # FP16 upper, lower
        + 2 * (1 << bits) * 2  # FP16 codebook and cell variances
        + sparse
    )
    assert stored.nbytes == want
    assert stored.nbytes == sum(t.numel() * t.element_size() for t in stored.stored().values())
    assert stored.effective_bits == pytest.approx(want * 8 / x.numel())


def test_no_outliers_means_min_max_ranges_and_no_sparse_list():
    x = _x()
    stored = KVQuant(2, outliers=0.0).quantize(x, "key")
    assert stored.split.index.numel() == 0
    assert torch.equal(stored.split.upper.float(), x.float().amax(-2, keepdim=True).half().float())


# --- causality, the round trip, the noise ------------------------------------------------------


def test_a_chunks_codes_do_not_depend_on_later_chunks():
    """Calibration is per chunk: chunk 0's stored tensors are the same whether or not later
    chunks arrive, and equal quantizing it alone."""
    cfg = TinyConfig()
    method = KVQuant(2)
    cache = ChunkKVCache(KVSpec(method, method, "taylor"), rope=key_rope(cfg))
    shape = (1, 2, cfg.chunk_len, cfg.head_dim)
    g = torch.Generator().manual_seed(3)
    chunks = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(3)]
    cache.commit(*chunks[0], position=0)
    before = {k: v.clone() for k, v in cache.stored(0, "key").stored().items()}
    for i in (1, 2):
        cache.commit(*chunks[i], position=i * cfg.frames_per_chunk)
    after = cache.stored(0, "key").stored()
    alone = method.quantize(chunks[0][0], "key").stored()
    assert before.keys() == after.keys() == alone.keys()
    for name in before:
        assert torch.equal(before[name], after[name]) and torch.equal(before[name], alone[name])


@pytest.mark.parametrize("role", ["key", "value"])
def test_round_trip_error_is_bounded_by_the_cells(role):
    """A coded entry is off by at most the half-range times its distance to the cell edge
    (the end cells reach ±1); INT4 beats INT2."""
    x = _x(tokens=256, dtype=torch.float32)
    errors = {}
    for bits in (2, 4):
        stored = KVQuant(bits).quantize(x, role)
        book = stored.codebook.float()[0]
        edges = torch.cat([torch.tensor([-1.0]), (book[1:] + book[:-1]) / 2, torch.tensor([1.0])])
        reach = torch.maximum(book - edges[:-1], edges[1:] - book).abs()
        half = (stored.split.upper.float() - stored.split.lower.float()) / 2
        bound = reach[stored.indices()] * half
        err = (stored.dequantize() - x).abs()
        assert (err <= bound * (1 + 1e-4) + 1e-5).all()
        errors[bits] = float(err.square().mean())
    assert errors[4] < errors[2] / 4


def test_the_steps_carry_the_coded_entries_error():
    """In normalised units the stored cell variance is the coded entries' mean squared error
    (the chunk is its own calibration); ``step² / 12`` then carries each channel's half-range
    (within 10% of the error in the keys' units: cells hold other shares of each channel); the
    error is centroid type (uncorrelated with the reconstruction in z); the excess rule reads
    −Δ², and the unshrink rule the same (a = 1)."""
    x = _x(tokens=256, dtype=torch.float32)
    stored = KVQuant(2).quantize(x, "key")
    err = stored.dequantize() - x
    coded = stored.step > 0
    half = (stored.split.upper.float() - stored.split.lower.float()) / 2
    zerr = (err / half)[coded]
    zvar = stored.cell_var.float()[0][stored.indices()][coded]
    assert float(zvar.mean()) == pytest.approx(float(zerr.square().mean()), rel=2e-3)
    assert float((stored.step.square() / 12).mean()) == pytest.approx(
        float(err.square().mean()), rel=0.1
    )
    z, mask = _z(stored, x)
    upper, lower = stored.split.upper.float(), stored.split.lower.float()
    zhat = (stored.dequantize() - (upper + lower) / 2) / ((upper - lower) / 2)
    e, keep = (z - zhat)[~mask], zhat[~mask]
    cov = float(((e - e.mean()) * (keep - keep.mean())).mean())
    assert abs(cov) < 0.02 * float(e.square().mean())
    assert torch.equal(stored.excess_step2, -stored.step.square())
    assert torch.equal(stored.noise_step2, stored.excess_step2) and stored.unshrink is None


def test_pre_rope_per_channel_steps_take_the_pair_terms():
    method = KVQuant(2)
    spec = KVSpec(method, method, "taylor")
    assert spec.key_layout == "pre-rope" and method.step_groups(64) == 64
    step = method.quantize(_x(dim=64), "key").step
    rot = KeyRotation(torch.ones(200, 32), torch.zeros(200, 32), "half")
    assert needs_pair_terms(step, 64, rot, "taylor")
    assert KVQuant(2, layout="post-rope").key_layout() == "post-rope"


class _Model:
    """What :func:`resolve_spec` reads of a model: its name, ``pre_rope`` and ``resolve_kv``."""

    def __init__(self, pre_rope: bool) -> None:
        self.name, self.pre_rope = "stub", pre_rope

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        return kv


def test_the_layout_left_to_the_model_falls_back_to_post_rope():
    """Default: pre-RoPE keys (the source) where the model's cache can hold them, post-RoPE
    elsewhere (labelled); pre-RoPE asked for on such a model is a one-line usage error."""
    spec = KVSpec.build("kvquant", 2, 32, "taylor")
    assert resolve_spec(_Model(pre_rope=True), spec) == spec and spec.key_layout == "pre-rope"
    moved = resolve_spec(_Model(pre_rope=False), spec)
    assert moved.key_layout == "post-rope" and moved.key.layout == "post-rope"
    assert moved.variant_id == "int2-kvquant-g32-postrope-taylor"
    asked = KVSpec.build("kvquant", 2, 32, layout="pre-rope")
    assert asked.variant_id == "int2-kvquant-g32-prerope"
    with pytest.raises(UsageError, match="cannot cache keys before RoPE"):
        resolve_spec(_Model(pre_rope=False), asked)
    rtn = KVSpec.build("rtn", 2, 32)
    assert resolve_spec(_Model(pre_rope=False), rtn) == rtn


def test_options_ids_and_validation():
    m = build_method("kvquant", 2, 32, outliers=0.005, first_tokens=1, qnorm=True)
    assert m.variant_id == "int2-kvquant-g32-o0p005-first1-qnorm"
    assert KVQuant(2).variant_id == "int2-kvquant-g32"
    assert KVQuant(2, group_size=7).group_size == 32  # not used: one spec, one id
    for bad in ({"outliers": 0.6}, {"iters": 0}, {"layout": "rotated"}, {"bits": 8}):
        with pytest.raises(ValueError):
            KVQuant(**{"bits": 2, **bad})
    with pytest.raises(ValueError, match="divisible by 8"):
        KVQuant(3).quantize(torch.randn(1, 1, 4, 12), "key")
    assert math.isfinite(KVQuant(2).quantize(torch.randn(1, 1, 2, 8), "key").effective_bits)


# --- the CLI -------------------------------------------------------------------------------------


@pytest.mark.slow  # end to end
def test_kvquant_runs_through_quantize_eval_pre_rope(quick_eval):
    """The embedded model caches KVQuant's keys before RoPE; bytes per row from the stored
    tensors: per chunk and layer, ``H = 2`` heads of 256 tokens × 64 channels (FP32 cache:
    exact entries FP16, indices uint8), keys and values, plus one codebook and its variances
    each."""
    rows = quick_eval("--quantizers", "kvquant", "--bits", "2", "--corrections", "none,taylor")
    assert list(rows) == ["reference", "int2-kvquant-g32", "int2-kvquant-g32-taylor"]
    cfg = TinyConfig()
    h, n, d = cfg.heads, cfg.chunk_len, cfg.head_dim
    t = threshold(0.01)
    k_out = lower_count(n, t) + upper_count(n, t)
    keys = h * (n * d * 2 // 8 + 2 * d * 2 + k_out * d * 3) + 2 * 4 * 2
    values = h * n * d * 2 // 8 + 2 * n * 2 + n * 2 * 3 + 2 * 4 * 2  # per token over H·D = 128
    want = (keys + values) * 8 / (2 * h * n * d)
    for vid in ("int2-kvquant-g32", "int2-kvquant-g32-taylor"):
        assert rows[vid]["effective_bits"] == pytest.approx(want, rel=1e-6)
        assert rows[vid]["psnr"]["mean"] > 20
