"""QVG (after QuantVideoGen, ``jbkv_cli/quant/qvg.py``): storage, determinism, error bound,
the paper's smoothing and PRQ claims, the noise model against a Monte Carlo of the real
rounding, ids and the CLI; optionally the ``quant-videogen`` package itself on CUDA."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from jbkv_cli.attention.correction import taylor_bias
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.quant import build_method, quantize_kv
from jbkv_cli.quant.groupwise import unpack_codes
from jbkv_cli.quant.qvg import QVG, QVGTensor, quantize_symmetric, symmetric_levels


def mixture(seed=0, tokens=4096, dim=64, clusters=64, spread=2.0, noise=0.5, heads=1):
    """Keys with "semantic" structure: ``clusters`` centres plus small per-token noise,
    ``[1, heads, tokens, dim]`` (video tokens of one object or background look alike)."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(heads, clusters, dim, generator=g) * spread
    labels = torch.randint(0, clusters, (heads, tokens), generator=g)
    x = centers.gather(1, labels.unsqueeze(-1).expand(-1, -1, dim))
    return (x + noise * torch.randn(heads, tokens, dim, generator=g)).unsqueeze(0)


def _blockwise(t, block):
    return t.unflatten(-1, (t.shape[-1] // block, block))


# --- what is stored ------------------------------------------------------------------------


def test_stored_tensors_and_their_dtypes():
    x = torch.randn(2, 3, 256, 64)
    qt = QVG(bits=2, group_size=32, stages=2).quantize(x)
    assert isinstance(qt, QVGTensor)
    shapes = {k: (tuple(t.shape), t.dtype) for k, t in qt.stored().items()}
    assert shapes == {
        "codes": ((2, 3, 256, 16), torch.uint8),  # 4 INT2 codes per byte
        "scale": ((2, 3, 256, 2), torch.float8_e4m3fn),  # one per 32 channels
        "cluster_ids": ((2, 3, 2, 256), torch.uint8),  # per stage and token
        "centroids": ((2, 3, 2, 4, 64), torch.bfloat16),  # K_eff = 256 // 64 = 4
    }
    assert qt.step.shape == (2, 3, 256, 2) and qt.step.dtype == torch.float32
    assert torch.equal(qt.step, qt.scale.float())
    assert qt.dequantize().shape == x.shape


@pytest.mark.parametrize(
    ("bits", "block", "stages", "tokens", "dim", "k", "cap", "k_eff"),
    [
        (2, 64, 1, 256, 64, 256, 64, 4),  # the embedded model's chunks at the defaults
        (4, 64, 1, 256, 64, 256, 64, 4),
        (2, 32, 2, 1000, 64, 256, 64, 15),
        (2, 64, 1, 20000, 128, 256, 64, 256),  # a real-size chunk: K = 256 is the cap
        (4, 16, 3, 300, 128, 8, 64, 4),
        (2, 64, 1, 100, 64, 256, 0, 100),  # cap off: one centroid per token (lossless ids)
        (2, 64, 1, 40, 64, 256, 64, 1),  # fewer tokens than the cap: one centroid
        (2, 64, 0, 256, 64, 256, 64, 4),  # S = 0: no codebook at all
    ],
)
def test_effective_bits_equal_the_formula(bits, block, stages, tokens, dim, k, cap, k_eff):
    """``b + 8/B + 8·S/D + 16·S·K_eff/L``, counted from the stored tensors' bytes."""
    method = QVG(bits, block, stages=stages, centroids=k, tokens_per_centroid=cap)
    assert method.effective_centroids(tokens) == k_eff
    x = torch.randn(1, 2, tokens, dim, generator=torch.Generator().manual_seed(0))
    qt = method.quantize(x)
    formula = bits + 8 / block + 8 * stages / dim + 16 * stages * k_eff / tokens
    assert qt.nbytes == sum(t.numel() * t.element_size() for t in qt.stored().values())
    assert qt.nbytes * 8 == pytest.approx(formula * x.numel(), abs=1e-6)
    assert qt.effective_bits == pytest.approx(formula, rel=1e-12)
    assert qt.num_centroids == (k_eff if stages else qt.num_centroids)


def test_int2_uses_only_three_levels_and_int4_fifteen():
    x = mixture(tokens=1024)
    for bits, levels in ((2, {0, 1, 2}), (4, set(range(15)))):
        qt = QVG(bits, 64).quantize(x)
        codes = unpack_codes(qt.codes, bits, 64)
        assert set(codes.unique().tolist()) == levels  # c + m: {−1, 0, 1} / −7..7, all used
        m = symmetric_levels(bits)
        r = qt.residual()
        assert torch.equal(
            r, (codes.float() - m).unflatten(-1, (1, 64)).mul(qt.step[..., None]).flatten(-2)
        )


# --- determinism -----------------------------------------------------------------------------


def test_same_seed_same_tensors_other_seed_other_clusters():
    x = mixture(tokens=2048, heads=2)
    a, b = (QVG(2, 64, seed=3).quantize(x) for _ in range(2))
    torch.manual_seed(99)  # the global RNG plays no part
    c = QVG(2, 64, seed=3).quantize(x)
    for name, t in a.stored().items():
        assert torch.equal(t.view(torch.uint8), b.stored()[name].view(torch.uint8)), name
        assert torch.equal(t.view(torch.uint8), c.stored()[name].view(torch.uint8)), name
    other = QVG(2, 64, seed=4).quantize(x)
    assert not torch.equal(a.ids, other.ids)


# --- accuracy --------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize(("block", "stages"), [(64, 1), (32, 2), (16, 0)])
@pytest.mark.parametrize("magnitude", [1.0, 1e-3, 30.0])
def test_error_at_most_half_a_step(bits, block, stages, magnitude):
    """``|x − x̂| ≤ Δ/2`` per block, including tiny inputs whose scales are FP8 subnormals
    (where nearest rounding alone would clip INT4 codes, or round a scale to 0)."""
    x = mixture(seed=1, tokens=512, heads=2) * magnitude
    qt = QVG(bits, block, stages=stages).quantize(x)
    err = _blockwise(qt.dequantize() - x, block).abs()
    half = qt.step.unsqueeze(-1) / 2
    assert (err <= half * (1 + 1e-5) + 1e-6 * magnitude).all()


def test_scale_is_upstreams_nearest_fp8_except_where_that_would_clip():
    """Upstream stores ``fp8_nearest(absmax/m)``; jbkv stores the same for normal-range scales
    and raises only scales that would clip (FP8 subnormals)."""
    for bits in (2, 4):
        m = symmetric_levels(bits)
        r = torch.randn(4000, 64, generator=torch.Generator().manual_seed(bits))
        r *= torch.logspace(-5, 1, 4000).unsqueeze(-1)  # absmax from ~1e-5 to ~30
        _, scale = quantize_symmetric(r, bits, 32)
        absmax = _blockwise(r, 32).abs().amax(-1)
        nearest = (absmax / m).to(torch.float8_e4m3fn).float()
        normal = nearest >= 2**-6
        assert torch.equal(scale.float()[normal], nearest[normal])
        raised = scale.float() > nearest
        assert raised.any() and not (raised & normal).any()
        assert (absmax <= (m + 0.5) * scale.float() * (1 + 1e-6)).all()  # never clips
    zero = quantize_symmetric(torch.zeros(3, 64), 2, 64)
    assert (zero[1].float() == 0).all() and (zero[0] == 1).all()  # Δ = 0, code 0 (stored 0 + m)


def test_centroids_are_exact_and_noise_lives_in_the_residual():
    x = mixture(tokens=1024, heads=2)
    qt = QVG(2, 64, stages=2).quantize(x)
    rebuilt = qt.smoothing() + qt.residual()
    assert torch.equal(qt.dequantize(), rebuilt.to(x.dtype))
    # the residual codes quantize x minus the stored (BF16) centroids, within half a step
    err = _blockwise((x - qt.smoothing()) - qt.residual(), 64).abs()
    assert (err <= qt.step.unsqueeze(-1) / 2 + 1e-5).all()
    assert qt.centroids.dtype == torch.bfloat16


def test_bfloat16_input_comes_back_bfloat16():
    x = mixture(tokens=512).bfloat16()
    qt = QVG(4, 64).quantize(x)
    x_hat = qt.dequantize()
    assert x_hat.dtype == torch.bfloat16
    bound = qt.step.repeat_interleave(64, -1) / 2 + x.float().abs() * 2**-7  # + BF16 rounding
    assert ((x_hat.float() - x.float()).abs() <= bound).all()


def test_smoothing_shrinks_the_residual_the_papers_claim():
    """Semantic-aware smoothing: after subtracting each token's centroid the residual's block
    absmax and energy are far below the raw keys' (so the same codes give a finer grid), and the
    reconstruction error drops against symmetric quantization without clustering (S = 0).
    Measured over seeds 0–3: absmax ratio 0.42–0.43, energy ratio 0.22–0.25, MSE ratio
    0.21–0.24 (two k-means iterations from a random init merge a few of the 64 clusters)."""
    x = mixture(seed=2, tokens=4096, heads=2)
    qt = QVG(2, 64).quantize(x)
    residual = x - qt.smoothing()
    raw_max = _blockwise(x, 64).abs().amax(-1)
    res_max = _blockwise(residual, 64).abs().amax(-1)
    assert (res_max / raw_max).mean() < 0.5
    assert residual.square().mean() < 0.3 * x.square().mean()
    mse = {s: (QVG(2, 64, stages=s).quantize(x).dequantize() - x).square().mean() for s in (0, 1)}
    assert mse[1] < 0.3 * mse[0]


def test_progressive_stages_lower_the_error():
    """Progressive residual quantization: each extra stage of k-means on the residual lowers
    the reconstruction error (the paper's quality-memory trade-off)."""
    x = mixture(seed=3, tokens=2048, heads=2, clusters=200)
    mse = [
        float((QVG(2, 64, stages=s).quantize(x).dequantize() - x).square().mean())
        for s in (0, 1, 2, 3)
    ]
    assert mse == sorted(mse, reverse=True) and mse[3] < 0.8 * mse[1]


# --- the noise model the correction uses -------------------------------------------------


@pytest.mark.parametrize(
    ("bits", "tau", "var_band", "log_band"),
    [(4, 0.5, (0.95, 1.05), (0.9, 1.1)), (2, 1 / 16, (0.85, 0.97), (0.8, 1.0))],
)
def test_score_noise_of_real_rounding_against_the_correction(bits, tau, var_band, log_band):
    """Monte Carlo over 4,096 keys × 256 queries (fixed seeds) of the score error QVG's real
    rounding makes, ``δ = τ q·(k̂ − k)``, against what the correction computes from ``qt.step``:

    - variance: ``E[δ²] / E[(τ²/12) Σ_j Δ_j² ‖q_j‖²]`` (= ``E[δ²] / E[2 b_taylor]``);
    - Jensen: ``log E[exp δ] / log E[exp b]`` and ``E[exp(δ − b)] ≈ 1``.

    INT4 (15 levels) matches the uniform model within 5% (variance) and 10% (log). INT2 has
    three levels with ``Δ`` = the block's absmax, so most residuals lie inside ±Δ/2, keep their
    own narrower distribution, and the uniform model overstates the noise: measured 0.89–0.92
    of the variance (4 seeds), asserted in [0.85, 0.97]; the correction then over-subtracts a
    little, ``E[exp(δ − b)] = 1 − 0.004..0.008`` at ``b ≈ 0.04–0.07``.
    """
    x = mixture(seed=0)
    q = torch.randn(1, 1, 256, 64, generator=torch.Generator().manual_seed(10))
    qt = QVG(bits, 32, tokens_per_centroid=64).quantize(x)  # K_eff = 64, as calibrated
    delta = tau * (q[0, 0] @ (qt.dequantize() - x)[0, 0].T)  # [queries, keys]
    b = taylor_bias(q, qt.step, tau)[0, 0]
    assert 0.04 < float(b.mean()) < 0.12  # a bias worth correcting
    var_ratio = float(delta.square().mean() / (2 * b).mean())
    assert var_band[0] <= var_ratio <= var_band[1]
    log_ratio = float(delta.exp().mean().log() / b.exp().mean().log())
    assert log_band[0] <= log_ratio <= log_band[1]
    assert abs(float(delta.mean())) < 0.05 * float(delta.square().mean().sqrt())  # zero-mean
    assert float(delta.exp().mean()) > 1 + 0.5 * float(b.mean())  # uncorrected: inflated
    assert abs(float((delta - b).exp().mean()) - 1) < 0.01  # corrected


# --- ids, specs, registry, CLI ---------------------------------------------------------------


def test_ids_labels_and_round_trip():
    assert QVG(2).variant_id == "int2-qvg-g64" and QVG(2).label == "INT2 qvg g64"
    assert build_method("qvg", 2, 64).variant_id == "int2-qvg-g64"
    odd = QVG(4, 32, stages=2, centroids=64, iters=4, seed=3, tokens_per_centroid=16)
    assert odd.variant_id == "int4-qvg-g32-s2-k64-it4-ks3-tpc16"
    spec = KVSpec.build("qvg", 2, 64, "taylor", centroids=128)
    assert spec.variant_id == "int2-qvg-g64-k128-taylor"
    assert spec.key.to_dict() == {
        "name": "qvg",
        "bits": 2,
        "group_size": 64,
        "stages": 1,
        "centroids": 128,
        "iters": 2,
        "seed": 0,
        "tokens_per_centroid": None,
        "span_chunks": None,
        "keep_recent_chunks": None,
        "sink_keep_chunks": None,
        "layout": None,
    }
    for s in (spec, KVSpec.build("qvg", 4, 32, "none"), KVSpec(odd, QVG(2), "taylor")):
        assert KVSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert isinstance(quantize_kv(torch.randn(64, 64), 2, 64, "qvg"), QVGTensor)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bits": 3}, "supports bits 2, 4"),
        ({"centroids": 257}, "uint8 cluster ids"),
        ({"centroids": 0}, "centroids must be"),
        ({"stages": -1}, "stages"),
        ({"iters": 0}, "iters"),
        ({"tokens_per_centroid": -1}, "tokens_per_centroid"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QVG(**({"bits": 2} | kwargs))


def test_group_size_must_divide_the_head_dim():
    with pytest.raises(ValueError, match="does not divide the head dim 64"):
        QVG(2, 48).quantize(torch.randn(10, 64))
    with pytest.raises(ValueError, match="FP8"):
        QVG(2, 64).quantize(torch.full((4, 64), 1000.0) * torch.tensor([1.0, -1, 1, -1])[:, None])


def test_quantize_eval_runs_qvg_with_the_correction(quick_eval):
    rows = quick_eval(
        "--quantizers", "qvg", "--bits", "2", "--group-sizes", "64", "--corrections", "none,taylor"
    )
    assert list(rows) == ["reference", "int2-qvg-g64", "int2-qvg-g64-taylor"]
    for vid in ("int2-qvg-g64", "int2-qvg-g64-taylor"):
        row = rows[vid]
        assert row["quantizer"] == "qvg" and row["group_size"] == 64
        assert row["effective_bits"] == pytest.approx(2 + 8 / 64 + 8 / 64 + 16 * 4 / 256)
        assert 15 < row["psnr"]["mean"] < 99


# --- optional: the quant-videogen package itself ---------------------------------------------


def _upstream():
    """The ``quant_videogen`` functions, or a skip with the reason (checked before importing:
    the package imports Triton)."""
    if importlib.util.find_spec("quant_videogen") is None:
        pytest.skip("quant-videogen is not installed (optional; it pins torch==2.8.0, triton)")
    if not torch.cuda.is_available():
        pytest.skip("quant-videogen's kernels are Triton/CUDA only and no CUDA device is present")
    from quant_videogen.real.prq import prq_dequant, prq_quant
    from quant_videogen.real.quant_pack import quant_pack

    return prq_quant, prq_dequant, quant_pack


@pytest.mark.parametrize("bits", [2, 4])
def test_matches_quant_videogen_package(bits):
    """On the same CUDA inputs: the residual quantizer gives upstream's FP8 scales and codes
    (up to exact half-way ties: upstream rounds them away from zero); the whole method stores
    exactly as many bytes as upstream's ``prq_quant`` (S=1, B=64, K=64) and reconstructs with
    an error within 10% of upstream's. The k-means inits differ (upstream's is unseeded), so the
    keys have 16 clusters for 64 centroids: jbkv's error then varies 0.2% across 8 seeds."""
    prq_quant, prq_dequant, quant_pack = _upstream()
    m = symmetric_levels(bits)
    g = torch.Generator().manual_seed(0)
    r = torch.randn(1, 2, 512, 128, generator=g).bfloat16().cuda()
    codes_up, scales_up, _ = quant_pack(r, 64, bits, torch.float8_e4m3fn, pack_output_int8=False)
    codes, scale = quantize_symmetric(r.float(), bits, 64)
    assert torch.equal(scale.float(), scales_up.float())
    ours = codes.long() - m
    ratio = _blockwise(r.float(), 64) / scale.float().unsqueeze(-1)
    tie = (ratio.abs().frac() == 0.5).flatten(-2)
    assert ((ours == codes_up.long()) | tie).all()

    x = mixture(seed=4, tokens=4096, dim=128, heads=2, clusters=16).bfloat16().cuda()
    torch.manual_seed(0)
    cents, ids, packed, scales, _ = prq_quant(
        x, 1, 64, 64, bits, torch.float8_e4m3fn, max_iters=2,
        PACK_OUTPUT_INT8=True, CLUSTER_ID_INT8=True,
    )  # fmt: skip
    up_bytes = sum(t.numel() * t.element_size() for t in [*cents, *ids, packed, scales])
    up_hat = prq_dequant(
        cents, ids, packed, scales, 64, bits,
        PACK_INPUT_INT8=True, CLUSTER_ID_INT8=True, output_dtype=torch.float32,
    )  # fmt: skip
    qt = QVG(bits, 64, centroids=64).quantize(x)
    assert qt.nbytes == up_bytes
    mse_up = (up_hat.float() - x.float()).square().mean()
    mse = (qt.dequantize().float() - x.float()).square().mean()
    assert abs(float(mse / mse_up) - 1) < 0.1
