import pytest
import torch

from jbkv_cli.quant import RandomHadamard, quantize_kv
from jbkv_cli.quant.rotation import fwht


@pytest.mark.parametrize(("dim", "block"), [(64, None), (128, 32), (64, 8)])
def test_rotation_is_orthogonal_and_inverts(dim, block):
    rot = RandomHadamard(dim, block, seed=3)
    r = rot.matrix()
    assert torch.allclose(r @ r.T, torch.eye(dim), atol=1e-5)
    x = torch.randn(5, 7, dim)
    assert torch.allclose(rot.unrotate(rot.rotate(x)), x, atol=1e-5)
    assert torch.allclose(rot.rotate(x), x @ r.T, atol=1e-5)


def test_rotation_is_block_diagonal():
    r = RandomHadamard(64, 16, seed=0).matrix()
    mask = torch.block_diag(*[torch.ones(16, 16)] * 4)
    assert (r[mask == 0] == 0).all()


def test_deterministic_per_seed():
    a, b, c = (RandomHadamard(64, seed=s).matrix() for s in (1, 1, 2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_fwht_matches_sylvester_matrix():
    h = torch.tensor([[1.0]])
    for _ in range(3):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    x = torch.randn(4, 8)
    assert torch.allclose(fwht(x), x @ h.T, atol=1e-6)


def test_bad_block_size():
    with pytest.raises(ValueError, match="power of two"):
        RandomHadamard(64, 24)
    with pytest.raises(ValueError, match="divide"):
        RandomHadamard(96, 64)


def test_sixteen_bit_is_stored_as_is_for_every_method():
    x = torch.randn(2, 9, 64)
    qt = quantize_kv(x, bits=16, scheme="quarot", seed=5)
    assert qt.rotation is None and qt.step is None
    assert torch.equal(qt.dequantize(), x)


def test_quarot_quantizes_in_rotated_basis():
    x = torch.randn(2, 9, 64)
    qt = quantize_kv(x, bits=4, scheme="quarot", seed=5)
    rotated_err = qt.rotation.rotate(qt.dequantize()) - qt.rotation.rotate(x)
    half = qt.step.repeat_interleave(32, -1) / 2
    assert (rotated_err.abs() <= half + 1e-5).all()
