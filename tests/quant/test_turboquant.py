"""TurboQuant (after arXiv 2504.19874, ``jbkv_cli/quant/turboquant.py``): the stored tensors and
their bits, the rotation, the rules the paper states (MSE of the codebook, unbiased inner
products of the QJL variant, biased ones of the MSE variant), the noise models, pruning, and every
command."""

from __future__ import annotations

import json
import math

import pytest
import torch

from jbkv_cli.kvcache.pruned import take_tokens
from jbkv_cli.quant import build_method, quantize_kv
from jbkv_cli.quant.noise import CENTROID, error_covariances
from jbkv_cli.quant.turboquant import (
    RandomOrthogonal,
    TurboQuantMSETensor,
    TurboQuantProdTensor,
    random_orthogonal,
)
from jbkv_cli.run.experiment import build_matrix
from tests.installed import run_jbkv


def _keys(seed=0, tokens=512, dim=64, heads=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, tokens, dim, generator=g)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_stored_tensors_and_bits(bits, dim):
    x = _keys(dim=dim, tokens=64)
    mse, prod = (quantize_kv(x, bits, 32, name) for name in ("turboquant-mse", "turboquant-prod"))
    assert isinstance(mse, TurboQuantMSETensor) and isinstance(prod, TurboQuantProdTensor)
    assert {k: t.dtype for k, t in mse.stored().items()} == {
        "codes": torch.uint8,
        "norm": torch.float16,
    }
    assert set(prod.stored()) == {"codes", "norm", "qjl_signs", "residual_norm"}
    assert prod.stored()["qjl_signs"].shape[-1] == dim // 8  # 1 bit per coordinate
    assert mse.effective_bits == pytest.approx(bits + 16 / dim)  # codes + FP16 norm
    assert prod.effective_bits == pytest.approx(bits + 32 / dim)  # (b−1) + 1 bits + two norms
    assert mse.dequantize().shape == x.shape and prod.dequantize().dtype == x.dtype


def test_rotation_is_orthogonal_seeded_and_shared():
    r = RandomOrthogonal(64, seed=3)
    m = r.matrix()
    assert torch.allclose(m @ m.T, torch.eye(64), atol=1e-5)
    x = torch.randn(5, 64)
    assert torch.allclose(r.unrotate(r.rotate(x)), x, atol=1e-5)
    assert torch.equal(RandomOrthogonal(64, 3).matrix(), m)
    assert not torch.equal(RandomOrthogonal(64, 4).matrix(), m)
    assert random_orthogonal(64, 3) is random_orthogonal(64, 3)  # segments compare by id


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_mse_variant_reaches_its_codebooks_distortion(bits):
    """Theorem 1: E‖x − x̂‖² = D_mse ‖x‖² for any x; D_mse is the codebook's (the paper's values
    are checked in test_lloyd_max.py). 2,048 random unit-norm keys, d = 128."""
    x = _keys(tokens=2048, dim=128)
    x = x / x.norm(dim=-1, keepdim=True)
    stored = quantize_kv(x, bits, 32, "turboquant-mse")
    got = float((stored.dequantize() - x).square().sum(-1).mean())
    assert abs(got / stored.relative_mse - 1) < 0.03


def test_inner_products_prod_unbiased_mse_shrunk():
    """Over the random rotation and sketch (seeds): the prod variant's ⟨q, x̂⟩ is unbiased
    (Theorem 2); the MSE variant's is shrunk by 1 − ρ, ρ the codebook's relative MSE (what the
    signed correction's unshrink undoes)."""
    g = torch.Generator().manual_seed(1)
    x, q = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
    true = (q * x).sum(-1)
    seeds = range(300)
    prod = torch.stack([(q * build_method("turboquant-prod", 2, 32, seed=s).quantize(x)
                         .dequantize()).sum(-1) for s in seeds])  # fmt: skip
    mse_q = [build_method("turboquant-mse", 2, 32, seed=s).quantize(x) for s in seeds]
    mse = torch.stack([(q * t.dequantize()).sum(-1) for t in mse_q])
    se = prod.std(0) / math.sqrt(len(seeds))
    assert ((prod.mean(0) - true).abs() < 4 * se + 1e-3).all()
    rho = mse_q[0].relative_mse
    gain = float((mse.mean(0) * true).sum() / true.square().sum())
    assert abs(gain - (1 - rho)) < 0.02, (gain, 1 - rho)
    assert abs(float(mse_q[0].unshrink.mean()) - 1 / (1 - rho)) < 1e-6


def test_noise_models_classified_from_the_stored_tensors():
    """Gaussian keys: the MSE variant's error is uncorrelated with what it stores (centroid),
    the prod variant's with the true key (additive): the shares of Var(e)."""
    x = _keys(tokens=4096)
    mse, prod = (quantize_kv(x, 2, 32, name) for name in ("turboquant-mse", "turboquant-prod"))
    assert mse.noise_model == CENTROID and prod.noise_model == "additive"
    c_mse, c_prod = error_covariances(x, mse, 2), error_covariances(x, prod, 2)
    assert (c_mse.centroid_share > 0.95).all() and (c_mse.additive_share.abs() < 0.05).all()
    assert (c_prod.additive_share > 0.95).all() and (c_prod.centroid_share.abs() < 0.05).all()
    # the declared variances: the MSE variant's mean cell variance, the sketch's known one
    assert abs(float(mse.step.square().mean() / 12 / c_mse.var_e.mean()) - 1) < 0.05
    assert abs(float(prod.noise_step2.mean() / 12 / c_prod.var_e.mean()) - 1) < 0.1


def test_tokens_can_be_pruned_from_what_it_stores():
    """The kept tokens' codes and norms are copies of what was stored (bit for bit); their
    dequantized values equal the stored tensor's rows within 1e-6: the inverse rotation is a
    matrix product over 3 rows here and 16 there, whose last bits the BLAS may round
    differently per CPU (MKL picks other kernels for other row counts)."""
    x = _keys(tokens=16)[0, 0]
    rows = torch.tensor([1, 5, 9])
    for name in ("turboquant-mse", "turboquant-prod"):
        stored = quantize_kv(x, 2, 32, name)
        kept = take_tokens(stored, rows)
        for key, tensor in kept.stored().items():
            assert torch.equal(tensor, stored.stored()[key][rows]), (name, key)
        torch.testing.assert_close(kept.dequantize(), stored.dequantize()[rows], rtol=0, atol=1e-6)
        assert kept.nbytes * 16 == stored.nbytes * 3


@pytest.mark.slow
def test_every_sweep_and_command_knows_turboquant(quick_eval, tmp_path):
    specs = build_matrix([2, 3, 4, 8], ["turboquant-mse", "turboquant-prod"], ["none"], [32])
    assert {s.variant_id for s in specs} >= {"int2-turboquant-mse-g32", "int4-turboquant-prod-g32"}
    rows = quick_eval(
        "--quantizers", "turboquant-mse,turboquant-prod", "--bits", "2",
        "--corrections", "none,signed",
    )  # fmt: skip
    assert list(rows)[1:] == [
        "int2-turboquant-mse-g32",
        "int2-turboquant-mse-g32-signed",
        "int2-turboquant-prod-g32",
        "int2-turboquant-prod-g32-signed",
    ]
    for row in list(rows.values())[1:]:
        assert 15 < row["psnr"]["mean"] < 99
        assert row["lp_shift"]["mean"] is not None and row["lp_left"] is not None
    assert rows["int2-turboquant-mse-g32"]["lp_shift"]["mean"] < 0  # centroid: under-stated
    page = next(tmp_path.rglob("index.html")).read_text()
    assert "The measured bias" in page and "INT2 turboquant-mse g32 +signed" in page
    out = tmp_path / "gen"
    gen = run_jbkv(
        "generate", "--quantizer", "turboquant-prod", "--bits", "3", "--correct",
        "--correction", "signed", "--num-chunks", "2", "--steps", "1", "--prompt",
        "a red circle moves right on a dark background", "--out", out, timeout=600,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    variant = json.loads((out / "videos/int3-turboquant-prod-g32-signed/variant.json").read_text())
    assert variant["key"]["name"] == "turboquant-prod"
    demo = run_jbkv(
        "attention-demo",
        "--cached",
        "64",
        "--current",
        "16",
        environ={"PATH": ""},
        columns=200,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr
    assert "INT2 turboquant-mse g32 +signed" in demo.stdout
